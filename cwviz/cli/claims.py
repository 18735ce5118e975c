"""``cwviz claims``: does the paper hold on this model? (docs/METHOD.md section 5)

Each item runs through the one sweep runner (:mod:`cwviz.analyses.sweep`) into ``DIR/claims/`` (records, manifest),
so a run resumes (``--resume``) and shards under ``torchrun`` / ``accelerate launch`` as the other sweeps do; the main
process then recomputes the claims table from every record (:func:`cwviz.analyses.claims.claims_table`), writes
``DIR/claims.csv`` atomically and prints it.
"""

from __future__ import annotations

import argparse

from ..analyses import claim_runs, claims, faithfulness, sweep
from ..analyses.codecs.checks import CLAIMS
from ..core.loading.provenance import model_provenance
from ..core.util.errors import InputError
from ..core.util.progress import cli_bar
from ..core.util.texts import read_texts
from . import outputs
from .common import (
    early_exit,
    jsonl_path,
    load,
    report_interrupt,
    run_manifest,
    sweep_processes,
)
from .options import parse_rates, parse_scopes


def protocol_of(args: argparse.Namespace) -> faithfulness.Protocol:
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be at least 1, not {args.batch_size}")
    return claim_runs.protocol(
        parse_rates(args.rates),
        args.max_tokens,
        seed=args.seed,
        batch_size=args.batch_size,
        draws=args.draws,
    )


def read_items(args: argparse.Namespace) -> list[str]:

    if args.n < 1:
        raise InputError(f"--n must be at least 1, not {args.n}")
    return read_texts(jsonl_path(args), n=args.n, field=args.field)


def run(args: argparse.Namespace) -> int:
    protocol, scopes, sink = protocol_of(args), parse_scopes(args.scopes), args.sink
    texts = read_items(args)
    sweep.check_folder(args.results)
    outputs.check_folder(args.results, "--results")
    procs = sweep_processes(args)
    # before the model loads: a busy folder is refused at once
    with sweep.owned(args.results / claims.RECORDS_FOLDER, procs):
        return run_sweep(args, protocol, scopes, sink, texts, procs)


def run_sweep(args: argparse.Namespace, protocol, scopes: tuple[str, ...], sink, texts: list[str], procs) -> int:
    """The items through the sweep runner into ``DIR/claims/``; the main process judges the claims from every record."""
    bundle = load(args)
    faithfulness.check_causal(bundle)
    provenance = model_provenance(bundle)
    settings = CLAIMS.settings(protocol, scopes, sink, provenance)
    fields = {
        "seed": protocol.seed,
        "rates": list(protocol.rates),
        "measures": list(protocol.measures),
        "scopes": list(scopes),
    }
    fields |= {"draws": protocol.draws}
    fields |= {"sink": str(sink), "protocol": {"max_tokens": protocol.max_tokens, "rank_scopes": ", ".join(scopes)}}
    fields |= {"data": {"jsonl": str(jsonl_path(args)), "examples": len(texts)}}
    made = run_manifest(args, CLAIMS, settings, provenance, procs.count, **fields)
    plan = sweep.Sweep(CLAIMS, settings, texts, args.results / claims.RECORDS_FOLDER, made)

    def compute(index: int) -> dict:
        return claim_runs.item_payload(bundle, texts[index], protocol, scopes, sink, example=index)

    with cli_bar(f"claims [{procs.index}]", unit="item", enabled=procs.is_main) as progress:
        outcome = sweep.run(plan, compute, procs, resume=args.resume, progress=progress)
    stop = early_exit(outcome, len(texts), "no item had three or more tokens; nothing to judge")
    if stop is not None:
        return stop
    made_records = outcome.records
    finished = sum(1 for r in made_records if not r["skipped"])
    table = claims.claims_table(made_records, seed=protocol.seed)
    path = args.results / claims.CSV_NAME
    outputs.write(path, outputs.csv_text(table))
    print(
        f"model: {bundle.info.id}; {finished} item(s), at most {protocol.max_tokens} tokens each; rank scopes: "
        f"{', '.join(scopes)}"
    )
    print(format_table(table))
    print(f"wrote {path} ({len(made_records)} record(s); add it to a report: cwviz report --results {args.results})")
    if outcome.interrupted:
        return report_interrupt(len(made_records), len(texts), "item", args.results)
    return 0


def format_table(table) -> str:
    """The verdicts, one line per row of the claims table."""
    lines = []
    for row in table.itertuples(index=False):
        where = f" [{row.scope}, {row.curve}, {row.rate:g}%]" if row.claim == 1 else ""
        if row.role == claims.VERDICT:
            lines.append(
                f"claim {row.claim}{row.part}{where}: {row.verdict.upper()}: {row.statistic} {row.estimate:+.3g} "
                f"[{row.ci_low:+.3g}, {row.ci_high:+.3g}]; {row.evidence}"
            )
        else:
            judged = f" ({row.verdict})" if row.verdict else ""
            lines.append(
                f"  {row.role} {row.claim}{where}: {row.statistic} {row.estimate:+.3g} [{row.ci_low:+.3g}, "
                f"{row.ci_high:+.3g}]{judged}"
            )
    return "\n".join(lines)
