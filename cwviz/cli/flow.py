"""``cwviz flow``: where one prediction came from (docs/METHOD.md sections 6 and 7): the input tokens and heads that
support and suppress the target most under one attribution method of the registry (``--method``; every member gives
the same tables), optionally checked against the measured knockouts of every input token (``--check``), and the
tables as JSON or CSV.

Every output is written before anything is printed (a closed pipe cannot lose a file)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import pandas as pd

from ..analyses import route
from ..analyses.check import Check, check
from ..analyses.flow_text import describe
from ..analyses.schema import FLOW_METHODS
from ..core.method import attribution
from ..core.method.analysis import analyze
from ..core.method.flow import flow_basis
from ..core.method.flow_tables import vocabulary_table
from ..core.util.errors import InputError
from ..core.util.progress import cli_bar
from . import outputs
from .common import load, read_text


def check_args(args: argparse.Namespace) -> None:
    """What can be refused before a model loads (``--top`` and ``--kept``: by the parser's early check, before torch is
    imported, :func:`cwviz.cli.options.check_flow`)."""
    if args.method not in FLOW_METHODS:
        raise InputError(f"no attribution method {args.method[:80]!r}: choose one of {', '.join(FLOW_METHODS)}")
    if args.foil is not None and args.foil == args.target:
        raise InputError(
            f"the foil is the target ({args.target[:80]!r}): choose another foil, or none for the target's logit alone"
        )
    outputs.check_file(args.json_path, "--json", "flow.json")
    outputs.check_folder(args.csv_dir, "--csv")


def tables(
    result: attribution.Attribution,
    drawn: route.Route,
    checked: Check | None = None,
    vocabulary: pd.DataFrame | None = None,
) -> dict:
    """The method's tables by name: ``tokens`` (position, token, score; with ``--check`` the measured ``effect``),
    ``heads``, ``edges`` (the route ``drawn``: the edges the Flow page draws at the same kept fraction), then its own
    (the share flow's ``nodes`` and ``parts``), and the heads' ``vocabulary`` where it was made (a causal model's)."""
    tokens = result.tokens_table()
    if checked is not None:
        effect = [math.nan] * len(tokens)
        effect[: len(checked.effects)] = [float(v) for v in checked.effects]
        tokens["effect"] = effect  # the last position (the one predicted from) is never taken away
    made = {"tokens": tokens, "heads": result.heads_table(), "edges": drawn.edges, **dict(result.extra)}
    return made if vocabulary is None else {**made, "vocabulary": vocabulary}


def summary(result: attribution.Attribution, drawn: route.Route, checked: Check | None) -> dict:
    """What was asked, the method and its quantity, the route's rule at its kept fraction (docs/flow.md, "The route"),
    and the check's statistics (None without ``--check``)."""
    asked = result.asked
    method = attribution.METHODS[result.method]
    return {
        "method": result.method,
        "signed": method.signed,
        "position": asked.position,
        "token": asked.token_strings[asked.position],
        "target": asked.target,
        "target_token": asked.target_token,
        "foil": asked.foil,
        "foil_token": asked.foil_token,
        "quantity": result.quantity,
        "kept": drawn.kept,
        "route": {
            "threshold": drawn.threshold,
            "carried": drawn.carried,
            "capped": drawn.capped,
            "connected": list(drawn.connected),
        },
        "check": None
        if checked is None
        else {
            "intervention": checked.intervention,
            "rho": checked.rho,
            "rho_signed": checked.rho_signed,
            "sign_agreement": checked.sign_agreement,
            "complete": checked.complete,
        },
    }


def _lines(frame, label, value: str, count: int, largest: bool) -> list[str]:
    picked = frame.nlargest(count, value) if largest else frame.nsmallest(count, value)
    picked = picked[picked[value] > 0] if largest else picked[picked[value] < 0]
    return [f"{label(row):28} {getattr(row, value):+.4f}" for row in picked.itertuples()] or ["(none)"]


def _columns(left: list[str], right: list[str]) -> list[str]:
    rows = max(len(left), len(right))
    left, right = left + [""] * (rows - len(left)), right + [""] * (rows - len(right))
    return [f"  {a:40} {b}" for a, b in zip(left, right, strict=True)]


def report(result: attribution.Attribution, checked: Check | None, top: int) -> list[str]:
    """The printed lines: what was asked, the tokens (and heads) each way, the check's sentence."""
    method = attribution.METHODS[result.method]
    lines = [f"{method.label} ({result.method}): {describe(result.asked)}"]
    if math.isfinite(result.quantity):
        lines.append(f"the quantity explained: {result.quantity:+.4f}")
    tokens = result.tokens_table()
    label = lambda row: f"#{row.position:<5} {row.token[:16]!r}"  # noqa: E731
    if method.signed:
        lines.append(f"  {'input tokens supporting (score)':40} suppressing")
        lines += _columns(_lines(tokens, label, "score", top, True), _lines(tokens, label, "score", top, False))
    else:
        lines.append("  input tokens scored highest (an unsigned method)")
        lines += [f"  {line}" for line in _lines(tokens, label, "score", top, True)]
    if result.heads is not None:
        heads = result.heads_table()
        head_label = lambda row: f"layer {row.layer:<3} head {row.head:<3}"  # noqa: E731
        lines.append(f"  {'heads supporting (part)':40} suppressing")
        lines += _columns(_lines(heads, head_label, "part", top, True), _lines(heads, head_label, "part", top, False))
    if checked is not None:
        lines.append(f"check against knockouts: {checked.sentence()}")
    return lines


def run(args: argparse.Namespace) -> int:
    check_args(args)
    text = read_text(args)
    bundle = load(args)
    method = attribution.check_method(args.method)
    with cli_bar("analysing", enabled=sys.stderr.isatty()) as progress:
        analysis = analyze(bundle, text, progress=progress)
    asked = attribution.request(analysis, args.position, args.target, args.foil)
    vocabulary = None
    if bundle.has_logits and (args.json_path or args.csv_dir):  # only a written table reads it: a pass of its own
        # each head's write at the position read through the output layer, --top tokens each way (the share flow's too)
        basis = flow_basis(analysis, asked.position, vocabulary=args.top, keep_mixing=False)
        asked = dataclasses.replace(asked, basis=basis)
        vocabulary = vocabulary_table(basis.vocabulary())
    result = attribution.run(method, asked)
    checked = None
    if args.check:
        with cli_bar("knockouts", unit="pass", enabled=sys.stderr.isatty()) as progress:
            checked = check(asked, method.name, progress=progress)
    drawn = route.of(result, args.kept)
    made = tables(result, drawn, checked, vocabulary)
    written = []
    if args.json_path:
        payload = {
            "summary": summary(result, drawn, checked),
            **{name: outputs.table_records(t) for name, t in made.items()},
        }
        written.append(outputs.write(args.json_path, outputs.json_text(payload)))
    if args.csv_dir:
        outputs.make_folder(args.csv_dir)
        for name, table in made.items():
            outputs.write(args.csv_dir / f"{name}.csv", outputs.csv_text(table, float_format=None))
        written.append(f"{len(made)} tables into {args.csv_dir}")
    info = bundle.info
    lines = [
        f"model: {info.id} ({info.architecture}, {info.layers} layers x {info.heads} heads, {info.device} {info.dtype})"
    ]
    lines += report(result, checked, args.top)
    lines += [f"wrote {what}" for what in written]
    print("\n".join(lines))
    return 0
