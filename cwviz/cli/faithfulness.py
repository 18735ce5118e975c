"""``python -m cwviz faithfulness``: comprehensiveness and sufficiency curves (docs/METHOD.md section 3).

The summary CSV (``--out``) is rewritten after every example (to a temporary file, then renamed), so
an interrupted run leaves a complete CSV of the examples it finished (its ``n`` column says how many).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ..core.util.errors import InputError
from ..core.util.texts import write_text_atomic
from .common import (
    add_jsonl_args,
    add_model_args,
    add_sweep_args,
    check_output_file,
    check_resume,
    how_run,
    jsonl_path,
    launched_command,
    load,
    read_text,
    report_interrupt,
    sweep_processes,
)


def register(sub: argparse._SubParsersAction) -> None:
    from ..analyses import faithfulness as F
    from ..analyses import tasks as T

    rates = ",".join(f"{r:g}" for r in F.DEFAULT_RATES)
    parser = sub.add_parser(
        "faithfulness",
        help="mask the keys each measure ranks first/last and report ΔPPL curves",
        description="Rank keys by each measure, mask the top (comprehensiveness) or bottom (sufficiency) share "
        "of each query's keys, and report the mean ΔPPL = PPL(masked) - PPL(clean) with a 95% bootstrap interval.",
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
    parser.add_argument(
        "--task",
        choices=("text", *T.TASKS),
        default="text",
        help="text (default: ΔPPL of each example's own tokens) or a multiple-choice task read from --jsonl or --dataset "
        "in its standard fields (mmlu: question, choices, answer index; boolq: passage, question, answer true/false; "
        "winogrande: sentence with _, option1, option2, answer 1/2): accuracy under masking beside ΔPPL",
    )
    parser.add_argument("--field", help="the JSONL/dataset field holding the text (default: text, or question+answer)")
    parser.add_argument("--split", help="the dataset split (default: test; validation for boolq and winogrande)")
    parser.add_argument(
        "--n",
        "--examples",
        dest="n",
        type=int,
        default=F.DEFAULT_EXAMPLES,
        help=f"number of examples (default {F.DEFAULT_EXAMPLES}); under torchrun or accelerate launch write --examples, "
        "since their own option parsers take --n for one of theirs",
    )
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
        "--rank-scope",
        choices=F.RANK_SCOPES,
        default=F.RANK_SCOPES[0],
        help="what is ranked together: each query's keys (query, default), the keys by their mean score over the queries "
        "that see them, masked for every query (token), or all visible (query, key) pairs of a layer (layer); docs/METHOD.md section 3",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=F.EXAMPLE_MAX_TOKENS,
        help=f"token cap per example: longer ones are cut (default {F.EXAMPLE_MAX_TOKENS})",
    )
    parser.add_argument(
        "--batch-size",
        type=parse_batch_size,
        default=F.DEFAULT_BATCH_SIZE,
        help=f"masked runs per forward pass (default {F.DEFAULT_BATCH_SIZE}), or auto: as many as memory allows "
        f"(every distinct run of an example on a GPU, at most {F.DEFAULT_BATCH_SIZE} on a CPU)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random ranking and the bootstrap (default 0)")
    parser.add_argument("--out", type=Path, help="summary CSV, rewritten after every example")
    add_sweep_args(parser, "results folder: per-example records, manifest.json and summary.csv")
    add_model_args(parser)
    parser.set_defaults(func=run)


def parse_batch_size(value: str) -> int:
    """A positive integer, or auto (:data:`cwviz.analyses.faithfulness.AUTO_BATCH`)."""
    from ..analyses.faithfulness import AUTO_BATCH

    if value.strip().lower() == "auto":
        return AUTO_BATCH
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a positive integer or auto, not {value!r}") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"takes a positive integer or auto, not {value!r}")
    return size


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


def split_of(args: argparse.Namespace) -> str:
    return args.split or ("validation" if args.task in ("boolq", "winogrande") else "test")


def read_examples(args: argparse.Namespace) -> list:
    """The examples from --jsonl/--gsm8k, --file, --text or --dataset (at most --n): texts, or with
    --task the items of a multiple-choice task (:class:`cwviz.analyses.tasks.Item`)."""
    from ..analyses.faithfulness import dataset_texts
    from ..analyses.faithfulness import read_examples as read_file
    from ..core.util.texts import read_texts

    if args.n < 1:
        raise InputError(f"--n must be at least 1, not {args.n}")
    if args.task != "text":
        from ..analyses import tasks

        if args.dataset is not None:
            return tasks.dataset_items(args.task, args.dataset, split=split_of(args), n=args.n)
        if args.jsonl is None:
            raise InputError(f"--task {args.task} reads a JSON Lines file (--jsonl PATH) or a dataset (--dataset NAME)")
        return tasks.read_items(args.jsonl, args.task, n=args.n)
    if jsonl_path(args) is not None:
        return read_texts(jsonl_path(args), n=args.n, field=args.field)
    if args.file is not None:
        return read_file(args.file, n=args.n, field=args.field)
    if args.dataset is not None:
        return dataset_texts(args.dataset, split=split_of(args), n=args.n, field=args.field)
    text = read_text(args)
    if not text.strip():
        raise InputError("the prompt is empty; give some text")
    return [text]


def write_csv(summary: pd.DataFrame, path: Path) -> None:
    """Replace ``path`` atomically (:func:`~cwviz.core.util.texts.write_text_atomic`)."""
    write_text_atomic(path, summary.to_csv(index=False, float_format="%.6g"))


def format_table(summary: pd.DataFrame) -> str:
    """Mean ΔPPL per measure and rate, one block per curve, with the area under each curve."""
    from ..analyses.faithfulness import curve_areas
    from ..analyses.schema import area_span

    areas = curve_areas(summary).set_index(["curve", "measure"])["area"]
    n = int(summary["n"].max()) if len(summary) else 0
    rates = sorted(summary["rate"].unique())
    spans = area_span(summary)  # None for one rate: n/a, not a 0 that reads as "masking changed nothing"
    span = f"area over rates {spans[0]:g}..{spans[1]:g}" if spans else "area n/a (needs two rates)"
    lines = []
    for curve, group in summary.groupby("curve", sort=False):
        lines.append(f"{curve}: mean ΔPPL over {n} example(s) (95% bootstrap intervals in the CSV); {span}")
        header = f"  {'measure':34}" + "".join(f"{f'{r:g}%':>10}" for r in rates) + f"{'area':>10}"
        lines.append(header)
        for measure, rows in group.groupby("measure", sort=False):
            by_rate = dict(zip(rows["rate"], rows["delta_ppl"]))
            cells = "".join(f"{by_rate.get(r, float('nan')):>10.3g}" for r in rates)
            area = f"{areas[curve, measure]:.4g}" if spans else "n/a"
            lines.append(f"  {measure:34}{cells}{area:>10}")
        lines.append("")
    return "\n".join(lines)


def format_accuracy(summary: pd.DataFrame) -> str:
    """Accuracy under masking per measure and rate, one block per curve (a multiple-choice task)."""
    clean = summary["accuracy_clean"].iloc[0]
    n = int(summary["n"].max())
    rates = sorted(summary["rate"].unique())
    lines = [f"accuracy: clean {clean:.1%} over {n} item(s); Δaccuracy (masked − clean) in points, paired bootstrap 95% CI in the CSV"]
    for curve, group in summary.groupby("curve", sort=False):
        lines.append(f"{curve}:")
        lines.append(f"  {'measure':34}" + "".join(f"{f'{r:g}%':>10}" for r in rates))
        for measure, rows in group.groupby("measure", sort=False):
            by_rate = dict(zip(rows["rate"], rows["delta_accuracy"]))
            lines.append(f"  {measure:34}" + "".join(f"{100 * by_rate.get(r, float('nan')):>+10.1f}" for r in rates))
        lines.append("")
    return "\n".join(lines)


def examples_loop(task: str):
    """The example loop of ``task``: :func:`cwviz.analyses.faithfulness.iter_examples` for text,
    :func:`cwviz.analyses.tasks.iter_items` for a multiple-choice task."""
    from ..analyses import faithfulness, tasks

    return faithfulness.iter_examples if task == "text" else tasks.iter_items


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


def protocol_of(args: argparse.Namespace):
    from ..analyses import faithfulness

    return faithfulness.Protocol(
        rates=parse_rates(args.rates),
        measures=parse_measures(args.measures),
        layer=parse_layer(args.layers),
        per_head=args.per_head,
        rank_by=args.rank_by,
        rank_scope=args.rank_scope,
        seed=args.seed,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
    )


def run(args: argparse.Namespace) -> int:
    protocol = protocol_of(args)
    check_resume(args)
    texts = read_examples(args)
    check_output_file(args.out, "--out", "summary.csv")
    procs = sweep_processes(args)
    if args.results is not None:
        from ..analyses import sweep

        sweep.check_folder(args.results)
        with sweep.owned(args.results, procs):  # before the model loads: a busy folder is refused at once
            return run_sweep(args, protocol, texts, procs)
    return run_single(args, protocol, texts)


def print_summary(bundle_id: str, examples: int, protocol, summary: pd.DataFrame) -> None:
    print(
        f"model: {bundle_id}; {examples} example(s), at most {protocol.max_tokens} tokens each; "
        f"layers: {'all at once' if protocol.layer is None else protocol.layer}; "
        f"scores: {'per head' if protocol.per_head else 'layer-level'}, ranked by {protocol.rank_by} value "
        f"per {protocol.rank_scope} (rank scope)"
    )
    print(format_table(summary))
    if "delta_accuracy" in summary:
        print(format_accuracy(summary))
    print(format_order(summary))


def run_single(args: argparse.Namespace, protocol, texts: list[str]) -> int:
    from tqdm import tqdm

    from ..analyses import faithfulness

    bundle = load(args)
    faithfulness.check_causal(bundle)  # before the progress bar: an encoder gets one error line
    tables: list[pd.DataFrame] = []
    summary = pd.DataFrame(columns=faithfulness.SUMMARY_COLUMNS)
    interrupted = False
    try:
        with tqdm(total=len(texts), desc="faithfulness", unit="example", file=sys.stderr) as bar:
            for _, table in examples_loop(args.task)(bundle, texts, protocol):
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
    print_summary(bundle.info.id, len(tables), protocol, summary)
    if args.out is not None:
        print(f"wrote {args.out}")
    if interrupted:
        return report_interrupt(len(tables), len(texts), "example", args.out)
    return 0


def run_sweep(args: argparse.Namespace, protocol, texts: list, procs) -> int:
    """The resumable, data-parallel sweep (:func:`cwviz.analyses.sweep.run`): each process runs its share of the
    unfinished examples; the main process then recomputes the summary from every record."""
    from ..analyses import faithfulness, sweep
    from ..analyses import records as R
    from ..core.util.parallel import model_provenance
    from ..core.util.progress import cli_bar

    folder: Path = args.results
    bundle = load(args)
    faithfulness.check_causal(bundle)
    provenance = model_provenance(bundle)
    settings = sweep.faithfulness_settings(protocol, provenance, args.task)
    made = manifest(args, protocol, provenance, args.task, len(texts), procs.count, R.fingerprint(settings))
    plan = sweep.Sweep(sweep.FAITHFULNESS, folder, settings, [sweep.item_text(t) for t in texts], made)
    compute = sweep.faithfulness_item(bundle, texts, protocol, args.task)
    with cli_bar(f"faithfulness [{procs.index}]", unit="example", enabled=procs.is_main) as progress:
        outcome = sweep.run(plan, compute, procs, resume=args.resume, progress=progress)
    if not outcome.is_main:
        return 130 if outcome.interrupted else 0
    records = outcome.records
    finished = sum(1 for r in records if not r["skipped"])
    summary = sweep.faithfulness_summary(records, seed=args.seed)
    write_csv(summary, folder / R.SUMMARY)
    if args.out is not None:
        write_csv(summary, args.out)
    if outcome.interrupted:
        return report_interrupt(len(records), len(texts), "example", folder)
    if not finished:
        raise InputError("no example had two or more tokens; nothing to measure")
    print_summary(bundle.info.id, finished, protocol, summary)
    print(f"wrote {folder / R.SUMMARY} ({len(records)} record(s) from {len(list(folder.glob(R.RECORD_GLOB)))} file(s))")
    return 0


def manifest(args: argparse.Namespace, protocol, provenance: dict, task: str, examples: int, count: int, key: str) -> dict:
    """How this run was made and how to rerun it (``manifest.json``; the report shows it)."""
    made = launched_command(how_run(args), count)
    split = split_of(args) if args.dataset else None
    data = {"jsonl": str(jsonl_path(args)) if jsonl_path(args) else None, "file": args.file, "dataset": args.dataset, "split": split}
    return {
        "schema": "cwviz.faithfulness.manifest",
        "fingerprint": key,
        "model": provenance,
        "seed": protocol.seed,
        "rates": list(protocol.rates),
        "measures": list(protocol.measures),
        "protocol": {
            "layer": protocol.layer,
            "per_head": protocol.per_head,
            "rank_by": protocol.rank_by,
            "rank_scope": protocol.rank_scope,
            "max_tokens": protocol.max_tokens,
        },
        "batch_size": protocol.batch_size or "auto",
        "task": task,
        "data": {k: v for k, v in data.items() if v} | {"examples": examples},
        "processes": count,
        **made,
    }
