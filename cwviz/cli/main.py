"""The command line: ``cwviz <command> ...`` (the same as ``python -m cwviz <command> ...``).

Each command lives in :mod:`cwviz.cli` as a module with ``register(subparsers)``, which adds its
parser and sets ``func``. Errors a user can fix (:class:`~cwviz.core.errors.CwvizError`, unreadable files)
end the program with one ``error: ...`` line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..core.errors import CwvizError
from . import analyze, app, faithfulness, sinks

#: Each command is a module with ``register(subparsers)``; add a command by listing its module here.
COMMANDS = (analyze, sinks, faithfulness, app)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cwviz", description="Contribution weights for attention layers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if not args.verbose:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    try:
        return int(args.func(args) or 0)
    except CwvizError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
