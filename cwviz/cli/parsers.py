"""Every command's parser: argparse and torch-free constants only (the options several commands share and the checks
of option values that need no model are in :mod:`cwviz.cli.options`).

``cwviz --help``, ``cwviz COMMAND --help`` and an argument error come from here alone, so they never import torch or
transformers (seconds). Each command's parser names the module that runs it (``command_module``, a module of
:mod:`cwviz.cli` with ``run(args) -> int``); :func:`cwviz.cli.main.main` imports that one module once the arguments
are parsed, after the parser's ``early_check`` where it has one (values refused before torch is imported, with one
``error:`` line). Add a command by writing its module and its ``_add_<name>`` here (a command over many items:
``add_<name>`` in :mod:`cwviz.cli.sweep_parsers`), listed in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analyses.schema import FLOW_METHODS, HEAD_METRICS
from ..core.defaults import COMPARE_TOP, FLOW_METHOD, FLOW_TOP, KEPT
from ..core.vocabulary import KINDS
from . import sweep_parsers
from .options import add_model_args, add_option, add_text_args, check_flow


# -- one function per command ---------------------------------------------------------------------------------------
def _add_analyze(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("analyze", help="analyse one prompt: summary for the last token, JSON export")
    add_text_args(parser)
    add_model_args(parser)
    parser.add_argument("--layer", type=int, help="restrict the summary and the JSON to one layer")
    parser.add_argument("--head", type=int, help="restrict the summary and the JSON to one head")
    parser.add_argument("--json", dest="json_path", help="write tokens and per layer and head matrices here")
    parser.set_defaults(command_module="cwviz.cli.analyze")


def _add_flow(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "flow",
        help="where one prediction came from: which input tokens and heads push it up or down, by one attribution "
        "method",
        description="One attribution method of docs/METHOD.md section 7.2 on one prompt. A causal LM: toward "
        "logit(target) - logit(foil) at a position (default: the last position and the model's top next token there, "
        "no foil). An encoder: into a position's final representation (default 0, [CLS]); a target cannot be asked of "
        "it. --check takes every input token away in turn and prints how well the method's scores follow the measured "
        "effects.",
    )
    add_text_args(parser)
    add_model_args(parser)
    parser.add_argument(
        "--target", help="the target token, exactly one token of the model's vocabulary (mind a leading space)"
    )
    parser.add_argument("--foil", help="a foil token: the flow is toward logit(target) - logit(foil)")
    parser.add_argument(
        "--position", type=int, help="the position predicted from (default: the last; an encoder's 0, [CLS])"
    )
    parser.add_argument(
        "--top", type=int, default=FLOW_TOP, help=f"tokens and heads listed each way (default {FLOW_TOP})"
    )
    add_option(
        parser,
        "--kept",
        formerly=("--share",),
        type=float,
        default=KEPT,
        help="the kept fraction: the fraction of the cross-token |effect| on paths into the prediction that the "
        f"route's edges carry, as the Flow page's 'Effect drawn' (docs/flow.md, 'The route'; default {KEPT:g})",
    )
    parser.add_argument(
        "--json", dest="json_path", type=Path, help="write the summary and every table as one JSON file"
    )
    parser.add_argument(
        "--csv",
        dest="csv_dir",
        type=Path,
        help="write tokens.csv, heads.csv, edges.csv (and the method's own tables) into this folder",
    )
    parser.add_argument(
        "--method",
        default=FLOW_METHOD,
        help=f"the attribution method (docs/METHOD.md section 7.2; default {FLOW_METHOD}): {', '.join(FLOW_METHODS)}",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="also take every input token away in turn (one forward pass each, batched) and print the method's rank "
        "correlation and sign agreement with the measured effects; the effects go into --json and --csv",
    )
    parser.set_defaults(command_module="cwviz.cli.flow", early_check=check_flow)


def _add_report(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="one offline HTML file of a results folder: curves, tables, order check, sinks, manifest",
        description="Write one self-contained HTML file (figures inlined as SVG, nothing loaded from the network) "
        "from a results folder written by `cwviz faithfulness --results DIR` and/or `cwviz sinks --results DIR`.",
    )
    parser.add_argument("--results", type=Path, required=True, help="the results folder")
    parser.add_argument("--out", type=Path, required=True, help="the HTML file to write (e.g. report.html)")
    parser.add_argument("--title", default="cwviz report", help="the report's title")
    parser.set_defaults(command_module="cwviz.cli.report")


def _add_compare(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="compare two prompts (or one prompt on two models): alignment, maps' differences, per-head changes, "
        "log-probabilities",
        description=(
            "Input A is the first prompt on --model; input B the second prompt (or the same one) on --model-b "
            "(default: "
            "--model). Tokens are paired by position when both inputs have as many, else by a sequence alignment "
            "of the token ids. Prints the alignment, the heads ranked by the change B - A of a per-head summary, "
            "the largest changes in the selected layer's maps and the change in each aligned token's log-probability."
        ),
    )
    parser.add_argument(
        "--text",
        dest="inputs",
        action="append",
        type=lambda v: ("text", v),
        help="a prompt ('-': standard input); give two, or one with --model-b",
    )
    parser.add_argument(
        "--file",
        dest="inputs",
        action="append",
        type=lambda v: ("file", Path(v)),
        help="a UTF-8 file holding a prompt (mixes with --text, in order)",
    )
    add_model_args(parser)
    parser.add_argument("--model-b", help="input B's model (default: --model); it must share --model's tokenizer")
    parser.add_argument("--layer", type=int, help="the layer whose maps are compared (default: the middle one)")
    parser.add_argument("--head", type=int, help="one head (default: all heads, the layer-level scores)")
    parser.add_argument(
        "--kind",
        choices=KINDS,
        default=KINDS[0],
        help="contribution weights normalised by the layer output (inter, default) or the head's (intra)",
    )
    parser.add_argument(
        "--rank-by",
        choices=list(HEAD_METRICS),
        default="divergence",
        help="the per-head summary whose change ranks the heads (default divergence)",
    )
    parser.add_argument("--top", type=int, default=COMPARE_TOP, help=f"heads listed (default {COMPARE_TOP})")
    parser.add_argument(
        "--out", type=Path, help="a folder: write alignment.csv, heads.csv, logprobs.csv and maps.csv there"
    )
    parser.set_defaults(command_module="cwviz.cli.compare")


def _add_app(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "app",
        help="start the dashboard in the browser",
        description="Start the Streamlit dashboard. Options after the command go to `streamlit run`, "
        "e.g. `cwviz app --server.port 8502 --server.headless true`.",
    )
    parser.add_argument("streamlit_args", nargs=argparse.REMAINDER, help="options for streamlit run")
    parser.set_defaults(command_module="cwviz.cli.dashboard")


#: The commands, in the order ``cwviz --help`` lists them.
COMMANDS = (
    _add_analyze,
    _add_flow,
    sweep_parsers.add_sinks,
    sweep_parsers.add_faithfulness,
    sweep_parsers.add_claims,
    sweep_parsers.add_flow_faithfulness,
    _add_report,
    _add_compare,
    sweep_parsers.add_atlas,
    _add_app,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``cwviz`` parser, every command's included; building it imports nothing more."""
    parser = argparse.ArgumentParser(prog="cwviz", description="Contribution weights for attention layers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser
