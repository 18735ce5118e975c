"""``cwviz atlas``: every head's statistics pooled over N prompts with bootstrap intervals (:mod:`cwviz.analyses.atlas`),
saved in a folder that ``--load`` (and the Atlas page) reads back without a forward pass."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ..analyses import atlas, records, sweep
from ..analyses.codecs import ATLAS
from ..analyses.schema import ATLAS_METRICS
from ..analyses.sinks import DEFAULT_SINK
from ..core.errors import InputError
from ..core.parallel import model_provenance
from ..core.progress import cli_bar
from ..core.texts import read_texts
from .common import (
    add_jsonl_args,
    add_model_args,
    add_sweep_args,
    check_resume,
    jsonl_path,
    load,
    report_interrupt,
    run_manifest,
    sweep_processes,
)

#: Heads listed per statistic.
TOP = 5


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "atlas",
        help="every head's sink shares, cos(v_sink, m), divergence, negative share and output norm pooled over N prompts",
        description=(
            "For every (layer, head), statistics of each prompt (one forward pass each; means over its queries 1..T-1) "
            "pooled over the prompts with percentile bootstrap intervals: the sink's share under attention and under "
            "intra-head contribution, mean cos(v_sink, m), the divergence of attention and contribution rows, the share "
            "of negative contribution mass and the head output norm. The sink is the first token."
        ),
    )
    group = parser.add_mutually_exclusive_group(required=True)
    add_jsonl_args(group, "a JSON Lines file: one prompt a line ('text', or GSM8K's 'question' + 'answer')")
    group.add_argument("--load", type=Path, help="a results folder written by --out: print it again, no model is loaded")
    parser.add_argument(
        "--n",
        "--examples",
        dest="n",
        type=int,
        help="only the first N prompts (under torchrun or accelerate launch write --examples: their parsers take --n)",
    )
    parser.add_argument("--field", help="read the prompt from this field")
    parser.add_argument("--out", type=Path, help="write the results folder here (per_prompt.csv, pooled.csv, prompts.jsonl, atlas.json)")
    add_sweep_args(
        parser,
        "results folder: per-prompt records, manifest.json and the atlas files of --out (the Atlas page and --load read it)",
    )
    parser.add_argument(
        "--bootstrap", type=int, default=atlas.BOOTSTRAP, help=f"bootstrap resamples of the prompts (default {atlas.BOOTSTRAP})"
    )
    parser.add_argument("--confidence", type=float, default=atlas.CONFIDENCE, help=f"the intervals' coverage (default {atlas.CONFIDENCE})")
    parser.add_argument("--seed", type=int, default=atlas.SEED, help=f"the bootstrap's seed (default {atlas.SEED})")
    parser.add_argument("--top", type=int, default=TOP, help=f"heads listed per statistic (default {TOP})")
    add_model_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    atlas.check_bootstrap(args.bootstrap, name="--bootstrap")  # before anything is read or loaded
    atlas.check_confidence(args.confidence, name="--confidence")
    if args.top < 1:
        raise InputError(f"--top must be at least 1, not {args.top}")
    if args.load is not None:
        if args.results is not None or args.resume:
            raise InputError("--load reads a finished atlas; --results and --resume run one (give --jsonl or --gsm8k)")
        result = atlas.load(args.load)  # checked whole: a cut or edited folder is refused, never printed in part
        print(f"loaded {args.load}: {result.manifest.get('model')}, {len(result.prompts)} prompt(s)")
        _print(result, args.top)
        if args.out is not None:
            atlas.save(result, args.out)  # --out with --load: a copy of the checked results
            print(f"wrote {args.out}")
        return 0
    check_resume(args)
    texts = read_texts(jsonl_path(args), n=args.n, field=args.field)  # before any model loads: a bad file fails fast
    if args.results is not None:
        sweep.check_folder(args.results)
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
    atlas.check_bootstrap(args.bootstrap, len(texts), bundle.info.layers * bundle.info.heads, "--bootstrap")  # before any forward pass
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
        with cli_bar(f"prompt {index + 1} of {len(texts)}", unit="layer step", enabled=procs.is_main and sys.stderr.isatty()) as progress:
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
    fields = {"sink": DEFAULT_SINK, "bootstrap": args.bootstrap, "confidence": args.confidence, "seed": args.seed, "data": data}
    return run_manifest(args, ATLAS, records.fingerprint(settings), provenance, count, **fields)


def _report(result, per_prompt: pd.DataFrame, args: argparse.Namespace) -> None:
    """Print the atlas's top heads, and save it into --out when given."""
    tokens = int(per_prompt.groupby("prompt")["tokens"].first().sum())
    print(f"model: {result.manifest['model']}; prompts: {len(result.prompts)} ({tokens:,} tokens) from {args.jsonl or 'the GSM8K sample'}")
    _print(result, args.top)
    if args.out is not None:
        atlas.save(result, args.out)
        print(f"wrote {args.out}")


def _print(result, top: int) -> None:
    pooled = result.pooled
    level = result.manifest.get("confidence", atlas.CONFIDENCE)
    print(f"means over prompts with {level:.0%} bootstrap intervals ({result.manifest.get('bootstrap')} resamples); sink: the first token")
    for metric, label in ATLAS_METRICS.items():
        end = atlas.strongest(metric)
        rows = pooled.dropna(subset=[metric]).sort_values(metric, ascending=end == "low", kind="stable").head(top)
        print(f"\n{label} ({'lowest' if end == 'low' else 'highest'} first):")
        for row in rows.itertuples(index=False):
            low, high = getattr(row, f"{metric}_low"), getattr(row, f"{metric}_high")
            print(f"  layer {row.layer:>3} head {row.head:>3}  {getattr(row, metric):+.4f}  [{low:+.4f}, {high:+.4f}]")
