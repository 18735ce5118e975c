"""``python -m cwviz sinks``: attention sinks per layer (docs/METHOD.md section 4), for one prompt or a JSONL file."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import CwvizError, InputError
from ..core.texts import write_text_atomic
from .common import add_jsonl_args, add_model_args, add_text_args, check_output_file, jsonl_path, load, read_text, report_interrupt

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    from ..analyses import sinks as S

    parser = sub.add_parser(
        "sinks",
        help="attention sinks per layer: sink ratio, anti-alignment, attention vs contribution share, ΔPPL",
        description=(
            "Per layer: the mean sink ratio (attention on the sink), the mean cos(ṽ_sink, m) between the "
            "sink's projected value and the mean of the other keys' (negative: the sink subtracts the "
            "semantic direction), the sink's share under attention and under contribution weights, and the "
            "change in perplexity when the sink's value is scaled by --factor (0 removes it) in that layer only."
        ),
    )
    group = add_text_args(parser)
    add_jsonl_args(group, "a JSON Lines file: one prompt a line ('text', or GSM8K's 'question' + 'answer')")
    parser.add_argument("--n", type=int, help="with --jsonl: only the first N prompts")
    parser.add_argument("--field", help="with --jsonl: read the prompt from this field")
    parser.add_argument(
        "--sink",
        default=str(S.DEFAULT_SINK),
        help=(
            f"the sink: a token position (default {S.DEFAULT_SINK}, the first token; negative counts from the end, so -1 is "
            f"the last, BERT's [SEP]) or '{S.AUTO}' (the key with the largest mean attention)"
        ),
    )
    parser.add_argument(
        "--factor",
        type=float,
        default=S.DEFAULT_FACTOR,
        help=f"λ for the ΔPPL runs: the sink's value is multiplied by it (default {S.DEFAULT_FACTOR:g}: removed)",
    )
    parser.add_argument("--no-ppl", action="store_true", help="skip the ΔPPL runs (one forward pass per layer and prompt, batched)")
    parser.add_argument("--csv", type=Path, help="write the full table (one row per prompt, layer, head and query) here")
    parser.add_argument(
        "--results",
        type=Path,
        help="a results folder (e.g. a faithfulness sweep's): writes sinks/layers.csv, sinks/heads.csv and sinks/manifest.json "
        "there, which `cwviz report --results DIR` adds to the report",
    )
    add_model_args(parser)
    parser.set_defaults(func=run)


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts: one from --text/--file, or the JSONL file's (first --n)."""
    from ..core.texts import read_texts

    path = jsonl_path(args)
    if path is None:
        if args.n is not None or args.field is not None:
            raise InputError("--n and --field apply to --jsonl only; give the prompts with --jsonl FILE or --gsm8k")
        return [read_text(args)]
    args.jsonl = path  # named in per-prompt messages
    return read_texts(path, n=args.n, field=args.field)


def run(args: argparse.Namespace) -> int:
    from ..analyses import sinks
    from ..core.analysis import analyze
    from ..core.progress import cli_bar

    if not math.isfinite(args.factor):
        raise InputError(f"--factor must be a finite number, not {args.factor}")
    texts = read_prompts(args)
    if args.results is not None and not args.results.parent.is_dir():
        raise InputError(f"no folder {args.results.parent} for --results; create it first")
    check_output_file(args.csv, "--csv", "sinks.csv")
    bundle = load(args)
    info = bundle.info
    tables, removal, positions, tokens, clean = [], [], [], [], []
    interrupted = False
    try:
        for index, text in enumerate(texts):
            try:
                with cli_bar(f"prompt {index + 1} of {len(texts)}", enabled=sys.stderr.isatty()) as progress:
                    analysis = analyze(bundle, text, progress=progress)
                sink = sinks.resolve_sink(analysis, args.sink)
                if not args.no_ppl and bundle.arch.causal and analysis.num_tokens < 2:
                    raise InputError("perplexity needs at least two tokens; give a longer prompt, or add --no-ppl to skip the ΔPPL runs")
            except CwvizError as err:
                where = f"prompt {index + 1} of {args.jsonl}: " if args.jsonl is not None else ""
                raise type(err)(f"{where}{err}") from None
            log.info("prompt %d/%d: %d tokens, sink %d", index + 1, len(texts), analysis.num_tokens, sink)
            with cli_bar("sink table", enabled=sys.stderr.isatty()) as progress:
                table = sinks.sink_table(analysis, sink, progress=progress)
            ppl = None
            if not args.no_ppl and bundle.arch.causal:
                layer_sets = [[layer] for layer in range(analysis.num_layers)] + [None]
                with cli_bar("sink removal", unit="pass", enabled=sys.stderr.isatty()) as progress:
                    ppl = sinks.removal_perplexity(analysis, layer_sets, sink, args.factor, progress=progress)
            # A prompt counts once all of its results are in: an interrupt never leaves half of one.
            tables.append(table)
            positions.append((sink, analysis.tokens[sink]))
            tokens.append(analysis.num_tokens)
            if ppl is not None:
                removal.append(ppl)
                clean.append(analysis.perplexity)
            del analysis
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (cwviz.cli.main): report the finished prompts
        interrupted = True
        if not tables:
            return report_interrupt(0, len(texts), "prompt")
    finished = len(tables)
    table = sinks.pool_tables(tables)
    summary = sinks.sink_layer_summary(table)
    ppl = None
    if removal:
        ppl = np.stack(removal)  # (prompt, layer + 1): per layer, then all layers
        summary["delta_ppl"] = (ppl[:, :-1] - np.array(clean)[:, None]).mean(0)
    # The files first, then the printout: a reader that stops early (`| head`) loses no file (cwviz.cli.main).
    written = []
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
        written.append(f"wrote {args.csv} ({len(table):,} rows)")
    if args.results is not None:
        folder = write_results(args, bundle, table, summary, _describe_sinks(positions, args.sink), finished)
        written.append(f"wrote {folder} (add it to a report: cwviz report --results {args.results})")

    print(f"model: {info.id} ({info.architecture}, {info.layers} layers x {info.heads} heads, {info.device} {info.dtype})")
    print(f"prompts: {finished} ({sum(tokens):,} tokens); sink: {_describe_sinks(positions, args.sink)}")
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
        clean_all, removed_all = np.array(clean), ppl[:, -1]
        raised = int((removed_all > clean_all).sum())
        print(
            f"all layers, sink value x{args.factor:g}: PPL {clean_all.mean():.3f} -> {removed_all.mean():.3f} "
            f"(dPPL {np.mean(removed_all - clean_all):+.3f}, mean over prompts); raised PPL on {raised} of {len(clean)} prompt(s)"
        )
    elif not bundle.arch.causal:
        print("no dPPL: perplexity is defined for causal language models only")
    for line in written:
        print(line)
    if interrupted:
        return report_interrupt(finished, len(texts), "prompt", args.csv)
    return 0


#: Where ``--results DIR`` puts the sinks tables: ``DIR/sinks/``.
RESULTS_FOLDER = "sinks"


def write_results(args: argparse.Namespace, bundle, table: pd.DataFrame, layers: pd.DataFrame, sink: str, prompts: int) -> Path:
    """The per-layer and per-head tables and a manifest in ``DIR/sinks`` (each file replaced whole)."""
    import json

    from ..analyses import sinks
    from ..core.parallel import model_provenance
    from .common import how_run

    folder = args.results / RESULTS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    data = {"jsonl": str(args.jsonl) if args.jsonl else None, "file": str(args.file) if args.file else None, "n": args.n}
    manifest = {
        "schema": "cwviz.sinks.manifest",
        "model": model_provenance(bundle),
        "sink": sink,
        "factor": args.factor,
        "prompts": prompts,
        "data": {k: v for k, v in data.items() if v is not None},
        **how_run(args),
    }
    files = {
        "layers.csv": layers.to_csv(index=False, float_format="%.6g"),
        "heads.csv": sinks.sink_head_summary(table).to_csv(index=False, float_format="%.6g"),
        "manifest.json": json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n",
    }
    for name, text in files.items():
        write_text_atomic(folder / name, text)
    return folder


def _describe_sinks(positions: list[tuple[int, str]], asked: str) -> str:
    chosen = sorted({p for p, _ in positions})
    if len(chosen) == 1:
        token = positions[0][1] if len(positions) == 1 else None
        where = f"position {chosen[0]}" + (f" {token!r}" if token is not None else "")
    else:
        counts = pd.Series([p for p, _ in positions]).value_counts()
        where = "positions " + ", ".join(f"{p} ({n} prompts)" for p, n in counts.items())
    return f"{where} ({'detected: largest mean attention received' if str(asked).strip().lower() == 'auto' else 'chosen'})"


def _format(summary: pd.DataFrame) -> str:
    columns = {
        "layer": ("layer", "{:d}"),
        "sink_ratio": ("sink_ratio", "{:.3f}"),
        "cos_sink_rest": ("cos(v_sink,m)", "{:+.3f}"),
        "negative_cos_share": ("cos<0", "{:.2f}"),
        "sink_attention_share": ("attn_share", "{:.3f}"),
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
