"""Every command's parser: argparse and torch-free constants only (the options several commands share and the checks
of option values that need no model are in :mod:`cwviz.cli.options`).

``cwviz --help``, ``cwviz COMMAND --help`` and an argument error come from here alone, so they never import torch or
transformers (seconds). Each command's parser names the module that runs it (``command_module``, a module of
:mod:`cwviz.cli` with ``run(args) -> int``); :func:`cwviz.cli.main.main` imports that one module once the arguments
are parsed, after the parser's ``early_check`` where it has one (values refused before torch is imported, with one
``error:`` line). Add a command by writing its module and its ``_add_<name>`` here, listed in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analyses.schema import ALL_MEASURES, FLOW_METHODS, HEAD_METRICS, RANK_BY, RANK_SCOPES, TASKS
from ..core.defaults import (
    ATLAS_BOOTSTRAP,
    ATLAS_CONFIDENCE,
    ATLAS_SEED,
    ATLAS_TOP,
    CLAIMS_MAX_TOKENS,
    CLAIMS_RATES,
    COMPARE_TOP,
    DEFAULT_BATCH_SIZE,
    DEFAULT_DRAWS,
    DEFAULT_EXAMPLES,
    DEFAULT_FACTOR,
    DEFAULT_RATES,
    EXAMPLE_MAX_TOKENS,
    FLOW_BATCH_SIZE,
    FLOW_DRAWS,
    FLOW_MAX_TOKENS,
    FLOW_METHOD,
    FLOW_TOP,
    KEPT,
    RANKED_MEASURES,
    SEED,
)
from ..core.vocabulary import KINDS
from .options import (
    add_examples_arg,
    add_jsonl_args,
    add_model_args,
    add_option,
    add_sink_arg,
    add_sweep_args,
    add_text_args,
    check_flow,
    check_flow_faithfulness,
    parse_batch_size,
)


# -- one function per command ---------------------------------------------------------------------------------------
def _add_analyze(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("analyze", help="analyse one prompt: summary for the last token, JSON export")
    add_text_args(parser)
    add_model_args(parser)
    parser.add_argument("--layer", type=int, help="restrict the summary and the JSON to one layer")
    parser.add_argument("--head", type=int, help="restrict the summary and the JSON to one head")
    parser.add_argument("--json", dest="json_path", help="write tokens and per layer and head matrices here")
    parser.set_defaults(command_module="cwviz.cli.analyze")


def _add_sinks(sub: argparse._SubParsersAction) -> None:
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
    add_examples_arg(parser, "with --jsonl: only the first N prompts")
    parser.add_argument("--field", help="with --jsonl: read the prompt from this field")
    add_sink_arg(parser)
    parser.add_argument(
        "--factor",
        type=float,
        default=DEFAULT_FACTOR,
        help=f"λ for the ΔPPL runs: the sink's value is multiplied by it (default {DEFAULT_FACTOR:g}: removed)",
    )
    parser.add_argument(
        "--no-ppl", action="store_true", help="skip the ΔPPL runs (one forward pass per layer and prompt, batched)"
    )
    parser.add_argument(
        "--csv", type=Path, help="write the full table (one row per prompt, layer, head and query) here"
    )
    add_sweep_args(
        parser,
        "a results folder (e.g. a faithfulness sweep's): writes the per-prompt records, sinks/layers.csv, "
        "sinks/heads.csv "
        "and sinks/manifest.json into DIR/sinks, which `cwviz report --results DIR` adds to the report",
    )
    add_model_args(parser)
    parser.set_defaults(command_module="cwviz.cli.sinks")


def _add_faithfulness(sub: argparse._SubParsersAction) -> None:
    rates = ",".join(f"{r:g}" for r in DEFAULT_RATES)
    parser = sub.add_parser(
        "faithfulness",
        help="mask the keys each measure ranks first/last and report ΔPPL curves",
        description="Rank keys by each measure, mask the top (comprehensiveness) or bottom (sufficiency) share "
        "of each query's keys, and report the mean ΔPPL = PPL(masked) - PPL(clean) with a 95% bootstrap interval.",
    )
    data = parser.add_mutually_exclusive_group(required=True)
    add_jsonl_args(data, "JSON Lines: a 'text' field per line, or GSM8K's question and answer")
    data.add_argument(
        "--file",
        type=Path,
        help="a UTF-8 text file, each paragraph (blank-line separated) one example; .jsonl/.json files are read as "
        "JSONL",
    )
    data.add_argument("--text", help="one example given on the command line ('-' reads standard input)")
    data.add_argument("--dataset", help="a Hugging Face dataset NAME or NAME:CONFIG (needs `datasets` and network)")
    parser.add_argument(
        "--task",
        choices=("text", *TASKS),
        default="text",
        help="text (default: ΔPPL of each example's own tokens) or a multiple-choice task read from --jsonl or "
        "--dataset "
        "in its standard fields (mmlu: question, choices, answer index; boolq: passage, question, answer true/false; "
        "winogrande: sentence with _, option1, option2, answer 1/2): accuracy under masking beside ΔPPL",
    )
    parser.add_argument("--field", help="the JSONL/dataset field holding the text (default: text, or question+answer)")
    parser.add_argument("--split", help="the dataset split (default: test; validation for boolq and winogrande)")
    add_examples_arg(parser, f"number of examples (default {DEFAULT_EXAMPLES})", DEFAULT_EXAMPLES)
    parser.add_argument("--rates", default=rates, help=f"removal rates in %% of each query's keys (default {rates})")
    parser.add_argument(
        "--measures",
        default="default",
        help=f"comma-separated measures, or default: {', '.join(RANKED_MEASURES)} "
        f"(also: {', '.join(m for m in ALL_MEASURES if m not in RANKED_MEASURES)}; all = every one)",
    )
    parser.add_argument("--layers", default="all", help="all (default: mask in every layer at once) or one layer index")
    parser.add_argument("--per-head", action="store_true", help="rank keys per head (default: layer-level scores)")
    parser.add_argument(
        "--rank-by", choices=RANK_BY, default=RANK_BY[0], help="rank by the signed score (default) or its magnitude"
    )
    parser.add_argument(
        "--rank-scope",
        choices=RANK_SCOPES,
        default=RANK_SCOPES[0],
        help="what is ranked together: each query's keys (query, default), the keys by their mean score over the "
        "queries "
        "that see them, masked for every query (token), or all visible (query, key) pairs of a layer (layer); "
        "docs/METHOD.md section 3",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=EXAMPLE_MAX_TOKENS,
        help=f"token cap per example: longer ones are cut (default {EXAMPLE_MAX_TOKENS})",
    )
    parser.add_argument(
        "--batch-size",
        type=parse_batch_size,
        default=DEFAULT_BATCH_SIZE,
        help=f"masked runs per forward pass (default {DEFAULT_BATCH_SIZE}), or auto: as many as memory allows "
        f"(every distinct run of an example on a GPU, at most {DEFAULT_BATCH_SIZE} on a CPU)",
    )
    parser.add_argument(
        "--draws",
        type=int,
        default=DEFAULT_DRAWS,
        help=f"random rankings per example, the control (default {DEFAULT_DRAWS})",
    )
    parser.add_argument(
        "--seed", type=int, default=SEED, help=f"seed of the random rankings and the bootstrap (default {SEED})"
    )
    parser.add_argument("--out", type=Path, help="summary CSV, rewritten after every example")
    add_sweep_args(parser, "results folder: per-example records, manifest.json and summary.csv")
    add_model_args(parser)
    parser.set_defaults(command_module="cwviz.cli.faithfulness")


def _add_claims(sub: argparse._SubParsersAction) -> None:
    rates = ",".join(f"{r:g}" for r in CLAIMS_RATES)
    parser = sub.add_parser(
        "claims",
        help="check the paper's five claims on a model: a verdict per claim with bootstrap intervals over items",
        description="Run the faithfulness curves under each rank scope, the sink tables, head curves and the sink "
        "intervention on each item, and judge each of the paper's five claims holds / fails / unresolved from 95% "
        "bootstrap intervals over the items (criteria: docs/METHOD.md section 5). Writes DIR/claims.csv.",
    )
    data = parser.add_mutually_exclusive_group(required=True)
    add_jsonl_args(data, "JSON Lines: a 'text' field per line, or GSM8K's question and answer")
    parser.add_argument("--field", help="the JSONL field holding the text (default: text, or question+answer)")
    add_examples_arg(parser, f"number of items (default {DEFAULT_EXAMPLES})", DEFAULT_EXAMPLES)
    parser.add_argument(
        "--results", type=Path, required=True, help="results folder: DIR/claims/ (records, manifest) and DIR/claims.csv"
    )
    parser.add_argument("--resume", action="store_true", help="skip the items already recorded in DIR/claims/")
    parser.add_argument("--rates", default=rates, help=f"removal rates in %% for claim 1 (default {rates})")
    parser.add_argument(
        "--scopes",
        default=",".join(RANK_SCOPES),
        help=f"rank scopes for claim 1, comma-separated (default {','.join(RANK_SCOPES)})",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=CLAIMS_MAX_TOKENS,
        help=f"token cap per item: longer ones are cut (default {CLAIMS_MAX_TOKENS})",
    )
    add_sink_arg(parser)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"masked runs per forward pass (default {DEFAULT_BATCH_SIZE})",
    )
    parser.add_argument(
        "--draws",
        type=int,
        default=DEFAULT_DRAWS,
        help=f"random rankings per item, the control (default {DEFAULT_DRAWS})",
    )
    parser.add_argument(
        "--seed", type=int, default=SEED, help=f"seed of the random rankings and the bootstrap (default {SEED})"
    )
    add_model_args(parser)
    parser.set_defaults(command_module="cwviz.cli.claims")


def _add_flow(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "flow",
        help="where one prediction came from: which input tokens and heads push it up or down, by one attribution "
        "method",
        description="One attribution method of docs/METHOD.md section 7.2 on one prompt. A causal LM: toward "
        "logit(target) - logit(foil) at a position (default: the last position and the model's top next token there, "
        "no "
        "foil). An encoder: into a position's final representation (default 0, [CLS]); a target cannot be asked of it. "
        "--check takes every input token away in turn and prints how well the method's scores follow the measured "
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
        "route's "
        f"edges carry, as the Flow page's 'Effect drawn' (docs/flow.md, 'The route'; default {KEPT:g})",
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


def _add_flow_faithfulness(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "flow-faithfulness",
        help="which attribution method says what the model does? knockouts of each input token against every method",
        description="On each item: take each input token away (relay: its value in every layer; origin: its input "
        "embedding replaced by the mean one) and correlate the size of the effects on the logit difference (top token "
        "minus second) with the size of every attribution method's scores (the effect flow, the share flow, input x "
        "gradient, ALTI, attention rollout, raw attention, and a random control); the signed methods' signs against "
        "the "
        "effects' signs; deletion curves at 10 and 30 percent of the input tokens; judge the pre-registered "
        "comparisons "
        "holds / fails / unresolved from 95 percent paired bootstrap intervals over the items (docs/METHOD.md section "
        "7.3). Writes DIR/flow_faithfulness.csv, DIR/flow_faithfulness_methods.csv and "
        "DIR/flow_faithfulness_items.csv.",
    )
    data = parser.add_mutually_exclusive_group(required=True)
    add_jsonl_args(data, "JSON Lines: a 'text' field per line, or GSM8K's question and answer")
    parser.add_argument("--field", help="the JSONL field holding the text (default: text, or question+answer)")
    add_examples_arg(parser, f"number of items (default {DEFAULT_EXAMPLES})", DEFAULT_EXAMPLES)
    add_sweep_args(
        parser, "results folder: DIR/flow_faithfulness/ (records, manifest) and the CSV files", required=True
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=FLOW_MAX_TOKENS,
        help="token cap per item: longer ones are cut, the target is the next token after the cut (default "
        f"{FLOW_MAX_TOKENS})",
    )
    parser.add_argument(
        "--draws", type=int, default=FLOW_DRAWS, help=f"random rankings per item (default {FLOW_DRAWS})"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=FLOW_BATCH_SIZE,
        help=f"knockouts per forward pass (default {FLOW_BATCH_SIZE})",
    )
    parser.add_argument(
        "--seed", type=int, default=SEED, help=f"seed of the random rankings and the bootstrap (default {SEED})"
    )
    add_model_args(parser)
    parser.set_defaults(command_module="cwviz.cli.flow_faithfulness", early_check=check_flow_faithfulness)


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


def _add_atlas(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "atlas",
        help="every head's sink shares, cos(v_sink, m), divergence, negative share and output norm pooled over N "
        "prompts",
        description=(
            "For every (layer, head), statistics of each prompt (one forward pass each; means over its queries 1..T-1) "
            "pooled over the prompts with percentile bootstrap intervals: the sink's share under attention and under "
            "intra-head contribution, mean cos(v_sink, m), the divergence of attention and contribution rows, the "
            "share "
            "of negative contribution mass and the head output norm. The sink is the first token."
        ),
    )
    group = parser.add_mutually_exclusive_group(required=True)
    add_jsonl_args(group, "a JSON Lines file: one prompt a line ('text', or GSM8K's 'question' + 'answer')")
    group.add_argument(
        "--load", type=Path, help="a results folder written by --out: print it again, no model is loaded"
    )
    add_examples_arg(parser, "only the first N prompts")
    parser.add_argument("--field", help="read the prompt from this field")
    parser.add_argument(
        "--out", type=Path, help="write the results folder here (per_prompt.csv, pooled.csv, prompts.jsonl, atlas.json)"
    )
    add_sweep_args(
        parser,
        "results folder: per-prompt records, manifest.json and the atlas files of --out (the Atlas page and --load "
        "read it)",
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=ATLAS_BOOTSTRAP,
        help=f"bootstrap resamples of the prompts (default {ATLAS_BOOTSTRAP})",
    )
    parser.add_argument(
        "--confidence",
        type=float,
        default=ATLAS_CONFIDENCE,
        help=f"the intervals' coverage (default {ATLAS_CONFIDENCE})",
    )
    parser.add_argument("--seed", type=int, default=ATLAS_SEED, help=f"the bootstrap's seed (default {ATLAS_SEED})")
    parser.add_argument("--top", type=int, default=ATLAS_TOP, help=f"heads listed per statistic (default {ATLAS_TOP})")
    add_model_args(parser)
    parser.set_defaults(command_module="cwviz.cli.atlas")


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
    _add_sinks,
    _add_faithfulness,
    _add_claims,
    _add_flow_faithfulness,
    _add_report,
    _add_compare,
    _add_atlas,
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
