"""``cwviz compare``: two prompts on one model (``--text A --text B``), or one prompt on two models that share a
tokenizer (``--text A --model M --model-b N``), head by head (:mod:`cwviz.analyses.compare`)."""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from ..analyses import compare
from ..analyses.schema import HEAD_METRICS, CompareCells
from ..core.defaults import COMPARE_TOP
from ..core.loading.models import Bundle, load_model
from ..core.method.analysis import Analysis, analyze
from ..core.util.errors import CwvizError, InputError
from ..core.util.progress import cli_bar
from . import outputs
from .common import prompt_text

#: The map cells with the largest change that are listed.
TOP_CELLS = 5


def read_inputs(args: argparse.Namespace) -> list[str]:
    """The prompts, in the order given; InputError (before any model loads) when there are not two inputs to
    compare or one is empty."""
    given = args.inputs or []
    if not (len(given) == 2 or (len(given) == 1 and args.model_b)):
        raise InputError(
            f"compare needs two prompts (--text A --text B, or --file) or one prompt and --model-b; got {len(given)} "
            "prompt(s)"
        )
    if sum(1 for how, value in given if how == "text" and value == "-") > 1:
        raise InputError("standard input can hold one prompt only; give the other with --text or --file")
    texts = []
    for name, (how, value) in zip("AB", given):
        text, where = prompt_text(how, value)
        if not text.strip():
            raise InputError(f"prompt {name} is empty{where}; give some text to compare")
        texts.append(text)
    return texts


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise InputError(f"--top must be at least 1, not {args.top}")
    texts = read_inputs(args)
    outputs.check_folder(args.out, "--out")  # before any model loads
    bundle_a, bundle_b = load_bundles(args)
    cmp = compare.compare(*analyse_inputs((bundle_a, bundle_b), (texts[0], texts[-1])))
    a = cmp.a
    layer = a.num_layers // 2 if args.layer is None else a.check_layer(args.layer)
    head = None if args.head is None else a.check_head(args.head)
    lines = alignment_lines(cmp)
    with cli_bar("summarising heads", enabled=sys.stderr.isatty()) as progress:
        changes = compare.head_changes(cmp, progress=progress)
    lines += head_lines(changes, args.rank_by, args.top)
    cells = compare.map_cells(cmp, layer, head, args.kind)
    lines += map_lines(cells)
    logprobs = compare.logprob_changes(cmp) if a.info.causal else None
    lines += logprob_lines(logprobs)
    if args.out is not None:  # the files first, then the summary: a reader that leaves early (| head -1) loses none
        tables = {"alignment.csv": cmp.alignment.table, "heads.csv": changes, "maps.csv": cells.frame}
        if logprobs is not None:
            tables["logprobs.csv"] = logprobs
        outputs.make_folder(args.out)
        for name, table in tables.items():  # each file whole or not at all
            outputs.write(args.out / name, outputs.csv_text(table, float_format=None))
        lines.append(f"\nwrote {', '.join(tables)} in {args.out}")
    print("\n".join(lines))
    return 0


def load_bundles(args: argparse.Namespace) -> tuple[Bundle, Bundle]:
    """The models of A and B: one model twice, or two that share a tokenizer (InputError otherwise)."""
    bundle_a = load_model(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    if not args.model_b or args.model_b == args.model:
        return bundle_a, bundle_a
    bundle_b = load_model(args.model_b, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    if not compare.same_tokenizer(bundle_a.tokenizer, bundle_b.tokenizer):
        raise InputError(
            f"the tokenizers of {args.model} and {args.model_b} differ; one prompt on two models needs one tokenizer "
            "(pick two models of one family, e.g. a base model and its fine-tune), or compare two prompts on one model"
        )
    return bundle_a, bundle_b


def analyse_inputs(bundles: tuple[Bundle, Bundle], texts: tuple[str, str]) -> list[Analysis]:
    """The analyses of A and B, each with its bar; an error names the input it is about."""
    analyses = []
    for name, bundle, text in zip("AB", bundles, texts):
        try:
            with cli_bar(f"analysing {name}", enabled=sys.stderr.isatty()) as progress:
                analyses.append(analyze(bundle, text, progress=progress))
        except CwvizError as err:
            raise type(err)(f"input {name}: {err}") from None
    return analyses


def alignment_lines(cmp: compare.Comparison) -> list[str]:
    """What A and B are, and how their tokens align: the first 40 positions that differ."""
    a, b = cmp.a, cmp.b
    lines = [f"A: {a.info.id}, {a.num_tokens} tokens; B: {b.info.id}, {b.num_tokens} tokens"]
    lines.append(f"tokens {cmp.alignment.describe(a.num_tokens, b.num_tokens)}")
    differing = cmp.alignment.table[cmp.alignment.table["op"] != "equal"]
    for row in differing.head(40).itertuples(index=False):
        left = f"A {row.position_a} {row.token_a!r}" if row.token_a or row.op != "insert" else ""
        right = f"B {row.position_b} {row.token_b!r}" if row.op != "delete" else ""
        lines.append(f"  {row.op:8} {left:28} {right}")
    if len(differing) > 40:
        lines.append(f"  ... and {len(differing) - 40} more (--out writes the whole alignment)")
    return lines


def head_lines(changes: pd.DataFrame, rank_by: str, top: int) -> list[str]:
    """The ``top`` heads whose ``rank_by`` summary changed most, with the change of every summary."""
    ranked = compare.rank_changes(changes, rank_by, top=top)
    lines = [f"\nheads by |change B - A| in {HEAD_METRICS[rank_by]} (top {len(ranked)}):"]
    lines.append(f"  {'layer':>5} {'head':>4} " + " ".join(f"{'d ' + m:>20}" for m in HEAD_METRICS))
    for row in ranked.itertuples(index=False):
        changed = " ".join(f"{getattr(row, m + '_change'):>+20.4f}" for m in HEAD_METRICS)
        lines.append(f"  {row.layer:>5} {row.head:>4} " + changed)
    return lines


def map_lines(cells: CompareCells) -> list[str]:
    """The maps' largest and mean |B - A|, and the :data:`TOP_CELLS` cells whose contribution changed most."""
    frame = cells.frame
    lines = [f"\nmaps: {cells.note}"]
    for what in ("attention", "contribution"):
        diff = frame[f"{what}_diff"].abs()
        lines.append(f"  max |B - A| {what}: {diff.max():.4f}, mean {diff.mean():.4f}")
    top = frame.loc[frame["contribution_diff"].abs().sort_values(ascending=False, kind="stable").index[:TOP_CELLS]]
    for row in top.itertuples(index=False):
        cell = f"query {row.query_token!r:24} key {row.key_token!r:24}"
        lines.append(f"    {cell} contribution {row.contribution_a:+.4f} -> {row.contribution_b:+.4f}")
    return lines


def logprob_lines(logprobs: pd.DataFrame | None) -> list[str]:
    """The next-token log-probabilities' change at the aligned positions, largest first (None: an encoder's)."""
    if logprobs is None:
        return ["\nno log-probabilities: an encoder predicts no next token"]
    shown = logprobs.dropna(subset=["change"])
    order = shown["change"].abs().sort_values(ascending=False, kind="stable").index[:COMPARE_TOP]
    total = np.nansum(shown["change"])
    lines = [f"\nnext-token log-probability, B - A, at the aligned positions (sum {total:+.3f} nats); largest changes:"]
    for row in shown.loc[order].itertuples(index=False):
        lines.append(f"  {row.label!r:28} {row.logprob_a:8.3f} -> {row.logprob_b:8.3f}  ({row.change:+.3f})")
    return lines
