"""The process's heap (glibc on Linux): what an entry point that owns its process opts in to.

The library leaves the allocator alone: :func:`cwviz.analyze` sets nothing, and nothing of cwviz trims the heap on its
own. A process that owns itself, the dashboard's server and the ``cwviz`` command, calls :func:`tune_heap` at its
start, which opts it in to both:

* the buffers a recording pass and the row blocks make again and again (a block's maps are about 10 MB, remade block
  after block) are reused from the heap instead of being mapped afresh, page by page, each time (mapping every buffer
  of 1 MiB or more on its own costs page faults: about a third more CPU time for the pass);
* :func:`trim_heap` returns the heap's free pages to the system where cwviz marks a point for it: before a layer of
  records kept on disk is read back (:mod:`cwviz.core.method.spill`), so that reading a long prompt through holds one
  layer's worth of heap rather than a growing one, and in the dashboard after each recording pass, since its server
  lives on between prompts. In a process that has not opted in (a notebook, a host application) it does nothing.

Elsewhere than glibc, or with ``CWVIZ_MALLOC_TUNING=0``, both do nothing. The figures are in BENCHMARKS.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading

#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Buffers below this size come from the heap and are reused there: a row block's maps and a pass's activations.
MMAP_THRESHOLD = 32 << 20
#: The heap's free top is not given back below this size, so the next pass and the next blocks find it again.
TRIM_THRESHOLD = 512 << 20
_LOCK = threading.Lock()
#: The C library, once an entry point has opted in (:func:`tune_heap`); None before, and where there is none.
_opted_in = None


def _libc():
    if not sys.platform.startswith("linux") or os.environ.get("CWVIZ_MALLOC_TUNING", "1") == "0":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def tune_heap() -> None:
    """Keep large buffers in the heap (:data:`MMAP_THRESHOLD`, :data:`TRIM_THRESHOLD`) and let :func:`trim_heap` trim
    it: for an entry point that owns its process (the dashboard's server, the ``cwviz`` command), never for a library
    call. The settings are the process's and are made once; later calls (each rerun of the dashboard's script) change
    nothing."""
    global _opted_in
    libc = _libc()
    if libc is None:
        return
    with _LOCK:
        if _opted_in is None:
            libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            _opted_in = libc


def trim_heap() -> None:
    """Return the heap's free pages to the system (glibc ``malloc_trim``), in a process whose entry point opted in
    (:func:`tune_heap`); elsewhere nothing.

    Called when a layer of records on disk is read back: the row blocks' maps and the query side of the layer before
    are freed by then, and glibc would keep their pages (scattered between live buffers, so never returned at the
    heap's top). The dashboard calls it after each recording pass too, for the activations the pass freed.
    """
    with _LOCK:
        if _opted_in is not None:
            _opted_in.malloc_trim(0)
