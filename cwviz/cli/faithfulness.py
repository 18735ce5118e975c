"""``python -m cwviz faithfulness``: comprehensiveness and sufficiency curves (docs/METHOD.md section 3).

The summary CSV (``--out``) is rewritten after every example (to a temporary file, then renamed), so
an interrupted run leaves a complete CSV of the examples it finished (its ``n`` column says how many).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from ..core.errors import InputError
from .common import add_jsonl_args, add_model_args, jsonl_path, load, read_text, report_interrupt


def register(sub: argparse._SubParsersAction) -> None:
    from ..analyses import faithfulness as F

    rates = ",".join(f"{r:g}" for r in F.DEFAULT_RATES)
    parser = sub.add_parser(
        "faithfulness",
        help="mask the keys each measure ranks first/last and report ΔPPL curves",
        description="Rank keys by each measure, mask the top (comprehensiveness) or bottom (sufficiency) share "
        "of each query's keys, and report the mean ΔPPL = PPL(masked) - PPL(clean) with a 95%% bootstrap interval.",
    )
    data = parser.add_mutually_exclusive_group(required=True)
    add_jsonl_args(data, "JSON Lines: a 'text' field per line, or GSM8K's question and answer")
    data.add_argument(
        "--file",
        type=Path,
        help="a UTF-8 text file, each paragraph (blank-line separated) one example; .jsonl/.json files are read as JSONL",
    )
    data.add_argument("--text", help="one example given on the command line ('-' reads standard input)")
    data.add_argument("--dataset", help="a Hugging Face dataset NAME or NAME:CONFIG (needs `datasets` and network)")
    parser.add_argument("--field", help="the JSONL/dataset field holding the text (default: text, or question+answer)")
    parser.add_argument("--split", default="test", help="the dataset split (default: test)")
    parser.add_argument("--n", type=int, default=F.DEFAULT_EXAMPLES, help=f"number of examples (default {F.DEFAULT_EXAMPLES})")
    parser.add_argument("--rates", default=rates, help=f"removal rates in %% of each query's keys (default {rates})")
    parser.add_argument(
        "--measures",
        default="default",
        help=f"comma-separated measures, or default: {', '.join(F.RANKED_MEASURES)} "
        f"(also: {', '.join(m for m in F.ALL_MEASURES if m not in F.RANKED_MEASURES)}; all = every one)",
    )
    parser.add_argument("--layers", default="all", help="all (default: mask in every layer at once) or one layer index")
    parser.add_argument("--per-head", action="store_true", help="rank keys per head (default: layer-level scores)")
    parser.add_argument("--rank-by", choices=F.RANK_BY, default=F.RANK_BY[0], help="rank by the signed score (default) or its magnitude")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=F.EXAMPLE_MAX_TOKENS,
        help=f"token cap per example: longer ones are cut (default {F.EXAMPLE_MAX_TOKENS})",
    )
    parser.add_argument(
        "--batch-size", type=int, default=F.DEFAULT_BATCH_SIZE, help=f"masked runs per forward pass (default {F.DEFAULT_BATCH_SIZE})"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random ranking and the bootstrap (default 0)")
    parser.add_argument("--out", type=Path, help="summary CSV, rewritten after every example")
    add_model_args(parser)
    parser.set_defaults(func=run)


def parse_rates(value: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise InputError(f"--rates takes comma-separated percentages such as 10,50, not {value!r}") from None


def parse_layer(value: str) -> int | None:
    if value.strip().lower() == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--layers takes all or one layer index, not {value!r}") from None


def parse_measures(value: str) -> tuple[str, ...]:
    from ..analyses.faithfulness import ALL_MEASURES, RANKED_MEASURES

    if value.strip().lower() == "default":
        return RANKED_MEASURES
    if value.strip().lower() == "all":
        return ALL_MEASURES
    return tuple(part.strip() for part in value.split(",") if part.strip())


def read_examples(args: argparse.Namespace) -> list[str]:
    """The examples from --jsonl/--gsm8k, --file, --text or --dataset (at most --n)."""
    from ..analyses.faithfulness import dataset_texts
    from ..analyses.faithfulness import read_examples as read_file
    from ..core.texts import read_texts

    if args.n < 1:
        raise InputError(f"--n must be at least 1, not {args.n}")
    if jsonl_path(args) is not None:
        return read_texts(jsonl_path(args), n=args.n, field=args.field)
    if args.file is not None:
        return read_file(args.file, n=args.n, field=args.field)
    if args.dataset is not None:
        return dataset_texts(args.dataset, split=args.split, n=args.n, field=args.field)
    text = read_text(args)
    if not text.strip():
        raise InputError("the prompt is empty; give some text")
    return [text]


def write_csv(summary: pd.DataFrame, path: Path) -> None:
    """Replace ``path`` atomically, so a reader (or an interrupted run) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    summary.to_csv(tmp, index=False, float_format="%.6g")
    os.replace(tmp, path)


def format_table(summary: pd.DataFrame) -> str:
    """Mean ΔPPL per measure and rate, one block per curve, with the area under each curve."""
    from ..analyses.faithfulness import curve_areas

    areas = curve_areas(summary).set_index(["curve", "measure"])["area"]
    n = int(summary["n"].max()) if len(summary) else 0
    rates = sorted(summary["rate"].unique())
    lines = []
    for curve, group in summary.groupby("curve", sort=False):
        lines.append(f"{curve}: mean ΔPPL over {n} example(s) (95% bootstrap intervals in the CSV); area over rate 0..1")
        header = f"  {'measure':34}" + "".join(f"{f'{r:g}%':>10}" for r in rates) + f"{'area':>10}"
        lines.append(header)
        for measure, rows in group.groupby("measure", sort=False):
            by_rate = dict(zip(rows["rate"], rows["delta_ppl"]))
            cells = "".join(f"{by_rate.get(r, float('nan')):>10.3g}" for r in rates)
            lines.append(f"  {measure:34}{cells}{areas[curve, measure]:>10.4g}")
        lines.append("")
    return "\n".join(lines)


def format_order(summary: pd.DataFrame) -> str:
    """Whether the paper's order holds, by area and at each rate (pairs that fail or tie are named)."""
    from ..analyses.faithfulness import PAPER_ORDER, curve_areas, order_check

    by_area, by_rate = order_check(curve_areas(summary)), order_check(summary, value="delta_ppl")
    if by_area.empty:
        return ""
    lines = ["paper's order " + " < ".join(PAPER_ORDER) + " (comprehensiveness; sufficiency reversed):"]

    def verdict(rows: pd.DataFrame) -> str:
        odd = [f"{a}/{b} {r}" for a, b, r in rows[["lower", "higher", "relation"]].itertuples(index=False) if r != "holds"]
        return "holds" if not odd else "; ".join(odd)

    for curve, group in by_area.groupby("curve", sort=False):
        lines.append(f"  {curve}, by area: {verdict(group)}")
        for rate, rows in by_rate[by_rate.curve == curve].groupby("rate", sort=False):
            lines.append(f"    at {rate:g}%: {verdict(rows)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..analyses import faithfulness

    protocol = faithfulness.Protocol(
        rates=parse_rates(args.rates),
        measures=parse_measures(args.measures),
        layer=parse_layer(args.layers),
        per_head=args.per_head,
        rank_by=args.rank_by,
        seed=args.seed,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
    )
    texts = read_examples(args)
    if args.out is not None and not args.out.parent.is_dir():
        raise InputError(f"no folder {args.out.parent} for --out; create it first")
    bundle = load(args)
    tables: list[pd.DataFrame] = []
    summary = pd.DataFrame(columns=faithfulness.SUMMARY_COLUMNS)
    interrupted = False
    try:
        with tqdm(total=len(texts), desc="faithfulness", unit="example", file=sys.stderr) as bar:
            for _, table in faithfulness.iter_examples(bundle, texts, protocol):
                bar.update(1)
                if table is None:
                    continue
                tables.append(table)
                summary = faithfulness.summarize(pd.concat(tables, ignore_index=True), seed=args.seed)
                if args.out is not None:
                    write_csv(summary, args.out)  # after every example: an interrupted run keeps them all
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (cwviz.cli.main): keep what is finished
        interrupted = True
    if not tables:
        if interrupted:
            return report_interrupt(0, len(texts), "example")
        raise InputError("no example had two or more tokens; nothing to measure")
    print(
        f"model: {bundle.info.id}; {len(tables)} example(s), at most {protocol.max_tokens} tokens each; "
        f"layers: {'all at once' if protocol.layer is None else protocol.layer}; "
        f"scores: {'per head' if protocol.per_head else 'layer-level'}, ranked by {protocol.rank_by} value"
    )
    print(format_table(summary))
    print(format_order(summary))
    if args.out is not None:
        print(f"wrote {args.out}")
    if interrupted:
        return report_interrupt(len(tables), len(texts), "example", args.out)
    return 0
