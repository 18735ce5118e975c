"""Next-token log-probabilities from final hidden states, and the perplexity they give."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

#: Rows of logits made at a time: [LOGIT_CHUNK, vocab] is the largest tensor, whatever the prompt's length.
LOGIT_CHUNK = 256


def logprobs_from_hidden(
    hidden: torch.Tensor, output_logits: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor, chunk: int = LOGIT_CHUNK
) -> torch.Tensor:
    """log p(token_{t+1} | tokens ..t) for t = 0..T-2, float32 [T - 1] on the CPU.

    From the final hidden states ``hidden`` [T, d_model] and the model's ``output_logits``
    (:meth:`cwviz.core.loading.models.Bundle.output_logits`: the output layer with the family's logit scaling or
    soft-capping), run on ``chunk`` rows at a time, each chunk's logits turned into a log-sum-exp in place:
    no [T, vocab] tensor is made.
    """
    out = []
    for start in range(0, hidden.shape[0] - 1, chunk):
        end = min(start + chunk, hidden.shape[0] - 1)
        logits = output_logits(hidden[start:end]).float()  # (rows, vocab), a fresh tensor
        target = logits.gather(1, ids[start + 1 : end + 1, None].to(logits.device))[:, 0]
        peak = logits.amax(dim=-1, keepdim=True)
        out.append(target - logits.sub_(peak).exp_().sum(-1).log_() - peak[:, 0])
    return torch.cat(out).cpu() if out else torch.zeros(0)


def perplexity_of(logprobs: np.ndarray | torch.Tensor) -> float:
    """exp of the mean negative log-probability (mean taken in float64); nan when there are none."""
    logprobs = np.asarray(logprobs, dtype=np.float64)
    return math.exp(-logprobs.mean()) if logprobs.size else math.nan


def prompt_logprobs(bundle, final_hidden: torch.Tensor | None, input_ids: list[int]) -> np.ndarray:
    """log p(token_{t+1} | tokens ..t) of a prompt, float32 numpy [T - 1], from its final hidden states ``final_hidden``
    [T, d_model] and ``bundle``'s output layer (a row chunk at a time); empty without them or for an encoder."""
    if final_hidden is None or not bundle.has_logits:
        return np.zeros(0, dtype=np.float32)
    with torch.inference_mode():
        return logprobs_from_hidden(final_hidden, bundle.output_logits, torch.tensor(input_ids)).numpy()
