"""Refuse up front what would not fit, instead of being killed by the operating system.

:func:`estimate` gives the bytes an analysis of T tokens needs at its peak; :func:`check` compares it
with what the device has available (``MemAvailable`` of ``/proc/meminfo`` on Linux CPUs,
``torch.cuda.mem_get_info`` on CUDA; elsewhere nothing is checked) and raises
:class:`~cwviz.core.errors.ResourceError` with both figures. :func:`guard` turns a CUDA out-of-memory error
into the same error, after freeing the cache, so that the app keeps working.

The estimate (float32 measures, model dtype for what the forward pass keeps):

* recorded per layer: queries and head outputs [heads, T, d_head], keys and values [kv_heads, T, d_head];
* forward pass: the widest activation, [T, intermediate] x 3, and one chunk of logits when the
  log-probabilities are computed ([LOGIT_CHUNK, vocab], in the model's dtype and in float32);
* per-layer maps: attention and both contributions of the two layers kept and of the layer being
  computed, and two more for a dot product or cosine asked for: 11 x heads x T² float32.

Against the peaks measured by ``python -m benchmarks.run --only memory`` on the embedded model (peak
resident size above the loaded model, which also holds allocator slack; BENCHMARKS.md) the estimate is
1.68x (T = 128), 1.15x (512), 1.01x (1024) and 1.02x (2048) what was measured; ``HEADROOM`` keeps a
fifth of what is available in reserve on top.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from .errors import ResourceError

#: Rows of logits made at a time (the default chunk of :func:`cwviz.core.analysis.next_token_logprobs`).
LOGIT_CHUNK = 256
#: Share of the available memory an analysis may plan to use (the rest is for everything else).
HEADROOM = 0.8


def estimate(config, info, tokens: int) -> dict[str, int]:
    """Bytes needed to analyse ``tokens`` tokens with a model of this config and ModelInfo."""
    item = torch.finfo(getattr(torch, info.dtype)).bits // 8 if hasattr(torch, info.dtype) else 4
    width = info.d_head * (2 * info.heads + 2 * info.kv_heads)
    recorded = info.layers * tokens * width * item
    vocab = getattr(config, "vocab_size", 0) or 0
    intermediate = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * info.d_model
    forward = min(tokens, LOGIT_CHUNK) * vocab * (item + 4) + 3 * tokens * intermediate * 4
    maps = 11 * info.heads * tokens * tokens * 4
    return {"recorded": recorded, "forward": forward, "maps": maps, "total": recorded + forward + maps}


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
    return f"{n / 1e9:.1f} GB"


def check(config, info, tokens: int, device: torch.device) -> None:
    """Raise ResourceError when the estimate exceeds the available memory (``CWVIZ_MEMORY_BYTES``
    overrides what is available, for hosting and tests)."""
    need = estimate(config, info, tokens)
    override = os.environ.get("CWVIZ_MEMORY_BYTES")
    have = int(float(override)) if override else available(device)
    if have is None:
        return
    if need["total"] > HEADROOM * have:
        raise ResourceError(
            f"a prompt of {tokens:,} tokens needs about {_gb(need['total'])} (forward pass {_gb(need['forward'])}, "
            f"recorded layers {_gb(need['recorded'])}, per-layer maps {_gb(need['maps'])}) but only "
            f"{_gb(have)} is available on {device.type}; use a shorter prompt or a smaller model"
        )


@contextlib.contextmanager
def guard(device: torch.device) -> Iterator[None]:
    """Report a CUDA out-of-memory error as ResourceError, after emptying the cache."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise ResourceError(f"the {device.type} device ran out of memory ({str(err).splitlines()[0]}); use a shorter prompt") from None
