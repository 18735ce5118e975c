"""``python -m cwviz sinks``: attention sinks per layer (docs/METHOD.md section 4), for one prompt or a JSONL file."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..analyses import records, sink_interventions, sinks, sweep
from ..analyses.codecs.sweeps import SINKS
from ..core.loading.provenance import model_provenance
from ..core.method.analysis import analyze
from ..core.util.errors import CwvizError, InputError
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

log = logging.getLogger(__name__)


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts: one from --text/--file, or the JSONL file's (first --n)."""

    path = jsonl_path(args)
    if path is None:
        if args.n is not None or args.field is not None:
            raise InputError("--n and --field apply to --jsonl only; give the prompts with --jsonl FILE or --gsm8k")
        return [read_text(args)]
    args.jsonl = path  # named in per-prompt messages
    return read_texts(path, n=args.n, field=args.field)


def run(args: argparse.Namespace) -> int:
    try:
        sink_interventions.check_factor(args.factor)
    except InputError as err:
        raise InputError(f"--factor: {err}") from None
    check_resume(args)
    texts = read_prompts(args)
    if args.results is not None:
        sweep.check_folder(args.results)
    outputs.check_folder(args.results, "--results")
    outputs.check_file(args.csv, "--csv", "sinks.csv")
    procs = sweep_processes(args)
    if args.results is None:
        return run_sweep(args, texts, procs)  # in memory
    with sweep.owned(args.results / RESULTS_FOLDER, procs):  # before the model loads: a busy folder is refused at once
        return run_sweep(args, texts, procs)


@dataclass(frozen=True)
class Prompt:
    """One prompt's results: its sink table, the sink, its tokens, and with ΔPPL the perplexities with the sink's value
    scaled in each layer, then in all (``ppl``, [layers + 1]), and the clean one."""

    table: pd.DataFrame
    sink: int
    tokens: tuple[str, ...]
    ppl: np.ndarray | None = None
    clean: float | None = None


def measure(args: argparse.Namespace, bundle, text: str, index: int, total: int) -> Prompt:
    """Prompt ``index`` (of ``total``): its analysis, sink table and, unless --no-ppl, the sink-removal perplexities."""
    try:
        with cli_bar(f"prompt {index + 1} of {total}", enabled=sys.stderr.isatty()) as progress:
            analysis = analyze(bundle, text, progress=progress)
        sink = sinks.resolve_sink(analysis, args.sink)
        if not args.no_ppl and bundle.arch.causal and analysis.num_tokens < 2:
            raise InputError(
                "perplexity needs at least two tokens; give a longer prompt, or add --no-ppl to skip the ΔPPL runs"
            )
    except CwvizError as err:
        where = f"prompt {index + 1} of {args.jsonl}: " if args.jsonl is not None else ""
        raise type(err)(f"{where}{err}") from None
    log.info("prompt %d/%d: %d tokens, sink %d", index + 1, total, analysis.num_tokens, sink)
    with cli_bar("sink table", enabled=sys.stderr.isatty()) as progress:
        table = sinks.sink_table(analysis, sink, progress=progress)
    if args.no_ppl or not bundle.arch.causal:
        return Prompt(table, sink, tuple(analysis.tokens))
    layer_sets = [[layer] for layer in range(analysis.num_layers)] + [None]
    with cli_bar("sink removal", unit="pass", enabled=sys.stderr.isatty()) as progress:
        ppl = sink_interventions.removal_perplexity(analysis, layer_sets, sink, args.factor, progress=progress)
    return Prompt(table, sink, tuple(analysis.tokens), ppl, analysis.perplexity)


def run_sweep(args: argparse.Namespace, texts: list[str], procs) -> int:
    """The prompts through the sweep runner (:func:`cwviz.analyses.sweep.run`): in memory, or with ``--results DIR``
    into ``DIR/sinks``, each prompt's record appended as it finishes; the tables are then made from every record."""
    bundle = load(args)
    provenance = model_provenance(bundle)
    settings = SINKS.settings(args.sink, args.factor, not args.no_ppl and bundle.arch.causal, provenance)
    folder = None if args.results is None else args.results / RESULTS_FOLDER
    made = None if folder is None else manifest(args, provenance, settings, len(texts), procs.count)
    plan = sweep.Sweep(SINKS, settings, texts, folder, made)

    def compute(index: int) -> dict:
        prompt = measure(args, bundle, texts[index], index, len(texts))
        return SINKS.encode(prompt.table, prompt.sink, prompt.tokens, prompt.ppl, prompt.clean)

    outcome = sweep.run(plan, compute, procs, resume=args.resume)
    if not outcome.is_main:
        return 130 if outcome.interrupted else 0
    if not outcome.records:
        return report_interrupt(0, len(texts), "prompt")
    prompts = [
        Prompt(
            SINKS.decode(r),
            r["sink"],
            tuple(r["tokens"]),
            None if r["ppl"] is None else np.array(r["ppl"]),
            r["ppl_clean"],
        )
        for r in outcome.records
    ]
    return finish(args, bundle, prompts, len(texts), interrupted=outcome.interrupted, made=made)


def finish(
    args: argparse.Namespace,
    bundle,
    prompts: list[Prompt],
    total: int,
    interrupted: bool = False,
    made: dict | None = None,
) -> int:
    """Pool the prompts' tables, write the files asked for, print the per-layer table; the exit status."""
    info = bundle.info
    finished = len(prompts)
    table = sinks.pool_tables([p.table for p in prompts])
    summary = sinks.sink_layer_summary(table)
    positions = [(p.sink, p.tokens[p.sink]) for p in prompts]
    measured = [p for p in prompts if p.ppl is not None]
    ppl = clean = None
    if measured:
        ppl = np.stack([p.ppl for p in measured])  # (prompt, layer + 1): per layer, then all layers
        clean = np.array([p.clean for p in measured])
        summary["delta_ppl"] = (ppl[:, :-1] - clean[:, None]).mean(0)
    # The files first, then the printout: a reader that stops early (`| head`) loses no file (cwviz.cli.main).
    written = []
    if args.csv is not None:
        outputs.write(args.csv, outputs.csv_text(table, float_format=None))
        written.append(f"wrote {args.csv} ({len(table):,} rows)")
    if args.results is not None:
        folder = write_results(args, table, summary, _describe_sinks(positions, args.sink), finished, made)
        written.append(f"wrote {folder} (add it to a report: cwviz report --results {args.results})")

    print(
        f"model: {info.id} ({info.architecture}, {info.layers} layers x {info.heads} heads, {info.device} {info.dtype})"
    )
    print(
        f"prompts: {finished} ({sum(len(p.tokens) for p in prompts):,} tokens); sink: "
        f"{_describe_sinks(positions, args.sink)}"
    )
    print(
        "means over heads and the queries that see another key; attention share: mean over heads, "
        "contribution share: inter-head, summed over heads"
        + (
            "; learned_sink: the model's learned sink's share of attention (it writes nothing), mean over heads"
            if (summary.get("learned_sink_share", pd.Series(dtype=float)) > 0).any()
            else ""
        )
    )
    if ppl is not None:
        print(f"dPPL: sink value x{args.factor:g} in that layer only, mean over prompts")
    print(_format(summary))
    if ppl is not None:
        removed_all = ppl[:, -1]
        raised = sink_interventions.raised_ppl(removed_all, clean)
        print(
            f"all layers, sink value x{args.factor:g}: PPL {clean.mean():.3f} -> {removed_all.mean():.3f} "
            f"(dPPL {np.mean(removed_all - clean):+.3f}, mean over prompts); raised PPL by more than "
            f"{sink_interventions.PPL_TOLERANCE:.1%} of the clean PPL on {raised} of {len(clean)} prompt(s)"
        )
    elif not bundle.arch.causal:
        print("no dPPL: perplexity is defined for causal language models only")
    for line in written:
        print(line)
    if interrupted:
        return report_interrupt(
            finished, total, "prompt", args.results / RESULTS_FOLDER if args.results is not None else args.csv
        )
    return 0


#: Where ``--results DIR`` puts the sinks tables: ``DIR/sinks/``.
RESULTS_FOLDER = "sinks"


def manifest(args: argparse.Namespace, provenance: dict, settings: dict, prompts: int, count: int) -> dict:
    """How the sinks were made (``DIR/sinks/manifest.json``; the report shows it); :func:`write_results` adds the
    sinks found and the prompts counted."""
    data = {
        "jsonl": str(args.jsonl) if args.jsonl else None,
        "file": str(args.file) if args.file else None,
        "n": args.n,
    }
    # the records' example indices lie below it
    data = {k: v for k, v in data.items() if v is not None} | {"prompts": prompts}
    return run_manifest(args, SINKS, settings, provenance, count, sink=str(args.sink), factor=args.factor, data=data)


def write_results(
    args: argparse.Namespace, table: pd.DataFrame, layers: pd.DataFrame, sink: str, prompts: int, made: dict
) -> Path:
    """The per-layer and per-head tables in ``DIR/sinks``, and its manifest completed with the sinks found and the
    prompts counted (each file replaced whole)."""

    folder = args.results / RESULTS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "layers.csv": outputs.csv_text(layers),
        "heads.csv": outputs.csv_text(sinks.sink_head_summary(table)),
    }
    # The manifest names each table's sha256: the report refuses a table edited, cut or copied from another run.
    made = made | {"sink": sink, "prompts": prompts, "files": records.file_sums(files)}
    files["manifest.json"] = json.dumps(made, indent=2, sort_keys=True, default=str) + "\n"
    for name, text in files.items():
        outputs.write(folder / name, text)
    return folder


def _describe_sinks(positions: list[tuple[int, str]], asked: str) -> str:
    chosen = sorted({p for p, _ in positions})
    if len(chosen) == 1:
        token = positions[0][1] if len(positions) == 1 else None
        where = f"position {chosen[0]}" + (f" {token!r}" if token is not None else "")
    else:
        counts = pd.Series([p for p, _ in positions]).value_counts()
        where = "positions " + ", ".join(f"{p} ({n} prompts)" for p, n in counts.items())
    return (
        f"{where} ({'detected: largest mean attention received' if str(asked).strip().lower() == 'auto' else 'chosen'})"
    )


def _format(summary: pd.DataFrame) -> str:
    columns = {
        "layer": ("layer", "{:d}"),
        "sink_ratio": ("sink_ratio", "{:.3f}"),
        "cos_sink_rest": ("cos(v_sink,m)", "{:+.3f}"),
        "negative_cos_share": ("cos<0", "{:.2f}"),
        "sink_contribution_share": ("contrib_share", "{:+.3f}"),
        "learned_sink_share": ("learned_sink", "{:.3f}"),
        "delta_ppl": ("dPPL", "{:+.3f}"),
    }
    # The learned sink's column only for a model that has one (gpt-oss): everywhere else it is 0.
    shown = [c for c in columns if c in summary.columns and (c != "learned_sink_share" or (summary[c] > 0).any())]
    header = "  ".join(f"{columns[c][0]:>13}" if c != "layer" else f"{'layer':>5}" for c in shown)
    lines = [header]
    for row in summary.itertuples(index=False):
        cells = []
        for c in shown:
            value = getattr(row, c)
            text = columns[c][1].format(int(value) if c == "layer" else value)
            cells.append(f"{text:>5}" if c == "layer" else f"{text:>13}")
        lines.append("  ".join(cells))
    return "\n".join(lines)
