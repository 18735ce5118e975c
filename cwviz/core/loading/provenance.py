"""A run's provenance: what identifies the model's numbers and the software that computed them.

A results manifest records both (:func:`model_provenance` in every record type's settings, :func:`versions` in the
command line's manifest), so that a resumed run refuses results of another model and a reader knows what made them.
"""

from __future__ import annotations

import hashlib
import platform
from typing import TYPE_CHECKING

import torch
import transformers

from ... import __version__

if TYPE_CHECKING:
    from .models import Bundle

#: How many of each parameter's first values the weight hash covers: fast on a 7B model, and two checkpoints of one
#: architecture differ there.
HASHED_VALUES = 4096


def weights_sha256(model: torch.nn.Module) -> str:
    """A hash of every parameter's name, shape, dtype and first :data:`HASHED_VALUES` values."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in model.named_parameters():
            digest.update(f"{name}{tuple(param.shape)}{param.dtype}".encode())
            digest.update(param.detach().flatten()[:HASHED_VALUES].float().cpu().numpy().tobytes())
    return digest.hexdigest()


def model_provenance(bundle: Bundle) -> dict:
    """What identifies the model's numbers: id, hub revision (when known), a hash of its weights, dtype, device.

    A dict on purpose: it is written as it is into a run's settings (JSON) and compared with what a resumed run's
    file holds."""
    info = bundle.info
    return {
        "id": info.id,
        "architecture": info.architecture,
        "revision": getattr(bundle.model.config, "_commit_hash", None),
        "weights_sha256": weights_sha256(bundle.model),
        "dtype": info.dtype,
        "device": info.device,
    }


def versions() -> dict[str, str]:
    """The versions a run's manifest records (JSON, as :func:`model_provenance`): cwviz, torch, transformers, Python."""
    return {
        "cwviz": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
