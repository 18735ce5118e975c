"""The command line: ``cwviz <command> ...`` (the same as ``python -m cwviz <command> ...``).

Each command lives in :mod:`cwviz.cli` as a module with ``register(subparsers)``, which adds its
parser and sets ``func``. Errors a user can fix (:class:`~cwviz.core.errors.CwvizError`, unreadable files)
end the program with one ``error: ...`` line on stderr and exit status 2, never a traceback.

SIGTERM is handled as Ctrl-C (SIGINT): the long commands (``faithfulness``, ``sinks``) keep every finished
example, print their results, and end with one ``interrupted: kept ...`` line on stderr and status 130.
A reader of standard output that leaves early (``| head``) ends the program quietly with status 141; the
commands write their files before they print.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading

from ..core.errors import CwvizError
from ..core.heap import tune_heap
from ..core.settings import check_environment


def build_parser() -> argparse.ArgumentParser:
    """The ``cwviz`` parser. Each command is a module with ``register(subparsers)``; add a command by listing its
    module here. They are imported here, not at the top of this module: importing them imports torch and transformers
    (seconds), and :func:`main` must be already running to turn a Ctrl-C in that time into one line, not a traceback."""
    from . import analyze, app, atlas, claims, compare, faithfulness, flow, flow_faithfulness, report, sinks

    parser = argparse.ArgumentParser(prog="cwviz", description="Contribution weights for attention layers.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (analyze, sinks, faithfulness, claims, flow_faithfulness, report, compare, atlas, flow, app):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0, 2 for an error the user can fix, 130 when interrupted)."""
    try:
        return _run(argv)
    except KeyboardInterrupt:  # during start-up: the imports, the parsing (a command's own run handles its own)
        print("interrupted", file=sys.stderr)
        return 130


def _error_line(err: BaseException) -> str:
    """``error: <message>`` on one line, whatever the message holds (a library's message may span lines)."""
    return "error: " + " ".join(str(err).split())


@contextlib.contextmanager
def _exit_at_once_on_ctrl_c():
    """Ctrl-C while the commands import torch and transformers: one ``interrupted`` line and status 130 at once.

    A KeyboardInterrupt raised there can land in torch's C++ import code, which then aborts the process
    ("terminate called after throwing an instance of 'pybind11::error_already_set'", status -6) instead of
    unwinding; nothing has been read or written yet, so the handler ends the process itself. Left alone off the
    main thread, and where SIGINT is ignored (a job started in the background)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def leave(signum, frame) -> None:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
        os._exit(130)

    previous = signal.signal(signal.SIGINT, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(argv: list[str] | None) -> int:
    with _exit_at_once_on_ctrl_c():
        parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    # `cwviz app ...` hands everything after `app` to `streamlit run` as it is: argparse's REMAINDER does
    # not take options that come first (`cwviz app --server.port 8502` was refused).
    start = 0
    while start < len(argv) and argv[start] in ("-v", "--verbose"):
        start += 1
    rest = argv[start + 1 :]
    if start < len(argv) and argv[start] == "app" and rest not in (["-h"], ["--help"]):
        args = parser.parse_args(argv[: start + 1])
        args.streamlit_args = rest
    else:
        args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if not args.verbose:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    args.argv = argv  # the manifest of a sweep records the command
    tune_heap()  # the command owns its process: the row blocks' buffers stay in its heap (cwviz.core.heap)
    previous = _sigterm_as_interrupt()
    try:
        check_environment()  # CWVIZ_CACHE and CWVIZ_MEMORY_BYTES, before any file is read or model loaded
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a broken pipe shows here, not at exit, where it could not be handled
        return code
    except CwvizError as err:
        print(_error_line(err), file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of standard output left (`cwviz sinks ... | head -2`). The commands write their files before
        # they print, so nothing is lost: no error line, and status 141 (128 + SIGPIPE), what a shell reports for
        # a program the broken pipe ended (as `set -o pipefail` expects), rather than 0, which would hide it.
        _silence_stdout()
        return 141
    except (OSError, UnicodeDecodeError) as err:
        print(_error_line(err), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _silence_stdout() -> None:
    """Point standard output at /dev/null, so that flushing what is left in its buffer at exit (to the broken
    pipe) raises nothing more (the Python docs' recipe for SIGPIPE); a replaced stdout without a file is left."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _sigterm_as_interrupt():
    """Make SIGTERM raise KeyboardInterrupt (as SIGINT does); returns the handler it replaced, or None off
    the main thread (where signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)
