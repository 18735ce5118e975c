"""``analyze``: one recorded forward pass, and the :class:`Analysis` that computes measures from it.

What an :class:`Analysis` keeps grows linearly with the number of tokens T: per layer the queries,
keys and values ([heads or kv_heads, T, d_head]) and the final hidden states, from which the
log-probability of each next token is computed when first asked for. Its layers are read by the records reader it is
(:class:`~cwviz.core.method.records_reader.RecordsReader`: torch tensors, whole or in row blocks); this module adds
the prompt (text, ids, tokens), the log-probabilities, the checks and the numpy API.

The prompt is checked first (:mod:`cwviz.core.loading.inputs`: the model's positions, ``CWVIZ_MAX_TOKENS``); then the
memory check (:mod:`cwviz.core.method.memory`) refuses a prompt whose working set would not fit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

import numpy as np
import torch

from ..loading.inputs import check_agree, check_length, integer_index, tokenize
from ..loading.models import Bundle, ModelInfo
from ..util.errors import InputError, SelectionError
from ..util.progress import Progress
from ..util.tokens import display_tokens
from ..vocabulary import KINDS, check_kind
from . import memory
from .capture import Intervention, LayerRecord, forward_pass
from .logprobs import final_states, perplexity_of, prompt_logprobs
from .measures import MEASURES
from .records_reader import RecordsReader
from .residual import Stream, stream_hooks
from .row_blocks import RowBlockConsumer, row_block_attend
from .spill import by_layer, spill_for
from .state import checked


def analyze(
    bundle: Bundle,
    text: str | None = None,
    *,
    input_ids: list[int] | None = None,
    progress: Progress | None = None,
    each_row_block: RowBlockConsumer | None = None,
    kinds: tuple[str, ...] = KINDS,
    intervention: Intervention | None = None,
    stream: bool = False,
) -> Analysis:
    """Run the model once on ``text`` (or on ``input_ids``) and record every attention layer. Given both, they
    must be one prompt (:func:`~cwviz.core.loading.inputs.check_agree`), or InputError.

    ``progress(done, layers)`` (:mod:`cwviz.core.util.progress`) is called as each attention layer has run.

    ``intervention`` (:mod:`cwviz.core.method.interventions`, e.g. ``ScaleValues``) changes the pass from inside the
    attention function, for this call only: the records, measures and log-probabilities are those of the changed
    pass (what the sink intervention compares with the clean one), and :attr:`Analysis.intervention` keeps it, so
    a later pass of the same analysis (:func:`cwviz.analyses.sink_interventions.intervene_on_sink`) runs it too. None:
    the model as it is.

    ``stream``: also keep the pass's residual stream into the flow's default position (the last token, an encoder's
    first) as :attr:`Analysis.stream` (layers x T x d_model floats, in the memory check): the flow there runs no pass.

    ``each_row_block(layer, first, stop, measures)``: a reader of every layer (a whole-prompt reduction, an
    evaluation over a dataset) gets each layer's row blocks *during* the pass, in the row blocks and with the
    measures of :meth:`Analysis.row_blocks` (``kinds``: the contribution kinds they hold; their ``value`` is
    per head, [head, key, d_head]), layer after layer (:mod:`cwviz.core.method.row_blocks`). The measures are those of
    the returned :class:`Analysis` (which is as without ``each_row_block``), to float32 rounding. Keep reductions of
    the row blocks rather than the row blocks: together they are every layer's T x T maps.

    Raises :class:`~cwviz.core.util.errors.InputError` for an empty or over-long prompt and
    :class:`~cwviz.core.util.errors.ResourceError` when the estimate of :mod:`cwviz.core.method.memory` exceeds what
    is free.
    """
    if each_row_block is not None and intervention is not None:
        raise InputError("each_row_block reads the model's own pass; run an intervention without it")
    text, ids = _prompt(bundle, text, input_ids)
    device = bundle.input_device
    spill = spill_for(memory.records_bytes(bundle.info, len(ids)), device)
    memory.check(bundle.model.config, bundle.info, len(ids), device, spilled=spill is not None, stream=stream)
    attend = row_block_attend(bundle, each_row_block, kinds)
    batch = torch.tensor([ids], device=device)
    at = len(ids) - 1 if bundle.arch.causal else 0
    modules = bundle.attention_modules
    # The base model only: the output layer (T x vocab logits, the largest product for a small model and
    # a long prompt) runs when the log-probabilities are first asked for, in chunks of rows.
    with (
        memory.guard(device),
        torch.inference_mode(),
        forward_pass(modules, progress=progress, spill=spill, attend=attend, intervention=intervention) as records,
        stream_hooks(bundle, at) if stream else contextlib.nullcontext() as finish,
    ):
        hidden = bundle.final_hidden(batch)[0]  # (T, d_model)
    if (seen := len(records)) != (layers := bundle.info.layers):
        raise RuntimeError(f"recorded {seen} of {layers} layers; is the model's attention routed through cwviz?")
    final = final_states(bundle, hidden, intervention)  # the log-probabilities' input, checked; an encoder has none
    layer_records = by_layer(records, layers)
    kept = None if finish is None else finish(hidden)
    return Analysis(bundle, text, ids, layer_records, final_hidden=final, intervention=intervention, stream=kept)


def _prompt(bundle: Bundle, text: str | None, input_ids: list[int] | None) -> tuple[str, list[int]]:
    """The prompt's text and token ids: ``text`` tokenized, or ``input_ids`` checked and decoded (given ``text`` too,
    the two must say one prompt, or InputError)."""
    if input_ids is None:
        text = text if text is not None else ""
        return text, tokenize(bundle, text)
    ids = check_length(bundle, input_ids)
    if text is None:
        return bundle.tokenizer.decode(ids), ids
    return check_agree(bundle, text, ids), ids  # .text and .tokens say one prompt, or InputError


class Analysis(RecordsReader):
    """The result of :func:`analyze`: tokens, and every measure on demand.

    An analysis is the records reader of its pass (:class:`~cwviz.core.method.records_reader.RecordsReader`: torch
    tensors, whole layers or row blocks, every method checking the model's state first) with the prompt added: its
    ``text``, ``input_ids`` and ``tokens``, the next-token log-probabilities and perplexity, the ``intervention``
    and the residual ``stream`` the pass kept (both fixed at construction), the checks of a head or a position, and
    the numpy API below. The reader's methods stay reachable on the analysis itself (``analysis.row_blocks``,
    ``key_mask``, ``values``, ``w_heads``, ``layer``, ``rows``, ``attention_tensor`` ...) rather than behind an
    attribute: the analyses, the flow, the benchmarks and the tests call them on the analysis in about thirty files,
    and docs/api.md documents ``row_blocks``, ``key_mask`` and ``values`` as public.

    Read-only after construction and safe to share between threads. Arrays returned are numpy float32:

    | method                             | shape                  |
    |------------------------------------|------------------------|
    | ``attention(layer)``               | [head, query, key]     |
    | ``contributions(layer, kind)``     | [head, query, key]     |
    | ``measure(layer, name)``           | [head, query, key]     |
    | ``layer_scores(layer, name)``      | [query, key]           |
    | ``output_norms(layer)``            | [head, query], [query] |
    | ``learned_sink_attention(layer)``  | [head, query]          |
    """

    def __init__(
        self,
        bundle: Bundle,
        text: str,
        input_ids: list[int],
        layer_records: Sequence[LayerRecord],
        next_token_logprobs: np.ndarray | None = None,
        final_hidden: torch.Tensor | None = None,
        intervention: Intervention | None = None,
        stream: Stream | None = None,
    ) -> None:
        """Give ``next_token_logprobs`` [T - 1], or the final hidden states ``final_hidden``
        [T, d_model] to compute them from on first use; with neither there are none (encoders).
        ``intervention``: the one the recorded pass ran under (None: the model as it is). ``stream``: the residual
        stream the pass kept (``analyze(stream=True)``), else None."""
        super().__init__(bundle, layer_records, len(input_ids))
        self.text = text
        self.input_ids = list(input_ids)
        self.tokens = display_tokens(bundle.tokenizer, self.input_ids)
        self._logprobs = next_token_logprobs
        self._final_hidden = final_hidden
        self._logprobs_lock = threading.Lock()
        self._intervention = intervention
        self._stream = stream

    @property
    def intervention(self) -> Intervention | None:
        """The intervention the recorded pass ran under (:func:`analyze`), None for the model as it is."""
        return self._intervention

    @property
    def stream(self) -> Stream | None:
        """The recorded pass's residual stream into the flow's default position (``analyze(stream=True)``), else
        None."""
        return self._stream

    @property
    def info(self) -> ModelInfo:
        return self.bundle.info

    @property
    @checked
    def next_token_logprobs(self) -> np.ndarray:
        """log p(token_{t+1} | tokens ..t), float32 [T - 1]; empty for encoders. Computed on first use from the final
        hidden states (:func:`~cwviz.core.method.logprobs.prompt_logprobs`), then kept."""
        with self._logprobs_lock:
            if self._logprobs is None:
                device = torch.device("cpu") if self._final_hidden is None else self._final_hidden.device
                with memory.guard(device):
                    own = self.intervention is None
                    self._logprobs = prompt_logprobs(self.bundle, self._final_hidden, self.input_ids, own=own)
                self._final_hidden = None  # after the log-probabilities, not before: an error leaves it for a retry
            return self._logprobs

    @property
    def perplexity(self) -> float:
        """exp of the mean next-token negative log-likelihood over the prompt (nan for encoders or T = 1)."""
        return perplexity_of(self.next_token_logprobs)

    # -- selection checks ----------------------------------------------------------------------------
    def check_head(self, head: int) -> int:
        if not 0 <= (head := integer_index(head, "a head")) < self.num_heads:
            raise SelectionError(f"head {head} is out of range; this model has heads 0..{self.num_heads - 1}")
        return head

    def check_token(self, position: int) -> int:
        if not 0 <= (position := integer_index(position, "a token position")) < self.num_tokens:
            last = self.num_tokens - 1
            raise SelectionError(f"token {position} is out of range; the prompt has tokens 0..{last}")
        return position

    # -- the numpy API ---------------------------------------------------------------------------------
    def attention(self, layer: int) -> np.ndarray:
        """Raw attention α, [head, query, key]: :meth:`attention_tensor` through the kept layer
        (:meth:`layer`), so that its contributions come at no second softmax."""
        return _np(self.layer(layer).attention)

    def contributions(self, layer: int, kind: str = "inter") -> np.ndarray:
        """Contribution weights, intra-head c (each head sums to 1) or inter-head C (heads sum to 1)."""
        return _np(self.layer(layer).contribution(check_kind(kind)))

    def measure(self, layer: int, name: str) -> np.ndarray:
        """One of :data:`cwviz.core.method.measures.MEASURES` per head, [head, query, key]."""
        return _np(self.layer(layer).per_head(_check_measure(name)))

    def layer_scores(self, layer: int, name: str) -> np.ndarray:
        """The layer-level (all heads) score of docs/METHOD.md, [query, key]."""
        return _np(self.layer(layer).layer_level(_check_measure(name)))

    def output_norms(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(‖o_i^h‖ [head, query], ‖o_i‖ [query])."""
        m = self.layer(layer)
        return _np(m.head_output_norm), _np(m.output_norm)

    def learned_sink_attention(self, layer: int) -> np.ndarray:
        """The learned sink's share of each query's softmax, 1 − Σ_j α_ij^h, numpy float32 [head, query]: the learned
        sink (gpt-oss ``s_aux``) is a logit per head that joins the softmax and writes nothing, so its share goes
        nowhere and the real keys' contributions still sum to 1. Zeros without learned sinks. Read in row blocks."""
        layer = self.check_layer(layer)
        if self.learned_sink_logits(layer) is None:
            return np.zeros((self.num_heads, self.num_tokens), dtype=np.float32)
        with torch.inference_mode():
            rows = [1 - alpha.sum(-1) for *_, alpha in self.attention_row_blocks(layer)]  # (H, rows) each
            share = torch.cat(rows, dim=1).clamp_(min=0)
        return _np(share)


def _check_measure(name: str) -> str:
    """``name``, or InputError unless it is one of :data:`~cwviz.core.method.measures.MEASURES`."""
    if name not in MEASURES:
        raise InputError(f"unknown measure {name!r}; choose one of: {', '.join(MEASURES)}")
    return name


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()
