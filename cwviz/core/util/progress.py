"""Progress callbacks for the long steps: ``progress(done, total)`` after each unit of work (a layer).

Every library function that loops over layers (:func:`cwviz.analyze`, the head summary, the top keys across
layers, the sink table, the sink intervention) takes ``progress=None`` or such a callable. It is called
with ``done`` from 1 to ``total`` (always ending with ``done == total``) on the calling thread; it must
not raise. The dashboard shows it as ``st.progress`` (:func:`cwviz.app.services.progress_bar`), the CLI as a
tqdm bar (:func:`cli_bar`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

Progress = Callable[[int, int], None]
T = TypeVar("T")


def counted(items: Iterable[T], total: int, progress: Progress | None) -> Iterator[T]:
    """Yield ``items`` and report ``progress(k, total)`` after the k-th has been processed."""
    for done, item in enumerate(items, start=1):
        yield item
        if progress is not None:
            progress(done, total)


def phase(progress: Progress | None, offset: int, total: int) -> Progress | None:
    """One phase of a longer step: ``done`` of the phase is reported as ``offset + done`` of ``total``."""
    if progress is None:
        return None
    return lambda done, _phase_total: progress(offset + done, total)


@contextlib.contextmanager
def cli_bar(description: str, unit: str = "layer", enabled: bool = True) -> Iterator[Progress | None]:
    """A tqdm bar on stderr as a :data:`Progress` callback (None when ``enabled`` is false).

    tqdm shows nothing for steps under half a second (``delay``), so short runs stay quiet.
    """
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    # A terminal's bar is cleared when done; elsewhere (a log) it cannot be, so its last state stays on a line of its
    # own.
    with tqdm(desc=description, unit=unit, file=sys.stderr, delay=0.5, leave=not sys.stderr.isatty()) as bar:

        def update(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)  # through update, which tqdm's delay and its closing line count on

        yield update


def print_line(text: str) -> None:
    """``text`` on stderr on a line of its own (an ``interrupted`` line): on a terminal the line is first cleared of
    the ``^C`` it echoed and of any progress bar; in a log, a bar still drawn gets its line ended first."""
    stream = sys.stderr
    std = sys.modules.get("tqdm.std")  # imported only where a bar was made
    bars = [bar for bar in getattr(getattr(std, "tqdm", None), "_instances", ()) if not getattr(bar, "disable", True)]
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    prefix = "\r\033[K" if tty else "\n" if bars else ""
    print(prefix + text, file=stream, flush=True)


def items_left_text(done: int, total: int, seconds: Sequence[float], unit: str = "item") -> str:
    """What a run over many items says while item ``done + 1`` of ``total`` runs: "item 3 of 5, about 4 min left".

    ``seconds`` are the measured times of the items this run finished, in order. The first item carries the warm-up
    (the first conversion, caches) and is left out of the estimate once another has been timed; before any has
    finished the text says no estimate yet, rather than guess."""
    if done >= total:
        return f"{total} of {total} {unit}s done"
    where = f"{unit} {done + 1} of {total}"
    if not seconds:
        return f"{where} (an estimate follows the first {unit})"
    typical = seconds[1:] if len(seconds) > 1 else seconds
    left = sum(typical) / len(typical) * (total - done)
    if left < 60:
        return f"{where}, about {max(5, round(left / 5) * 5):.0f} s left"
    return f"{where}, about {round(left / 60):.0f} min left"
