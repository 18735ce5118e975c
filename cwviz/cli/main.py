"""The command line: ``cwviz <command> ...`` (the same as ``python -m cwviz <command> ...``).

Every command's parser is in :mod:`cwviz.cli.parsers`, which imports neither torch nor transformers: ``--help``
and argument errors answer at once. Once the arguments are parsed, the one module that runs the command (its
parser's ``command_module``, with ``run(args) -> int``) is imported, and with it what the command needs.

Errors a user can fix (:class:`~cwviz.core.util.errors.CwvizError`, unreadable files) end the program with one
``error: ...`` line on stderr and exit status 2, never a traceback.

SIGTERM is handled as Ctrl-C (SIGINT): the long commands (``faithfulness``, ``sinks``) keep every finished
example, print their results, and end with one ``interrupted: kept ...`` line on stderr and status 130.
A reader of standard output that leaves early (``| head``) ends the program quietly with status 141; the
commands write their files before they print.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import threading

from ..core.util.errors import CwvizError
from ..core.util.heap import tune_heap
from ..core.util.progress import print_line
from ..core.util.settings import check_environment, os_error_message
from .parsers import build_parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0, 2 for an error the user can fix, 130 when interrupted)."""
    try:
        return _run(argv)
    # during start-up: the parsing, the command's imports (a command's own run handles its own)
    except KeyboardInterrupt:
        print_line("interrupted")
        return 130


def _error_line(err: BaseException) -> str:
    """``error: <message>`` on one line, whatever the message holds (a library's message may span lines)."""
    return "error: " + " ".join(str(err).split())


@contextlib.contextmanager
def _exit_at_once_on_ctrl_c():
    """Ctrl-C while a command's module imports torch and transformers: one ``interrupted`` line and status 130 at once.

    A KeyboardInterrupt raised there can land in torch's C++ import code, which then aborts the process
    ("terminate called after throwing an instance of 'pybind11::error_already_set'", status -6) instead of
    unwinding; nothing has been read or written yet, so the handler ends the process itself. Left alone off the
    main thread, and where SIGINT is ignored (a job started in the background)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
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
    try:
        if getattr(args, "early_check", None) is not None:
            # the values that need no model, refused before torch is imported (cwviz.cli.options)
            args.early_check(args)
    except CwvizError as err:
        print(_error_line(err), file=sys.stderr)
        return 2
    with _exit_at_once_on_ctrl_c():
        command = importlib.import_module(args.command_module)  # the one command's module: torch, for most
    if not args.verbose:
        _quiet_transformers()
    args.argv = argv  # the manifest of a sweep records the command
    tune_heap()  # the command owns its process: the row blocks' buffers stay in its heap (cwviz.core.util.heap)
    previous = _sigterm_as_interrupt()
    try:
        check_environment()  # CWVIZ_CACHE and CWVIZ_MEMORY_BYTES, before any file is read or model loaded
        code = int(command.run(args) or 0)
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
    except OSError as err:
        print(_error_line(os_error_message(err)), file=sys.stderr)
        return 2
    except UnicodeDecodeError as err:
        print(_error_line(err), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print_line("interrupted")
        return 130
    finally:
        if previous is not None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _quiet_transformers() -> None:
    """No progress bars or warnings from transformers, when the command's module has imported it (``cwviz app``, which
    does not, is not made to import it for this)."""
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()


def _silence_stdout() -> None:
    """Point standard output at /dev/null, so that flushing what is left in its buffer at exit (to the broken
    pipe) raises nothing more (the Python docs' recipe for SIGPIPE); a replaced stdout without a file is left."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


class _Interrupt:
    """The handler of SIGINT and SIGTERM while a command runs: the first raises KeyboardInterrupt (the command keeps
    what is finished and says so); a second, while it does that, ends the process at once with one line and status 130,
    never a traceback from wherever it landed (a closing progress bar, the error handler)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1:
            raise KeyboardInterrupt
        sys.stderr.write("\ninterrupted again: stopped at once (the files written before are kept)\n")
        sys.stderr.flush()
        os._exit(130)


def _sigterm_as_interrupt() -> dict | None:
    """Make SIGTERM raise KeyboardInterrupt as SIGINT does, and a second signal end the process at once
    (:class:`_Interrupt`); returns the handlers it replaced, or None off the main thread (where signals cannot be
    handled). SIGINT is left alone where it is ignored (a job started in the background)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = _Interrupt()
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, handler)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, handler)
    return previous
