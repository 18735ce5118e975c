"""``cwviz flow-faithfulness``: is the signed flow faithful? (docs/METHOD.md section 6.6, pre-registered)

Each item runs through the one sweep runner (:mod:`cwviz.analyses.sweep`) into ``DIR/flow_faithfulness/`` (records,
manifest), so a run resumes (``--resume``) and shards under ``torchrun`` / ``accelerate launch``; the main process then
recomputes every statistic from the records (:mod:`cwviz.analyses.flow_faithfulness`), writes
``DIR/flow_faithfulness.csv`` (the verdicts) and ``DIR/flow_faithfulness_methods.csv`` (each method's means)
atomically, and prints the primary verdicts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.util.errors import InputError
from ..core.util.texts import write_text_atomic
from .common import add_jsonl_args, add_model_args, how_run, jsonl_path, launched_command, load, report_interrupt, sweep_processes


def register(sub: argparse._SubParsersAction) -> None:
    from ..analyses import faithfulness as F
    from ..analyses import flow_faithfulness as FF

    parser = sub.add_parser(
        "flow-faithfulness",
        help="is the signed flow faithful? knockouts of each input token, deletion curves, verdicts against baselines",
        description="On each item: knock out each input token in every layer and correlate the effects on the logit "
        "difference (top token − second) with the signed flow, ALTI, attention rollout, raw attention and a random "
        "ranking; run comprehensiveness and sufficiency at 10 and 30%% of the input tokens; judge the pre-registered "
        "comparisons holds / fails / unresolved from 95%% paired bootstrap intervals over the items (docs/METHOD.md "
        "section 6.6). Writes DIR/flow_faithfulness.csv and DIR/flow_faithfulness_methods.csv.",
    )
    data = parser.add_mutually_exclusive_group(required=True)
    add_jsonl_args(data, "JSON Lines: a 'text' field per line, or GSM8K's question and answer")
    parser.add_argument("--field", help="the JSONL field holding the text (default: text, or question+answer)")
    parser.add_argument(
        "--n",
        "--examples",
        dest="n",
        type=int,
        default=F.DEFAULT_EXAMPLES,
        help=f"number of items (default {F.DEFAULT_EXAMPLES}); under torchrun or accelerate launch write --examples",
    )
    parser.add_argument(
        "--results", type=Path, required=True, help="results folder: DIR/flow_faithfulness/ (records, manifest) and the CSV files"
    )
    parser.add_argument("--resume", action="store_true", help="skip the items already recorded in DIR/flow_faithfulness/")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=FF.DEFAULT_MAX_TOKENS,
        help=f"token cap per item: longer ones are cut, the target is the next token after the cut (default {FF.DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument("--draws", type=int, default=FF.DRAWS, help=f"random rankings per item (default {FF.DRAWS})")
    parser.add_argument(
        "--batch-size", type=int, default=FF.DEFAULT_BATCH_SIZE, help=f"knockouts per forward pass (default {FF.DEFAULT_BATCH_SIZE})"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random rankings and the bootstrap (default 0)")
    add_model_args(parser)
    parser.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """Before any file is read: InputError for a setting out of range."""
    from ..analyses.flow_faithfulness import MIN_TOKENS

    for flag, value, least in (("--n", args.n, 1), ("--batch-size", args.batch_size, 1), ("--draws", args.draws, 1)):
        if value < least:
            raise InputError(f"{flag} must be at least {least}, not {value}")
    if args.max_tokens < MIN_TOKENS:
        raise InputError(f"--max-tokens must be at least {MIN_TOKENS} (the target and three input tokens), not {args.max_tokens}")


def settings_of(args: argparse.Namespace, provenance: dict) -> dict:
    """What decides a record's numbers: the cap, the random draws and seed, the rates, the tie rule, the record's
    version and the model (not the batch size or the device)."""
    from ..analyses import flow_faithfulness as FF
    from ..analyses.sweep import model_settings

    made = {"max_tokens": args.max_tokens, "draws": args.draws, "seed": args.seed, "rates": list(FF.RATES)}
    made |= {"tie_tolerance": FF.TIE_TOLERANCE, "version": FF.VERSION}
    return made | {"model": model_settings(provenance)}


def run(args: argparse.Namespace) -> int:
    from ..analyses import flow_faithfulness as FF
    from ..analyses import sweep
    from ..core.util.texts import read_texts

    check_args(args)
    texts = read_texts(jsonl_path(args), n=args.n, field=args.field)
    sweep.check_folder(args.results)
    procs = sweep_processes(args)
    with sweep.owned(args.results / FF.RECORDS_FOLDER, procs):  # before the model loads: a busy folder is refused at once
        return run_sweep(args, texts, procs)


def run_sweep(args: argparse.Namespace, texts: list[str], procs) -> int:
    """The items through the sweep runner; the main process computes the tables and verdicts from every record."""
    from ..analyses import faithfulness as F
    from ..analyses import flow_faithfulness as FF
    from ..analyses import records as R
    from ..analyses import sweep
    from ..core.util.parallel import model_provenance
    from ..core.util.progress import cli_bar

    bundle = load(args)
    F.check_causal(bundle)
    provenance = model_provenance(bundle)
    settings = settings_of(args, provenance)
    made = {"schema": f"cwviz.{FF.KIND}.manifest", "fingerprint": R.fingerprint(settings), "model": provenance, "seed": args.seed}
    made |= {"settings": settings, "data": {"jsonl": str(jsonl_path(args)), "examples": len(texts)}, "processes": procs.count}
    made |= launched_command(how_run(args), procs.count)
    plan = sweep.Sweep(FF.KIND, args.results / FF.RECORDS_FOLDER, settings, texts, made)

    def compute(index: int) -> dict:
        return FF.item_payload(bundle, texts[index], index, args.max_tokens, args.seed, args.draws, args.batch_size)

    with cli_bar(f"flow-faithfulness [{procs.index}]", unit="item", enabled=procs.is_main) as progress:
        outcome = sweep.run(plan, compute, procs, resume=args.resume, progress=progress)
    if not outcome.is_main:
        return 130 if outcome.interrupted else 0
    records = outcome.records
    finished = sum(1 for r in records if not r["skipped"])
    if not finished:
        if outcome.interrupted:
            return report_interrupt(0, len(texts), "item")
        raise InputError(f"no item had {FF.MIN_TOKENS} or more tokens and a clear top token; nothing to judge")
    verdicts = FF.verdict_table(records, seed=args.seed)
    methods = FF.method_table(records, seed=args.seed)
    write_text_atomic(args.results / FF.CSV_NAME, verdicts.to_csv(index=False, float_format="%.6g"))
    write_text_atomic(args.results / FF.METHODS_CSV_NAME, methods.to_csv(index=False, float_format="%.6g"))
    skipped = FF.skipped_counts(records)
    skips = ", ".join(f"{count} {why}" for why, count in skipped.items()) or "none"
    print(f"model: {bundle.info.id}; {finished} item(s), at most {args.max_tokens} tokens each; skipped: {skips}")
    print(FF.format_verdicts(verdicts))
    print(f"wrote {args.results / FF.CSV_NAME} and {args.results / FF.METHODS_CSV_NAME} ({len(records)} record(s))")
    if outcome.interrupted:
        return report_interrupt(len(records), len(texts), "item", args.results)
    return 0
