"""The options several commands share, the one way an option is renamed, and the checks of option values that need
no model: argparse and torch-free constants only (:mod:`cwviz.cli.parsers` builds each command's parser from these).

A value refused here is refused before torch is imported, with one ``error:`` line: a command's ``early_check``
(:func:`check_flow`, :func:`check_flow_faithfulness`) runs in :func:`cwviz.cli.main.main` right after parsing, and the
``parse_*`` functions are argparse types or read by the command's module.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..analyses.schema import ALL_MEASURES, AUTO, AUTO_BATCH, FLOW_MIN_TOKENS, RANK_SCOPES
from ..core.defaults import (
    DEFAULT_SINK,
    DEVICE,
    DTYPE,
    MODEL,
    RANKED_MEASURES,
)
from ..core.method import flow_arguments
from ..core.util.errors import InputError


# -- a renamed option keeps its old name as an alias ---------------------------------------------------------------
class Renamed(argparse.Action):
    """An option's old name, kept so that old scripts still run: it stores into the new option's ``dest`` and prints
    one deprecation line on stderr. Hidden from ``--help`` and the generated reference (docs/cli.md)."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        sys.stderr.write(f"{parser.prog}: warning: {option_string} is deprecated; use {self.new}\n")
        setattr(namespace, self.dest, values)


def add_option(parser: argparse.ArgumentParser, flag: str, *, formerly: tuple[str, ...] = (), **kwargs) -> None:
    """``parser.add_argument(flag, **kwargs)``, and each old name in ``formerly`` as a :class:`Renamed` alias of it:
    the one way a flag is renamed (docs/METHOD.md, "Glossary")."""
    action = parser.add_argument(flag, **kwargs)
    for old in formerly:
        parser.add_argument(old, dest=action.dest, type=action.type, action=Renamed, new=flag, help=argparse.SUPPRESS)


# -- the options several commands share -----------------------------------------------------------------------------
def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=MODEL,
        help="embedded (default; SmolLM2, a causal LM), embedded-gemma (Gemma 3 270M, a causal LM; Gemma terms of "
        "use), embedded-encoder (all-MiniLM-L6-v2, a BERT encoder), a hub id, a local folder or a .gguf file",
    )
    parser.add_argument("--device", default=DEVICE, help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps")
    parser.add_argument(
        "--dtype", default=DTYPE, help="auto (bfloat16 on cuda, float32 elsewhere), float32, bfloat16, float16"
    )
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="run code shipped with a hub model (off by default)"
    )


def add_text_args(parser: argparse.ArgumentParser, required: bool = True) -> argparse._MutuallyExclusiveGroup:
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--text", help="the prompt; '-' reads standard input")
    group.add_argument("--file", type=Path, help="a UTF-8 text file holding the prompt")
    return group


def add_jsonl_args(group: argparse._MutuallyExclusiveGroup, help: str) -> None:
    """``--jsonl PATH`` and ``--gsm8k`` (the shipped GSM8K sample, or ``$CWVIZ_GSM8K``) in one exclusive group."""
    group.add_argument("--jsonl", type=Path, help=help)
    group.add_argument(
        "--gsm8k",
        action="store_true",
        help="the GSM8K sample that ships with cwviz (40 test items), or the file $CWVIZ_GSM8K names (e.g. the full "
        "test split)",
    )


def add_sweep_args(parser: argparse.ArgumentParser, results: str, required: bool = False) -> None:
    """``--results DIR`` (``results``: what the command keeps there; ``required`` for a command that runs into a
    folder only) and ``--resume``: the options of every command that runs through the sweep runner
    (:mod:`cwviz.analyses.sweep`)."""
    parser.add_argument(
        "--results",
        type=Path,
        required=required,
        help=f"{results}; each item's record is appended (JSON Lines, one file per process) and fsynced as it "
        "finishes; needed for data-parallel runs (accelerate launch / torchrun)",
    )
    parser.add_argument("--resume", action="store_true", help="with --results: skip the items already recorded there")


def add_examples_arg(parser: argparse.ArgumentParser, what: str, default: int | None = None) -> None:
    """``--n N``, also spelt ``--examples N``: ``what`` says what is counted."""
    parser.add_argument(
        "--n",
        "--examples",
        dest="n",
        type=int,
        default=default,
        help=f"{what}; under torchrun or accelerate launch write --examples (their own parsers take --n)",
    )


def add_sink_arg(parser: argparse.ArgumentParser) -> None:
    """``--sink``, one rule for every command that takes it (:func:`parse_sink`)."""
    parser.add_argument(
        "--sink",
        type=parse_sink,
        default=DEFAULT_SINK,
        help=(
            f"the sink: a token position (default {DEFAULT_SINK}, the first token; negative counts from the end, so -1 "
            f"is the last, BERT's [SEP]) or '{AUTO}' (the key with the largest mean attention)"
        ),
    )


# -- option values checked before anything is imported or read -----------------------------------------------------
def parse_sink(value: str) -> int | str:
    """A ``--sink``: a token position as an int (negative counts from the end, as in Python: -1 is the last token),
    or ``"auto"`` (the key with the largest mean attention); whether the position lies in a prompt is checked per
    prompt (:func:`cwviz.analyses.sinks.resolve_sink`)."""
    text = value.strip().lower()
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--sink takes a token position (0, 1, ...; -1 is the last) or '{AUTO}', not {value!r}"
        ) from None


def parse_batch_size(value: str) -> int:
    """A positive integer, or auto (:data:`cwviz.analyses.schema.AUTO_BATCH`)."""
    if value.strip().lower() == "auto":
        return AUTO_BATCH
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a positive integer or auto, not {value!r}") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"takes a positive integer or auto, not {value!r}")
    return size


def check_flow(args: argparse.Namespace) -> None:
    """``cwviz flow``'s refusals that need no model, run by :func:`cwviz.cli.main.main` before torch is imported:
    ``--top`` of at least 1, and ``--kept`` by the flow API's own rule
    (:func:`cwviz.core.method.flow_arguments.kept`)."""
    if args.top < 1:
        raise InputError(f"--top must be at least 1, not {args.top}")
    flow_arguments.kept(args.kept, "--kept")


def check_flow_faithfulness(args: argparse.Namespace) -> None:
    """``cwviz flow-faithfulness``'s settings out of range, refused before torch is imported (a ``--seed -1`` ended in
    numpy's traceback once the model had loaded)."""
    for flag, value, least in (
        ("--n", args.n, 1),
        ("--batch-size", args.batch_size, 1),
        ("--draws", args.draws, 1),
        ("--seed", args.seed, 0),
    ):
        if value < least:
            raise InputError(f"{flag} must be at least {least}, not {value}")
    if args.max_tokens < FLOW_MIN_TOKENS:
        raise InputError(
            f"--max-tokens must be at least {FLOW_MIN_TOKENS} (the target and three input tokens), not "
            f"{args.max_tokens}"
        )


def parse_rates(value: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise InputError(f"--rates takes comma-separated percentages such as 10,50, not {value!r}") from None


def parse_layer(value: str) -> int | None:
    if value.strip().lower() == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--layers takes all or one layer index, not {value!r}") from None


def parse_measures(value: str) -> tuple[str, ...]:
    if value.strip().lower() == "default":
        return RANKED_MEASURES
    if value.strip().lower() == "all":
        return ALL_MEASURES
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parse_scopes(value: str) -> tuple[str, ...]:
    scopes = tuple(dict.fromkeys(part.strip().lower() for part in value.split(",") if part.strip()))
    bad = [s for s in scopes if s not in RANK_SCOPES]
    if bad or not scopes:
        raise InputError(f"--scopes takes some of {', '.join(RANK_SCOPES)}, comma-separated; not {value!r}")
    return scopes
