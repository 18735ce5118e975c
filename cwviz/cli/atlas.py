"""``cwviz atlas``: every head's statistics pooled over N prompts with bootstrap intervals
(:mod:`cwviz.analyses.atlas`), saved in a folder that ``--load`` (and the Atlas page) reads back without a forward
pass."""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from ..analyses import atlas, sweep
from ..analyses.codecs.sweeps import ATLAS
from ..analyses.schema import ATLAS_METRICS
from ..core.defaults import ATLAS_CONFIDENCE, DEFAULT_SINK
from ..core.loading.provenance import model_provenance
from ..core.util.errors import InputError
from ..core.util.progress import cli_bar
from ..core.util.texts import read_texts
from . import outputs
from .common import (
    check_resume,
    jsonl_path,
    load,
    report_interrupt,
    run_manifest,
    sweep_processes,
)


def run(args: argparse.Namespace) -> int:
    atlas.check_bootstrap(args.bootstrap, name="--bootstrap")  # before anything is read or loaded
    atlas.check_confidence(args.confidence, name="--confidence")
    atlas.check_seed(args.seed, name="--seed")  # as faithfulness and claims do: never after the sweep, in the bootstrap
    if args.top < 1:
        raise InputError(f"--top must be at least 1, not {args.top}")
    outputs.check_folder(args.out, "--out")  # before anything is read or loaded
    if args.load is not None:
        if args.results is not None or args.resume:
            raise InputError("--load reads a finished atlas; --results and --resume run one (give --jsonl or --gsm8k)")
        result = atlas.load(args.load)  # checked whole: a cut or edited folder is refused, never printed in part
        if args.out is not None:
            # --out with --load: a copy of the checked results, written before anything prints
            atlas.save(result, args.out)
        print(f"loaded {args.load}: {result.manifest.get('model')}, {len(result.prompts)} prompt(s)")
        _print(result, args.top)
        if args.out is not None:
            print(f"wrote {args.out}")
        return 0
    check_resume(args)
    texts = read_texts(jsonl_path(args), n=args.n, field=args.field)  # before any model loads: a bad file fails fast
    if args.results is not None:
        sweep.check_folder(args.results)
    outputs.check_folder(args.results, "--results")
    procs = sweep_processes(args)
    if args.results is None:
        return run_sweep(args, texts, procs)  # in memory
    with sweep.owned(args.results, procs):  # before the model loads: a busy folder is refused at once
        return run_sweep(args, texts, procs)


def run_sweep(args: argparse.Namespace, texts: list[str], procs) -> int:
    """The prompts through the sweep runner (:func:`cwviz.analyses.sweep.run`), each prompt's statistics recorded as
    it finishes (with ``--results DIR``, into DIR); the main process pools every record, prints the top heads and
    saves the atlas into ``--out`` and DIR (which ``--load`` and the Atlas page read)."""
    bundle = load(args)
    # before any forward pass
    atlas.check_bootstrap(args.bootstrap, len(texts), bundle.info.layers * bundle.info.heads, "--bootstrap")
    provenance = model_provenance(bundle)
    settings = ATLAS.settings(DEFAULT_SINK, provenance)
    plan = sweep.Sweep(
        ATLAS,
        settings,
        texts,
        args.results,
        None if args.results is None else manifest(args, provenance, settings, len(texts), procs.count),
    )

    def compute(index: int) -> dict:
        with cli_bar(
            f"prompt {index + 1} of {len(texts)}", unit="layer step", enabled=procs.is_main and sys.stderr.isatty()
        ) as progress:
            (frame,) = atlas.iter_prompt_stats(bundle, [texts[index]], progress=progress, start=index)
        return ATLAS.encode(frame)

    outcome = sweep.run(plan, compute, procs, resume=args.resume)
    if not outcome.is_main:
        return 130 if outcome.interrupted else 0
    if not outcome.records:
        return report_interrupt(0, len(texts), "prompt")
    finished = [texts[r["example"]] for r in outcome.records]
    per_prompt = ATLAS.decode(outcome.records)
    result = atlas.build(per_prompt, finished, bundle.info.id, args.bootstrap, args.confidence, args.seed)
    if args.results is not None:
        atlas.save(result, args.results)  # the results folder is a saved atlas too: --load and the Atlas page read it
    _report(result, per_prompt, args)
    if args.results is not None:
        print(f"wrote {args.results}")
    if outcome.interrupted:
        return report_interrupt(len(finished), len(texts), "prompt", args.results or args.out)
    return 0


def manifest(args: argparse.Namespace, provenance: dict, settings: dict, prompts: int, count: int) -> dict:
    """How the atlas was made (``DIR/manifest.json``)."""
    data = {"jsonl": str(jsonl_path(args)), "n": args.n, "field": args.field}
    data = {k: v for k, v in data.items() if v is not None} | {"prompts": prompts}
    fields = {
        "sink": DEFAULT_SINK,
        "bootstrap": args.bootstrap,
        "confidence": args.confidence,
        "seed": args.seed,
        "data": data,
    }
    return run_manifest(args, ATLAS, settings, provenance, count, **fields)


def _report(result, per_prompt: pd.DataFrame, args: argparse.Namespace) -> None:
    """Save the atlas into --out when given, then print its top heads (files first: a reader that leaves early,
    ``| head -1``, loses none)."""
    if args.out is not None:
        atlas.save(result, args.out)
    tokens = int(per_prompt.groupby("prompt")["tokens"].first().sum())
    print(
        f"model: {result.manifest['model']}; prompts: {len(result.prompts)} ({tokens:,} tokens) from "
        f"{args.jsonl or 'the GSM8K sample'}"
    )
    _print(result, args.top)
    if args.out is not None:
        print(f"wrote {args.out}")


def _print(result, top: int) -> None:
    pooled = result.pooled
    level = result.manifest.get("confidence", ATLAS_CONFIDENCE)
    print(
        f"means over prompts with {level:.0%} bootstrap intervals ({result.manifest.get('bootstrap')} resamples); "
        "sink: the first token"
    )
    for metric, label in ATLAS_METRICS.items():
        end = atlas.strongest(metric)
        rows = pooled.dropna(subset=[metric]).sort_values(metric, ascending=end == "low", kind="stable").head(top)
        print(f"\n{label} ({'lowest' if end == 'low' else 'highest'} first):")
        for row in rows.itertuples(index=False):
            low, high = getattr(row, f"{metric}_low"), getattr(row, f"{metric}_high")
            print(f"  layer {row.layer:>3} head {row.head:>3}  {getattr(row, metric):+.4f}  [{low:+.4f}, {high:+.4f}]")
