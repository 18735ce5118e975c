"""Refuse up front what would not fit, instead of being killed by the operating system.

:func:`estimate` gives the bytes an analysis of T tokens needs at its peak; :func:`check` compares it
with what the device has available (``MemAvailable`` of ``/proc/meminfo`` on Linux CPUs,
``torch.cuda.mem_get_info`` on CUDA; elsewhere nothing is checked) and raises
:class:`~cwviz.core.util.errors.ResourceError` with both figures. :func:`guard` turns a CUDA out-of-memory error
into the same error, after freeing the cache, so that the app keeps working.

The estimate of :func:`estimate` (float32 measures, model dtype for what the forward pass keeps) is the
working set of the dashboard and the CLI, which read every T x T quantity in blocks of query rows
(:meth:`cwviz.Analysis.row_blocks`, :meth:`cwviz.Analysis.rows`) and never hold a layer's maps:

* recorded per layer: queries and head outputs [heads, T, d_head], keys and values [kv_heads, T, d_head],
  and the value norms [heads, T] (float32); when the records go to disk (:mod:`cwviz.core.method.spill`, long prompts
  on the CPU), only the layers read back and the one being written, beside every layer's value norms; and the
  layer being read in row blocks as :func:`cwviz.core.method.row_blocks.for_row_blocks` prepares it
  (:data:`PREPARED_MAPS`);
* forward pass: the widest activation, [T, intermediate] x 3, and one chunk of logits when the
  log-probabilities are computed ([LOGIT_CHUNK, vocab], in the model's dtype and in float32);
* maps: :data:`ROW_BLOCK_MAPS` float32 maps of one row block, [heads, cells] with cells = the block's rows x T
  (:func:`cwviz.core.method.row_block_sizes.row_block_cells`; the whole T x T for prompts shorter than a block);
* slack: :data:`SLACK` of the three above, for what no formula counts (the allocator's fragmentation, the
  tokenizer's encodings, pandas frames of the charts): the three terms are a central estimate of the measured
  peaks, which grow with contention for the CPU, and the slack makes the total a bound;
* heap, with the records on disk only: :data:`HEAP_ALLOWANCE`. The counted terms are then small, and what varies
  is the heap a layer's row blocks leave (their maps are freed and made again block after block, and glibc keeps
  freed memory); in a process whose entry point opted in (:func:`cwviz.core.util.heap.tune_heap`: the dashboard's
  server, the ``cwviz`` command) it is returned to the system each time a layer is read back
  (:func:`cwviz.core.util.heap.trim_heap`), so it stays within one layer's worth.

The whole-layer maps of the API (:meth:`cwviz.Analysis.layer` and the methods on it, e.g. ``attention``)
are checked when they are asked for (:func:`check_layer_maps`): :data:`LAYER_MAPS` x heads x T² float32.

The figures measured on the embedded model are in BENCHMARKS.md (``python -m benchmarks.run --only memory``)
and tests/core/test_long.py checks an 8,192-token prompt through the dashboard's services against this estimate;
``HEADROOM`` keeps a fifth of what is available in reserve on top.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from ..util.errors import ResourceError
from ..util.settings import memory_override
from .logprobs import LOGIT_CHUNK
from .row_block_sizes import row_block_cells
from .spill import LOADED

#: Share of the available memory an analysis may plan to use (the rest is for everything else).
HEADROOM = 0.8
#: Float32 maps of one row block alive at once: attention and its scores, both contribution kinds, a measure's
#: products (cosine, norm ratio) and the copies the charts and reductions make of them.
ROW_BLOCK_MAPS = 11
#: Float32 [heads, T, d_head] tensors of the layer being read in row blocks
#: (:func:`cwviz.core.method.row_blocks.for_row_blocks`): its queries, and its keys and values held at most once a head.
PREPARED_MAPS = 3
#: Float32 [heads, T, T] maps one whole layer makes (attention, both contributions, a measure's products),
#: for the API's whole-layer methods.
LAYER_MAPS = 5
#: Share added to the estimate's counted terms for what they do not count (see the module docstring).
SLACK = 0.35
#: Bytes added for the heap a layer's row blocks leave when the records are on disk (see the module docstring).
HEAP_ALLOWANCE = 256 << 20


def _item(info) -> int:
    return torch.finfo(getattr(torch, info.dtype)).bits // 8 if hasattr(torch, info.dtype) else 4


def records_bytes(info, tokens: int) -> int:
    """Bytes of one pass's records: every layer's queries, keys, values and head outputs of ``tokens`` tokens."""
    return info.layers * tokens * info.d_head * (2 * info.heads + 2 * info.kv_heads) * _item(info)


def stream_bytes(info, tokens: int) -> int:
    """Bytes of a kept residual stream (``analyze(stream=True)``, :class:`~cwviz.core.method.residual.LayerStream`):
    each layer's [T, d_model] target and its four [T] rows, float32."""
    return info.layers * tokens * (info.d_model + 4) * 4


def estimate(
    config, info, tokens: int, device: torch.device | str = "cpu", spilled: bool = False, stream: bool = False
) -> dict[str, int]:
    """Bytes needed to analyse ``tokens`` tokens with a model of this config and ModelInfo on ``device``, read
    in row blocks. ``spilled``: the records go to disk (:mod:`cwviz.core.method.spill`), so memory holds the layers read
    back and the one being written, and ``disk`` counts the file. ``stream``: the analysis keeps its residual stream
    (``analyze(stream=True)``, :func:`stream_bytes`)."""
    item = _item(info)
    whole = records_bytes(info, tokens)
    kept = whole * min(info.layers, LOADED + 1) // info.layers if spilled else whole
    recorded = kept + info.layers * tokens * 4 * info.heads  # + the value norms, float32 [head, T] a layer
    recorded += PREPARED_MAPS * info.heads * tokens * info.d_head * 4  # + the layer read in row blocks (for_row_blocks)
    recorded += stream_bytes(info, tokens) if stream else 0
    vocab = getattr(config, "vocab_size", 0) or 0
    intermediate = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * info.d_model
    if isinstance(intermediate, (list, tuple)):  # one width per layer (Gemma 3n): the widest is the peak
        intermediate = max(intermediate)
    forward = min(tokens, LOGIT_CHUNK) * vocab * (item + 4) + 3 * tokens * intermediate * 4
    maps = ROW_BLOCK_MAPS * info.heads * row_block_cells(tokens, device) * 4
    slack = int(SLACK * (recorded + forward + maps))
    heap = HEAP_ALLOWANCE if spilled else 0  # see the module docstring: the heap the row blocks leave
    total = recorded + forward + maps + slack + heap
    return {
        "recorded": recorded,
        "forward": forward,
        "maps": maps,
        "slack": slack,
        "heap": heap,
        "total": total,
        "disk": whole if spilled else 0,
    }


def _have(device: torch.device) -> int | None:
    override = memory_override()
    return override if override is not None else available(device)


def available(device: torch.device) -> int | None:
    """Bytes free on ``device`` now, or None where we cannot tell."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        meminfo = Path("/proc/meminfo")
        if meminfo.exists():
            for line in meminfo.read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return None


def _gb(n: int) -> str:
    """``n`` bytes in the largest unit that leaves a whole number above 0.1 (``2.5 GB``, ``40.0 MB``, ``1000 bytes``):
    a small ``CWVIZ_MEMORY_BYTES`` must not read as "0.0 GB"."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= 0.1 * size:
            return f"{n / size:.1f} {unit}"
    return f"{n:,} bytes"


def _short_of(have: int, device: torch.device, advice: str) -> str:
    """ "only N is available on DEVICE; ``advice``", naming ``CWVIZ_MEMORY_BYTES`` when that set N."""
    if memory_override() is not None:
        return (
            f"only {_gb(have)} is available on {device.type}, as "
            f"CWVIZ_MEMORY_BYTES={os.environ['CWVIZ_MEMORY_BYTES'].strip()} says; "
            f"raise or unset CWVIZ_MEMORY_BYTES, or {advice}"
        )
    return f"only {_gb(have)} is available on {device.type}; {advice}"


def check(config, info, tokens: int, device: torch.device, spilled: bool = False, stream: bool = False) -> None:
    """Raise ResourceError when the estimate exceeds the available memory (``CWVIZ_MEMORY_BYTES``
    overrides what is available, for hosting and tests)."""
    need = estimate(config, info, tokens, device, spilled, stream)
    have = _have(device)
    if have is None:
        return
    if need["total"] > HEADROOM * have:
        raise ResourceError(
            f"a prompt of {tokens:,} tokens needs about {_gb(need['total'])} (forward pass {_gb(need['forward'])}, "
            f"recorded layers {_gb(need['recorded'])}, per-layer maps {_gb(need['maps'])}) but "
            + _short_of(have, device, "use a shorter prompt or a smaller model")
        )


def check_fits(need: int, device: torch.device, what: str, advice: str) -> None:
    """Raise ResourceError "``what`` needs about N GB but only M GB is available on DEVICE; ``advice``" when
    ``need`` bytes exceed the share of the available memory an analysis may use."""
    have = _have(device)
    if have is not None and need > HEADROOM * have:
        raise ResourceError(f"{what} needs about {_gb(need)} but {_short_of(have, device, advice)}")


def check_layer_maps(info, tokens: int, device: torch.device) -> None:
    """Raise ResourceError when one layer's whole [heads, T, T] maps would not fit (the API's whole-layer methods)."""
    check_fits(
        LAYER_MAPS * info.heads * tokens * tokens * 4,
        device,
        f"a whole layer's maps of a {tokens:,}-token prompt",
        "read the layer in blocks of query rows instead (Analysis.rows(layer, start, stop) or "
        "Analysis.row_blocks(layer))",
    )


@contextlib.contextmanager
def guard(device: torch.device) -> Iterator[None]:
    """Report a CUDA out-of-memory error as ResourceError, after emptying the cache."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise ResourceError(
            f"the {device.type} device ran out of memory ({str(err).splitlines()[0]}); use a shorter prompt"
        ) from None
