"""``cwviz flow``: the signed flow of one prompt into one position (docs/METHOD.md section 6): the input tokens and
heads that support and suppress the target most, and the tables as JSON or CSV."""

from __future__ import annotations

import argparse
import json
import sys

from ..analyses.schema import FLOW_TABLES
from ..core.method.analysis import analyze
from ..core.method.flow import flow
from ..core.util.errors import InputError
from ..core.util.progress import cli_bar
from ..core.util.texts import write_text_atomic
from .common import check_output_file, load, read_text

#: The tables ``--csv DIR`` writes, by file name (``Flow`` attributes; edges at ``--share``).
CSV_TABLES = FLOW_TABLES


def check_args(args: argparse.Namespace) -> None:
    """What can be refused before a model loads."""
    if args.top < 1:
        raise InputError(f"--top must be at least 1, not {args.top}")
    if not 0 < args.share <= 1:
        raise InputError(f"--share must lie in (0, 1], not {args.share}")
    if args.foil is not None and args.foil == args.target:
        raise InputError(f"the foil is the target ({args.target!r}): choose another foil, or none for the target's logit alone")
    check_output_file(args.json_path, "--json", "flow.json")
    if args.csv_dir is not None and args.csv_dir.exists() and not args.csv_dir.is_dir():
        raise InputError(f"--csv {args.csv_dir} is a file; give a folder to write the CSV tables into")
    if args.csv_dir is not None and not args.csv_dir.parent.is_dir():
        raise InputError(f"no folder {args.csv_dir.parent} for --csv; create it first")


def tables(result, share: float) -> dict:
    """The flow's tables by name (:data:`CSV_TABLES`)."""
    return {
        "tokens": result.tokens,
        "heads": result.heads,
        "edges": result.edges(share),
        "nodes": result.node_table,
        "parts": result.parts,
        "vocabulary": result.vocabulary_table,
    }


def summary(result, share: float) -> dict:
    """The flow's scalars: what was asked and its identities' numbers."""
    return {
        "position": result.position,
        "token": result.token_strings[result.position],
        "target": result.target,
        "target_token": result.target_token,
        "foil": result.foil,
        "foil_token": result.foil_token,
        "logit_difference": result.logit_difference,
        "frozen_logit_difference": result.frozen_logit_difference,
        "norm_error": result.norm_error,
        "bias_total": result.bias_total,
        "rollout_cancellation": result.rollout_cancellation,
        "edge_share": share,
        "edges_complete": result.edges_complete(share),
    }


def _lines(frame, label, value: str, count: int, largest: bool) -> list[str]:
    picked = frame.nlargest(count, value) if largest else frame.nsmallest(count, value)
    picked = picked[picked[value] > 0] if largest else picked[picked[value] < 0]
    return [f"{label(row):28} {getattr(row, value):+.4f}" for row in picked.itertuples()] or ["(none)"]


def _columns(left: list[str], right: list[str]) -> list[str]:
    rows = max(len(left), len(right))
    left, right = left + [""] * (rows - len(left)), right + [""] * (rows - len(right))
    return [f"  {a:40} {b}" for a, b in zip(left, right, strict=True)]


def run(args: argparse.Namespace) -> int:
    check_args(args)
    text = read_text(args)
    bundle = load(args)
    with cli_bar("analysing", enabled=sys.stderr.isatty()) as progress:
        analysis = analyze(bundle, text, progress=progress)
    result = flow(analysis, args.position, args.target, args.foil)
    info = bundle.info
    print(f"model: {info.id} ({info.architecture}, {info.layers} layers x {info.heads} heads, {info.device} {info.dtype})")
    where = f"position {result.position} {result.token_strings[result.position]!r}"
    if result.encoder:
        print(f"flow into {where}: its final representation (each input token's signed share; with the bias's, they sum to 1)")
        value, what = "total", "share"
    else:
        toward = f"logit({result.target_token!r})" + ("" if result.foil is None else f" - logit({result.foil_token!r})")
        print(f"flow from {where} toward {toward}")
        print(
            f"frozen-norm logit difference {result.frozen_logit_difference:+.4f} (the sum of the parts); the model's own "
            f"{result.logit_difference:+.4f}; final norm linearisation error {result.norm_error:+.2e}; biases {result.bias_total:+.4f}"
        )
        value, what = "total", "total"
    print(f"rollout cancellation index of the position: {result.rollout_cancellation:.3f} (1 = no cancellation)")
    token_label = lambda row: f"#{row.position:<5} {row.token[:16]!r}"  # noqa: E731
    print(f"  {'input tokens supporting (' + what + ')':40} suppressing")
    for line in _columns(
        _lines(result.tokens, token_label, value, args.top, True), _lines(result.tokens, token_label, value, args.top, False)
    ):
        print(line)
    column = "routed" if result.encoder else "direct"
    head_label = lambda row: f"layer {row.layer:<3} head {row.head:<3}"  # noqa: E731
    print(f"  {'heads supporting (' + column + ')':40} suppressing")
    for line in _columns(
        _lines(result.heads, head_label, column, args.top, True), _lines(result.heads, head_label, column, args.top, False)
    ):
        print(line)
    if args.json_path:
        payload = {
            "summary": summary(result, args.share),
            **{name: json.loads(t.to_json(orient="records")) for name, t in tables(result, args.share).items()},
        }
        print(f"wrote {write_text_atomic(args.json_path, json.dumps(payload, allow_nan=True))}")
    if args.csv_dir:
        args.csv_dir.mkdir(exist_ok=True)
        for name, table in tables(result, args.share).items():
            write_text_atomic(args.csv_dir / f"{name}.csv", table.to_csv(index=False, float_format="%.6g"))
        print(f"wrote {len(CSV_TABLES)} tables into {args.csv_dir}")
    return 0
