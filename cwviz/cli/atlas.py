"""``cwviz atlas``: every head's statistics pooled over N prompts with bootstrap intervals (:mod:`cwviz.analyses.atlas`),
saved in a folder that ``--load`` (and the Atlas page) reads back without a forward pass."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ..analyses.schema import ATLAS_METRICS
from ..core.util.errors import InputError
from .common import (
    add_jsonl_args,
    add_model_args,
    add_sweep_args,
    check_resume,
    how_run,
    jsonl_path,
    launched_command,
    load,
    report_interrupt,
    sweep_processes,
)

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
    parser.add_argument("--bootstrap", type=int, default=A.BOOTSTRAP, help=f"bootstrap resamples of the prompts (default {A.BOOTSTRAP})")
    parser.add_argument("--confidence", type=float, default=A.CONFIDENCE, help=f"the intervals' coverage (default {A.CONFIDENCE})")
    parser.add_argument("--seed", type=int, default=A.SEED, help=f"the bootstrap's seed (default {A.SEED})")
    parser.add_argument("--top", type=int, default=TOP, help=f"heads listed per statistic (default {TOP})")
    add_model_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..analyses import atlas, sweep
    from ..core.util.progress import cli_bar
    from ..core.util.texts import read_texts

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
    path = jsonl_path(args)
    texts = read_texts(path, n=args.n, field=args.field)  # before any model loads: a bad file fails fast
    if args.results is not None:
        sweep.check_folder(args.results)
    procs = sweep_processes(args)
    if args.results is not None:
        with sweep.owned(args.results, procs):  # before the model loads: a busy folder is refused at once
            return run_sweep(args, texts, procs)
    bundle = load(args)
    atlas.check_bootstrap(args.bootstrap, len(texts), bundle.info.layers * bundle.info.heads, "--bootstrap")  # before any forward pass
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


def run_sweep(args: argparse.Namespace, texts: list[str], procs) -> int:
    """``--results DIR``: the prompts through the sweep runner (:func:`cwviz.analyses.sweep.run`), each prompt's
    statistics recorded as it finishes; the main process pools every record and saves the atlas into DIR too."""
    from ..analyses import atlas, sweep
    from ..analyses import records as R
    from ..analyses.sinks import DEFAULT_SINK
    from ..core.util.parallel import model_provenance
    from ..core.util.progress import cli_bar

    bundle = load(args)
    atlas.check_bootstrap(args.bootstrap, len(texts), bundle.info.layers * bundle.info.heads, "--bootstrap")  # before any forward pass
    provenance = model_provenance(bundle)
    settings = {"sink": DEFAULT_SINK, "model": sweep.model_settings(provenance)}  # the bootstrap pools; it decides no record
    data = {"jsonl": str(jsonl_path(args)), "n": args.n, "field": args.field}
    made = {
        "schema": "cwviz.atlas.manifest",
        "fingerprint": R.fingerprint(settings),
        "model": provenance,
        "sink": DEFAULT_SINK,
        "bootstrap": args.bootstrap,
        "confidence": args.confidence,
        "seed": args.seed,
        "data": {k: v for k, v in data.items() if v is not None} | {"prompts": len(texts)},
        "processes": procs.count,
        **launched_command(how_run(args), procs.count),
    }
    plan = sweep.Sweep(sweep.ATLAS, args.results, settings, texts, made)

    def compute(index: int) -> dict:
        with cli_bar(f"prompt {index + 1} of {len(texts)}", unit="layer step", enabled=procs.is_main and sys.stderr.isatty()) as progress:
            (frame,) = atlas.iter_prompt_stats(bundle, [texts[index]], progress=progress, start=index)
        return sweep.atlas_payload(frame)

    outcome = sweep.run(plan, compute, procs, resume=args.resume)
    if not outcome.is_main:
        return 130 if outcome.interrupted else 0
    if not outcome.records:
        return report_interrupt(0, len(texts), "prompt")
    finished = [texts[r["example"]] for r in outcome.records]
    per_prompt = sweep.atlas_per_prompt(outcome.records)
    result = atlas.build(per_prompt, finished, bundle.info.id, args.bootstrap, args.confidence, args.seed)
    atlas.save(result, args.results)  # the results folder is a saved atlas too: --load and the Atlas page read it
    _report(result, per_prompt, args)
    print(f"wrote {args.results}")
    if outcome.interrupted:
        return report_interrupt(len(finished), len(texts), "prompt", args.results)
    return 0


def _finish(atlas, frames: list[pd.DataFrame], texts: list[str], model: str, args: argparse.Namespace):
    per_prompt = pd.concat(frames, ignore_index=True)
    result = atlas.build(per_prompt, texts[: len(frames)], model, args.bootstrap, args.confidence, args.seed)
    _report(result, per_prompt, args)
    return result


def _report(result, per_prompt: pd.DataFrame, args: argparse.Namespace) -> None:
    """Print the atlas's top heads, and save it into --out when given."""
    tokens = int(per_prompt.groupby("prompt")["tokens"].first().sum())
    print(f"model: {result.manifest['model']}; prompts: {len(result.prompts)} ({tokens:,} tokens) from {args.jsonl or 'the GSM8K sample'}")
    _print(result, args.top)
    if args.out is not None:
        from ..analyses import atlas

        atlas.save(result, args.out)
        print(f"wrote {args.out}")


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
