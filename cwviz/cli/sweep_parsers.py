"""The parsers of the commands that run over many items and write a results folder (``sinks``, ``faithfulness``,
``claims``, ``flow-faithfulness``, ``atlas``): argparse and torch-free constants only, as every parser
(:mod:`cwviz.cli.parsers` lists them in its :data:`~cwviz.cli.parsers.COMMANDS` and builds the ``cwviz`` parser).

Each ``add_<name>(sub)`` adds one command's parser, naming the module that runs it (``command_module``) and its
``early_check`` where it has one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..analyses.schema import ALL_MEASURES, RANK_BY, RANK_SCOPES, TASKS
from ..core.defaults import (
    ATLAS_BOOTSTRAP,
    ATLAS_CONFIDENCE,
    ATLAS_SEED,
    ATLAS_TOP,
    CLAIMS_MAX_TOKENS,
    CLAIMS_RATES,
    DEFAULT_BATCH_SIZE,
    DEFAULT_DRAWS,
    DEFAULT_EXAMPLES,
    DEFAULT_FACTOR,
    DEFAULT_RATES,
    EXAMPLE_MAX_TOKENS,
    FLOW_BATCH_SIZE,
    FLOW_DRAWS,
    FLOW_MAX_TOKENS,
    RANKED_MEASURES,
    SEED,
)
from .options import (
    add_examples_arg,
    add_jsonl_args,
    add_model_args,
    add_sink_arg,
    add_sweep_args,
    add_text_args,
    check_flow_faithfulness,
    parse_batch_size,
)


def add_sinks(sub: argparse._SubParsersAction) -> None:
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


def add_faithfulness(sub: argparse._SubParsersAction) -> None:
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
        "--dataset in its standard fields (mmlu: question, choices, answer index; boolq: passage, question, answer "
        "true/false; winogrande: sentence with _, option1, option2, answer 1/2): accuracy under masking beside ΔPPL",
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
        "queries that see them, masked for every query (token), or all visible (query, key) pairs of a layer (layer); "
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


def add_claims(sub: argparse._SubParsersAction) -> None:
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


def add_flow_faithfulness(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "flow-faithfulness",
        help="which attribution method says what the model does? knockouts of each input token against every method",
        description="On each item: take each input token away (relay: its value in every layer; origin: its input "
        "embedding replaced by the mean one) and correlate the size of the effects on the logit difference (top token "
        "minus second) with the size of every attribution method's scores (the effect flow, the share flow, input x "
        "gradient, ALTI, attention rollout, raw attention, and a random control); the signed methods' signs against "
        "the effects' signs; deletion curves at 10 and 30 percent of the input tokens; judge the pre-registered "
        "comparisons holds / fails / unresolved from 95 percent paired bootstrap intervals over the items "
        "(docs/METHOD.md section 7.3). Writes DIR/flow_faithfulness.csv, DIR/flow_faithfulness_methods.csv and "
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


def add_atlas(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "atlas",
        help="every head's sink shares, cos(v_sink, m), divergence, negative share and output norm pooled over N "
        "prompts",
        description=(
            "For every (layer, head), statistics of each prompt (one forward pass each; means over its queries "
            "1..T-1) pooled over the prompts with percentile bootstrap intervals: the sink's share under attention "
            "and under intra-head contribution, mean cos(v_sink, m), the divergence of attention and contribution "
            "rows, the share of negative contribution mass and the head output norm. The sink is the first token."
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
