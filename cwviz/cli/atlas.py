"""``cwviz atlas``: every head's statistics pooled over N prompts with bootstrap intervals (:mod:`cwviz.analyses.atlas`),
saved in a folder that ``--load`` (and the Atlas page) reads back without a forward pass."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ..analyses.schema import ATLAS_METRICS
from ..core.errors import InputError
from .common import add_jsonl_args, add_model_args, jsonl_path, report_interrupt

#: Heads listed per statistic.
TOP = 5


def register(sub: argparse._SubParsersAction) -> None:
    from ..analyses import atlas as A

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
    parser.add_argument("--n", type=int, help="only the first N prompts")
    parser.add_argument("--field", help="read the prompt from this field")
    parser.add_argument("--out", type=Path, help="write the results folder here (per_prompt.csv, pooled.csv, prompts.jsonl, atlas.json)")
    parser.add_argument("--bootstrap", type=int, default=A.BOOTSTRAP, help=f"bootstrap resamples of the prompts (default {A.BOOTSTRAP})")
    parser.add_argument("--confidence", type=float, default=A.CONFIDENCE, help=f"the intervals' coverage (default {A.CONFIDENCE})")
    parser.add_argument("--seed", type=int, default=A.SEED, help=f"the bootstrap's seed (default {A.SEED})")
    parser.add_argument("--top", type=int, default=TOP, help=f"heads listed per statistic (default {TOP})")
    add_model_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..analyses import atlas
    from ..core.models import load_model
    from ..core.progress import cli_bar
    from ..core.texts import read_texts

    if args.bootstrap < 1:
        raise InputError(f"--bootstrap must be at least 1, not {args.bootstrap}")
    if not 0 < args.confidence < 1:
        raise InputError(f"--confidence must lie between 0 and 1, not {args.confidence}")
    if args.load is not None:
        result = atlas.load(args.load)
        print(f"loaded {args.load}: {result.manifest.get('model')}, {len(result.prompts)} prompt(s)")
        _print(result, args.top)
        return 0
    path = jsonl_path(args)
    texts = read_texts(path, n=args.n, field=args.field)  # before any model loads: a bad file fails fast
    bundle = load_model(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    frames = []
    try:
        with cli_bar("atlas", unit="layer step", enabled=sys.stderr.isatty()) as progress:
            for frame in atlas.iter_prompt_stats(bundle, texts, progress=progress):
                frames.append(frame)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (cwviz.cli.main): keep, print and write the finished prompts
        if not frames:
            return report_interrupt(0, len(texts), "prompt")
        _finish(atlas, frames, texts, bundle.info.id, args)
        return report_interrupt(len(frames), len(texts), "prompt", args.out)
    _finish(atlas, frames, texts, bundle.info.id, args)
    return 0


def _finish(atlas, frames: list[pd.DataFrame], texts: list[str], model: str, args: argparse.Namespace):
    result = atlas.build(pd.concat(frames, ignore_index=True), texts[: len(frames)], model, args.bootstrap, args.confidence, args.seed)
    print(
        f"model: {model}; prompts: {len(frames)} ({int(sum(f['tokens'].iloc[0] for f in frames)):,} tokens) from {args.jsonl or 'the GSM8K sample'}"
    )
    _print(result, args.top)
    if args.out is not None:
        atlas.save(result, args.out)
        print(f"wrote {args.out}")
    return result


def _print(result, top: int) -> None:
    from ..analyses import atlas

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
