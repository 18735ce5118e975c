"""Next-token log-probabilities from final hidden states, and the perplexity they give."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ..util.errors import ModelLoadError

#: Rows of logits made at a time: [LOGIT_CHUNK, vocab] is the largest tensor, whatever the prompt's length.
LOGIT_CHUNK = 256


def logprobs_from_hidden(
    hidden: torch.Tensor,
    output_logits: Callable[[torch.Tensor], torch.Tensor],
    ids: torch.Tensor,
    chunk: int = LOGIT_CHUNK,
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


def prompt_logprobs(bundle, final_hidden: torch.Tensor | None, input_ids: list[int], own: bool = False) -> np.ndarray:
    """log p(token_{t+1} | tokens ..t) of a prompt, float32 numpy [T - 1], from its final hidden states ``final_hidden``
    [T, d_model] and ``bundle``'s output layer (a row chunk at a time); empty without them or for an encoder. ``own``:
    the pass of the model as it is, whose mean must lie in (-:data:`MAX_NLL`, 0] (ModelLoadError naming the model
    otherwise: NaN, or so low that its perplexity overflows)."""
    if final_hidden is None or not bundle.has_logits:
        return np.zeros(0, dtype=np.float32)
    with torch.inference_mode():
        logprobs = logprobs_from_hidden(final_hidden, bundle.output_logits, torch.tensor(input_ids)).numpy()
    if own and logprobs.size and not -MAX_NLL < float(logprobs.astype(np.float64).mean()) <= 0:
        raise damaged(bundle, f"a mean next-token log-probability of {logprobs.mean():.4g}")
    return logprobs


#: The largest mean negative log-likelihood (nats a token) a model's own pass may give: exp of more overflows a float64
#: perplexity, and a model that guesses uniformly from its whole vocabulary gives about 11 (SmolLM2's 49,152 tokens).
MAX_NLL = 700.0


def final_states(bundle, hidden: torch.Tensor, intervention: object | None) -> torch.Tensor | None:
    """The log-probabilities' input from a pass's final hidden states ``hidden`` [T, d_model]: ``hidden`` itself, None
    for an encoder (it has no next-token logits). ModelLoadError naming the model when a pass of the model as it is
    (no ``intervention``) gave states that are not finite: a table of NaN is never returned as results."""
    if intervention is None and not bool(torch.isfinite(hidden).all()):
        raise damaged(bundle, "hidden states that are not finite (NaN or infinite)")
    return hidden if bundle.arch.causal else None


def damaged(bundle, what: str) -> ModelLoadError:
    """The error that refuses a pass whose outputs no working model gives (``what``), naming the model."""
    return ModelLoadError(
        f"{bundle.info.id} gave {what} on this prompt, which no working model gives: its weights look damaged or "
        f"overflow in {bundle.info.dtype}; load it again (a cached conversion is checked and converted again), "
        "download it again, or try --dtype float32"
    )
