"""``python -m cwviz faithfulness``: comprehensiveness and sufficiency curves (docs/METHOD.md section 3).

The summary CSV (``--out``) is rewritten after every example (to a temporary file, then renamed), so
an interrupted run leaves a complete CSV of the examples it finished (its ``n`` column says how many).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from ..analyses import faithfulness, faithfulness_summary, records, sweep, tasks
from ..analyses.codecs.sweeps import FAITHFULNESS
from ..analyses.examples import dataset_texts
from ..analyses.examples import read_examples as read_file
from ..analyses.faithfulness_summary import PAPER_ORDER, curve_areas, order_check
from ..analyses.schema import area_span
from ..core.loading.provenance import model_provenance
from ..core.util.errors import InputError
from ..core.util.progress import cli_bar
from ..core.util.texts import read_texts
from . import outputs
from .common import (
    check_resume,
    jsonl_path,
    load,
    read_text,
    report_interrupt,
    run_manifest,
    sweep_processes,
)
from .options import parse_layer, parse_measures, parse_rates


def split_of(args: argparse.Namespace) -> str:
    return args.split or ("validation" if args.task in ("boolq", "winogrande") else "test")


def read_examples(args: argparse.Namespace) -> list:
    """The examples from --jsonl/--gsm8k, --file, --text or --dataset (at most --n): texts, or with
    --task the items of a multiple-choice task (:class:`cwviz.analyses.tasks.Item`)."""

    if args.n < 1:
        raise InputError(f"--n must be at least 1, not {args.n}")
    if args.task != "text":
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
    """Replace ``path`` whole (:func:`cwviz.cli.outputs.write`)."""
    outputs.write(path, outputs.csv_text(summary))


def gaps_path(out: Path) -> Path:
    """Where the gaps to the random control go beside the summary CSV ``out``: results.csv -> results-gaps.csv."""
    return out.with_name(f"{out.stem}-gaps{out.suffix or '.csv'}")


def format_table(summary: pd.DataFrame) -> str:
    """Mean ΔPPL per measure and rate, one block per curve, with the area under each curve."""

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
    lines = [
        f"accuracy: clean {clean:.1%} over {n} item(s); Δaccuracy (masked − clean) in points, paired bootstrap "
        "95% CI in the CSV"
    ]
    for curve, group in summary.groupby("curve", sort=False):
        lines.append(f"{curve}:")
        lines.append(f"  {'measure':34}" + "".join(f"{f'{r:g}%':>10}" for r in rates))
        for measure, rows in group.groupby("measure", sort=False):
            by_rate = dict(zip(rows["rate"], rows["delta_accuracy"]))
            lines.append(f"  {measure:34}" + "".join(f"{100 * by_rate.get(r, float('nan')):>+10.1f}" for r in rates))
        lines.append("")
    return "\n".join(lines)


def format_order(summary: pd.DataFrame) -> str:
    """Whether the paper's order holds, by area and at each rate (pairs that fail or tie are named)."""

    by_area, by_rate = order_check(curve_areas(summary)), order_check(summary, value="delta_ppl")
    if by_area.empty:
        return ""
    lines = ["paper's order " + " < ".join(PAPER_ORDER) + " (comprehensiveness; sufficiency reversed):"]

    def order_state(rows: pd.DataFrame) -> str:
        odd = [
            f"{a}/{b} {r}" for a, b, r in rows[["lower", "higher", "relation"]].itertuples(index=False) if r != "holds"
        ]
        return "holds" if not odd else "; ".join(odd)

    for curve, group in by_area.groupby("curve", sort=False):
        lines.append(f"  {curve}, by area: {order_state(group)}")
        for rate, rows in by_rate[by_rate.curve == curve].groupby("rate", sort=False):
            lines.append(f"    at {rate:g}%: {order_state(rows)}")
    return "\n".join(lines)


def format_gaps(gaps: pd.DataFrame, draws: int) -> str:
    """Each measure's gap to the random control (log-perplexity ratio; > 0: better than chance), beside the order."""
    if not len(gaps):
        return "gap to random: no random run (add random to --measures)"
    lines = [f"gap to random ({draws} draw(s) an example; log-perplexity ratio, > 0: better than chance; 95 % CI):"]
    for row in gaps.itertuples(index=False):
        lines.append(
            f"  {row.curve} {row.rate:g}% {row.measure}: {row.gap:+.4g} [{row.ci_low:+.4g}, {row.ci_high:+.4g}]"
        )
    return "\n".join(lines)


def protocol_of(args: argparse.Namespace) -> faithfulness.Protocol:
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
        draws=args.draws,
    )


def run(args: argparse.Namespace) -> int:
    protocol = protocol_of(args)
    check_resume(args)
    texts = read_examples(args)
    outputs.check_file(args.out, "--out", "summary.csv")
    outputs.check_folder(args.results, "--results")
    procs = sweep_processes(args)
    if args.results is None:
        return run_sweep(args, protocol, texts, procs)  # in memory
    sweep.check_folder(args.results)
    with sweep.owned(args.results, procs):  # before the model loads: a busy folder is refused at once
        return run_sweep(args, protocol, texts, procs)


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


def run_sweep(args: argparse.Namespace, protocol: faithfulness.Protocol, texts: list, procs) -> int:
    """The examples through the sweep runner (:func:`cwviz.analyses.sweep.run`): in memory, the summary rewritten to
    ``--out`` after every example; with ``--results DIR`` each process runs its share of the unfinished examples into
    DIR and the main process then recomputes the summary from every record."""
    folder: Path | None = args.results
    bundle = load(args)
    faithfulness.check_causal(bundle)  # before the progress bar: an encoder gets one error line
    provenance = model_provenance(bundle)
    settings = FAITHFULNESS.settings(protocol, provenance, args.task)
    made = manifest(args, protocol, provenance, len(texts), procs.count, settings) if folder is not None else None
    plan = sweep.Sweep(FAITHFULNESS, settings, [tasks.item_text(t) for t in texts], folder, made)
    store: dict[int, dict] = {}
    with cli_bar(f"faithfulness [{procs.index}]", unit="example", enabled=procs.is_main) as bar:

        def progress(done: int, total: int) -> None:
            if bar is not None:
                bar(done, total)
            if folder is None and args.out is not None and any(not r["skipped"] for r in store.values()):
                # an interrupted run keeps them all
                write_csv(FAITHFULNESS.summary(list(store.values()), seed=args.seed), args.out)

        outcome = sweep.run(
            plan, tasks.example_compute(bundle, texts, protocol, args.task), procs, args.resume, progress, store=store
        )
    if not outcome.is_main:
        return 130 if outcome.interrupted else 0
    made_records = outcome.records
    finished = sum(1 for r in made_records if not r["skipped"])
    summary = FAITHFULNESS.summary(made_records, seed=args.seed)
    # Each measure's gap to the random control, paired per example, in its own CSV beside the summary (written once
    # every example is in: its bootstrap is over the examples); none without a random run.
    gaps = pd.DataFrame()
    if finished:
        gaps = faithfulness_summary.random_gaps(FAITHFULNESS.decode(made_records), seed=args.seed)
    written = ([folder / records.GAPS] if folder is not None else []) + (
        [gaps_path(args.out)] if args.out is not None else []
    )
    written = written if len(gaps) else []
    for path in written:
        write_csv(gaps, path)
    if folder is not None:
        write_csv(summary, folder / records.SUMMARY)
        if args.out is not None:
            write_csv(summary, args.out)
        if outcome.interrupted:
            return report_interrupt(len(made_records), len(texts), "example", folder)
    if not finished:
        if outcome.interrupted:
            return report_interrupt(0, len(texts), "example")
        raise InputError("no example had two or more tokens; nothing to measure")
    print_summary(bundle.info.id, finished, protocol, summary)
    print(format_gaps(gaps, protocol.draws))
    if folder is not None:
        print(
            f"wrote {folder / records.SUMMARY} ({len(made_records)} record(s) from "
            f"{len(list(folder.glob(records.RECORD_GLOB)))} file(s))"
        )
    elif args.out is not None:
        print(f"wrote {args.out}")
    if written:  # none without --out or --results: nothing is said to be written that was not
        print(f"wrote the gaps to random: {', '.join(map(str, written))}")
    if outcome.interrupted:
        return report_interrupt(finished, len(texts), "example", args.out)
    return 0


def manifest(
    args: argparse.Namespace,
    protocol: faithfulness.Protocol,
    provenance: dict,
    examples: int,
    count: int,
    settings: dict,
) -> dict:
    """How this run was made and how to rerun it (``manifest.json``; the report shows it)."""
    split = split_of(args) if args.dataset else None
    data = {
        "jsonl": str(jsonl_path(args)) if jsonl_path(args) else None,
        "file": args.file,
        "dataset": args.dataset,
        "split": split,
    }
    protocol_fields = {
        k: getattr(protocol, k) for k in ("layer", "per_head", "rank_by", "rank_scope", "max_tokens", "draws")
    }
    return run_manifest(
        args,
        FAITHFULNESS,
        settings,
        provenance,
        count,
        seed=protocol.seed,
        rates=list(protocol.rates),
        measures=list(protocol.measures),
        protocol=protocol_fields,
        batch_size=protocol.batch_size or "auto",
        task=args.task,
        data={k: v for k, v in data.items() if v} | {"examples": examples},
    )
