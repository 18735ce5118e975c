"""``cwviz claims``: does the paper hold on this model? (docs/METHOD.md section 5)

Each item runs through the one sweep runner (:mod:`cwviz.analyses.sweep`) into ``DIR/claims/`` (records, manifest),
so a run resumes (``--resume``) and shards under ``torchrun`` / ``accelerate launch`` as the other sweeps do; the main
process then recomputes the claims table from every record (:func:`cwviz.analyses.claims.claims_table`), writes
``DIR/claims.csv`` atomically and prints it.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from ..core.util.errors import InputError
from ..core.util.texts import write_text_atomic
from .common import (
    add_jsonl_args,
    add_model_args,
    how_run,
    jsonl_path,
    launched_command,
    load,
    report_interrupt,
    sweep_processes,
)


def register(sub: argparse._SubParsersAction) -> None:
    from ..analyses import claims as C
    from ..analyses import faithfulness as F

    rates = ",".join(f"{r:g}" for r in C.DEFAULT_RATES)
    parser = sub.add_parser(
        "claims",
        help="check the paper's five claims on a model: a verdict per claim with bootstrap intervals over items",
        description="Run the faithfulness curves under each rank scope, the sink tables, head curves and the sink "
        "intervention on each item, and judge each of the paper's five claims holds / fails / unresolved from 95%% "
        "bootstrap intervals over the items (criteria: docs/METHOD.md section 5). Writes DIR/claims.csv.",
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
    parser.add_argument("--results", type=Path, required=True, help="results folder: DIR/claims/ (records, manifest) and DIR/claims.csv")
    parser.add_argument("--resume", action="store_true", help="skip the items already recorded in DIR/claims/")
    parser.add_argument("--rates", default=rates, help=f"removal rates in %% for claim 1 (default {rates})")
    parser.add_argument(
        "--scopes",
        default=",".join(F.RANK_SCOPES),
        help=f"rank scopes for claim 1, comma-separated (default {','.join(F.RANK_SCOPES)})",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=C.DEFAULT_MAX_TOKENS,
        help=f"token cap per item: longer ones are cut (default {C.DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument("--sink", default="0", help="the sink position, or auto (default 0: the first token)")
    parser.add_argument(
        "--batch-size", type=int, default=F.DEFAULT_BATCH_SIZE, help=f"masked runs per forward pass (default {F.DEFAULT_BATCH_SIZE})"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    add_model_args(parser)
    parser.set_defaults(func=run)


def parse_scopes(value: str) -> tuple[str, ...]:
    from ..analyses.faithfulness import RANK_SCOPES

    scopes = tuple(dict.fromkeys(part.strip().lower() for part in value.split(",") if part.strip()))
    bad = [s for s in scopes if s not in RANK_SCOPES]
    if bad or not scopes:
        raise InputError(f"--scopes takes some of {', '.join(RANK_SCOPES)}, comma-separated; not {value!r}")
    return scopes


def parse_sink(value: str):
    from ..analyses.sinks import AUTO

    text = value.strip().lower()
    if text == AUTO:
        return AUTO
    try:
        position = int(text)
    except ValueError:
        raise InputError(f"--sink takes a position (0, 1, ...) or auto, not {value!r}") from None
    if position < 0:
        raise InputError(f"--sink takes a position (0, 1, ...) or auto, not {value!r}")
    return position


def protocol_of(args: argparse.Namespace):
    from ..analyses import claims as C
    from ..analyses import faithfulness as F
    from .faithfulness import parse_rates

    if args.batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, not {args.batch_size}")
    return F.Protocol(
        rates=parse_rates(args.rates), measures=C.ORDER, seed=args.seed, batch_size=args.batch_size, max_tokens=args.max_tokens
    )


def settings_of(protocol, scopes: tuple[str, ...], sink, provenance: dict) -> dict:
    """What decides a claims record's numbers: the protocol (not its batch size or scope), the scopes, the sink, the model."""
    from ..analyses.sweep import model_settings

    kept = {k: v for k, v in asdict(protocol).items() if k not in ("batch_size", "rank_scope")}
    return {"protocol": kept, "scopes": list(scopes), "sink": str(sink), "model": model_settings(provenance)}


def read_items(args: argparse.Namespace) -> list[str]:
    from ..core.util.texts import read_texts

    if args.n < 1:
        raise InputError(f"--n must be at least 1, not {args.n}")
    return read_texts(jsonl_path(args), n=args.n, field=args.field)


def run(args: argparse.Namespace) -> int:
    from ..analyses import claims as C
    from ..analyses import sweep

    protocol, scopes, sink = protocol_of(args), parse_scopes(args.scopes), parse_sink(args.sink)
    texts = read_items(args)
    sweep.check_folder(args.results)
    procs = sweep_processes(args)
    with sweep.owned(args.results / C.RECORDS_FOLDER, procs):  # before the model loads: a busy folder is refused at once
        return run_sweep(args, protocol, scopes, sink, texts, procs)


def run_sweep(args: argparse.Namespace, protocol, scopes: tuple[str, ...], sink, texts: list[str], procs) -> int:
    """The items through the sweep runner into ``DIR/claims/``; the main process judges the claims from every record."""
    from ..analyses import claims as C
    from ..analyses import faithfulness as F
    from ..analyses import records as R
    from ..analyses import sweep
    from ..core.util.parallel import model_provenance
    from ..core.util.progress import cli_bar

    bundle = load(args)
    F.check_causal(bundle)
    provenance = model_provenance(bundle)
    settings = settings_of(protocol, scopes, sink, provenance)
    key = R.fingerprint(settings)
    data = {"jsonl": str(jsonl_path(args)), "examples": len(texts)}
    made = {"schema": "cwviz.claims.manifest", "fingerprint": key, "model": provenance, "seed": protocol.seed}
    made |= {"rates": list(protocol.rates), "measures": list(protocol.measures), "scopes": list(scopes), "sink": str(sink)}
    made |= {"protocol": {"max_tokens": protocol.max_tokens, "rank_scopes": ", ".join(scopes)}, "data": data, "processes": procs.count}
    made |= launched_command(how_run(args), procs.count)
    plan = sweep.Sweep(C.CLAIMS, args.results / C.RECORDS_FOLDER, settings, texts, made)

    def compute(index: int) -> dict:
        return C.item_payload(bundle, texts[index], protocol, scopes, sink, example=index)

    with cli_bar(f"claims [{procs.index}]", unit="item", enabled=procs.is_main) as progress:
        outcome = sweep.run(plan, compute, procs, resume=args.resume, progress=progress)
    if not outcome.is_main:
        return 130 if outcome.interrupted else 0
    records = outcome.records
    finished = sum(1 for r in records if not r["skipped"])
    if not finished:
        if outcome.interrupted:
            return report_interrupt(0, len(texts), "item")
        raise InputError("no item had three or more tokens; nothing to judge")
    table = C.claims_table(records, seed=protocol.seed)
    path = args.results / C.CSV_NAME
    write_text_atomic(path, table.to_csv(index=False, float_format="%.6g"))
    print(f"model: {bundle.info.id}; {finished} item(s), at most {protocol.max_tokens} tokens each; rank scopes: {', '.join(scopes)}")
    print(format_table(table))
    print(f"wrote {path} ({len(records)} record(s); add it to a report: cwviz report --results {args.results})")
    if outcome.interrupted:
        return report_interrupt(len(records), len(texts), "item", args.results)
    return 0


def format_table(table) -> str:
    """The verdicts, one line per row of the claims table."""
    lines = []
    for row in table.itertuples(index=False):
        where = f" [{row.scope}, {row.curve}, {row.rate:g}%]" if row.claim == 1 else ""
        lines.append(f"claim {row.claim}{where}: {row.verdict.upper()}: {row.evidence}")
    return "\n".join(lines)
