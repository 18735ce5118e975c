"""What a causal language model predicts next at one position of an analysed prompt: the Flow page's target and foil
pickers offer these tokens (the top one is the flow's default target, the second its default foil)."""

from __future__ import annotations

import pandas as pd
import torch

from ..core.method.analysis import Analysis

#: Tokens listed by :func:`next_tokens` by default.
TOP = 5


def next_tokens(analysis: Analysis, position: int, k: int = TOP, logits: torch.Tensor | None = None) -> pd.DataFrame:
    """The ``k`` most likely next tokens after ``position``: ``rank, token_id, token, probability, logit`` (rank 0 the
    model's top next token). ``logits``: the model's logits at ``position`` [vocab] when the caller has them (the flow's
    :class:`~cwviz.core.method.flow.FlowBasis`); else one forward pass of the prompt up to ``position`` (the analysis
    keeps no logits). Empty for an encoder, which predicts no next token."""
    columns = ["rank", "token_id", "token", "probability", "logit"]
    bundle = analysis.bundle
    if not bundle.has_logits:
        return pd.DataFrame(columns=columns)
    position = analysis.check_token(position)
    with torch.inference_mode():
        if logits is None:
            hidden = bundle.final_hidden(torch.tensor([analysis.input_ids[: position + 1]]))[0, -1]  # (d_model,)
            logits = bundle.output_logits(hidden[None])[0]  # (vocab,)
        logits = logits.float()
        top = logits.topk(k)
        probabilities = torch.softmax(logits, -1)[top.indices]
    token_ids = [int(i) for i in top.indices]
    return pd.DataFrame(
        {
            "rank": range(len(token_ids)),
            "token_id": token_ids,
            "token": [bundle.tokenizer.decode([i]) for i in token_ids],
            "probability": probabilities.cpu().numpy(),
            "logit": top.values.cpu().numpy(),
        },
        columns=columns,
    )
