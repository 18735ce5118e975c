"""``cwviz flow-faithfulness``: which attribution method says what the model does? (docs/METHOD.md section 7.3,
pre-registered; protocol version 2)

Each item runs through the one sweep runner (:mod:`cwviz.analyses.sweep`) into ``DIR/flow_faithfulness/`` (records,
manifest), so a run resumes (``--resume``) and shards under ``torchrun`` / ``accelerate launch``; the main process then
recomputes every statistic from the records (:mod:`cwviz.analyses.flow_verdicts`), writes
``DIR/flow_faithfulness.csv`` (the verdicts), ``DIR/flow_faithfulness_methods.csv`` (each method's means) and
``DIR/flow_faithfulness_items.csv`` (each item's ρ per method) atomically, and prints the primary verdicts.
"""

from __future__ import annotations

import argparse

from ..analyses import faithfulness, flow_faithfulness, flow_verdicts, sweep
from ..analyses.codecs.checks import FLOW_FAITHFULNESS
from ..core.loading.provenance import model_provenance
from ..core.util.progress import cli_bar
from ..core.util.texts import read_texts
from . import outputs
from .common import early_exit, jsonl_path, load, report_interrupt, run_manifest, sweep_processes


def settings_of(args: argparse.Namespace, provenance: dict) -> dict:
    """What decides a record's numbers (:meth:`cwviz.analyses.codecs.checks.FlowFaithfulnessCodec.settings`)."""
    return FLOW_FAITHFULNESS.settings(
        args.max_tokens,
        args.draws,
        args.seed,
        flow_faithfulness.RATES,
        flow_faithfulness.TIE_TOLERANCE,
        flow_faithfulness.VERSION,
        provenance,
    )


def run(args: argparse.Namespace) -> int:
    texts = read_texts(jsonl_path(args), n=args.n, field=args.field)
    sweep.check_folder(args.results)
    outputs.check_folder(args.results, "--results")
    procs = sweep_processes(args)
    # before the model loads: a busy folder is refused at once
    with sweep.owned(args.results / flow_faithfulness.RECORDS_FOLDER, procs):
        return run_sweep(args, texts, procs)


def run_sweep(args: argparse.Namespace, texts: list[str], procs) -> int:
    """The items through the sweep runner; the main process computes the tables and verdicts from every record."""
    bundle = load(args)
    faithfulness.check_causal(bundle)
    provenance = model_provenance(bundle)
    settings = settings_of(args, provenance)
    data = {"jsonl": str(jsonl_path(args)), "examples": len(texts)}
    made = run_manifest(args, FLOW_FAITHFULNESS, settings, provenance, procs.count, seed=args.seed, data=data)
    plan = sweep.Sweep(FLOW_FAITHFULNESS, settings, texts, args.results / flow_faithfulness.RECORDS_FOLDER, made)

    def compute(index: int) -> dict:
        return flow_faithfulness.item_payload(
            bundle, texts[index], index, args.max_tokens, args.seed, args.draws, args.batch_size
        )

    with cli_bar(f"flow-faithfulness [{procs.index}]", unit="item", enabled=procs.is_main) as progress:
        outcome = sweep.run(plan, compute, procs, resume=args.resume, progress=progress)
    stop = early_exit(
        outcome,
        len(texts),
        f"no item had {flow_faithfulness.MIN_TOKENS} or more tokens and a clear top token; nothing to judge",
    )
    if stop is not None:
        return stop
    made_records = outcome.records
    finished = sum(1 for r in made_records if not r["skipped"])
    verdicts = flow_verdicts.verdict_table(made_records, seed=args.seed)
    methods = flow_verdicts.method_table(made_records, seed=args.seed)
    items = flow_verdicts.item_table(made_records)
    verdicts_path, methods_path = (
        args.results / flow_faithfulness.CSV_NAME,
        args.results / flow_faithfulness.METHODS_CSV_NAME,
    )
    items_path = args.results / flow_faithfulness.ITEMS_CSV_NAME
    outputs.write(verdicts_path, outputs.csv_text(verdicts))
    outputs.write(methods_path, outputs.csv_text(methods))
    outputs.write(items_path, outputs.csv_text(items))
    skips = ", ".join(f"{count} {why}" for why, count in flow_verdicts.skipped_counts(made_records).items()) or "none"
    print(f"model: {bundle.info.id}; {finished} item(s), at most {args.max_tokens} tokens each; skipped: {skips}")
    print(flow_verdicts.format_verdicts(verdicts))
    print(f"wrote {verdicts_path}, {methods_path} and {items_path} ({len(made_records)} record(s))")
    if outcome.interrupted:
        return report_interrupt(len(made_records), len(texts), "item", args.results)
    return 0
