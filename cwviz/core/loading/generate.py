"""Greedy continuation of a prompt, so the dashboard can show what the model attended to while writing."""

from __future__ import annotations

import inspect

import torch

from ..util.errors import InputError
from ..util.progress import Progress
from .models import Bundle

MAX_NEW_TOKENS = 256


def greedy_continuation(
    bundle: Bundle, prompt_ids: list[int], new_tokens: int, progress: Progress | None = None
) -> list[int]:
    """``prompt_ids`` followed by up to ``new_tokens`` greedily chosen tokens (stops early at EOS).
    ``progress(done, new_tokens)`` (:mod:`cwviz.core.util.progress`) is called after each token.

    Runs outside any cwviz recording, so the model uses its ordinary (SDPA) attention. Encoder models
    cannot generate.
    """
    if not 0 <= new_tokens <= MAX_NEW_TOKENS:
        raise InputError(f"tokens to generate must lie in 0..{MAX_NEW_TOKENS}, not {new_tokens}")
    if new_tokens == 0:
        return list(prompt_ids)
    if not bundle.arch.causal:
        raise InputError(
            f"{bundle.info.id} is an encoder ({bundle.info.architecture}) and cannot generate: generating text needs a "
            "causal language model (such as 'embedded'); set tokens to generate to 0"
        )
    device = bundle.input_device
    ids = torch.tensor([list(prompt_ids)], device=device)
    eos = (
        getattr(bundle.model.generation_config, "eos_token_id", None)
        if hasattr(bundle.model, "generation_config")
        else None
    )
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    out = list(prompt_ids)
    # transformers 5.24 renamed past_key_values to cache (the old name warns until 5.40); use the
    # model's own name so no deprecation warning is raised and older 5.x releases keep working.
    name = "cache" if "cache" in inspect.signature(bundle.model.forward).parameters else "past_key_values"
    past = None
    with torch.inference_mode():
        step = ids
        for done in range(1, new_tokens + 1):
            result = bundle.model(input_ids=step, use_cache=True, **{name: past})
            past = getattr(result, name)
            next_id = int(result.logits[0, -1].argmax())
            out.append(next_id)
            if progress is not None:
                progress(new_tokens if next_id in eos_ids else done, new_tokens)
            if next_id in eos_ids:
                break
            step = torch.tensor([[next_id]], device=device)
    return out
