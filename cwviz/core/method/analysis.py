"""``analyze``: one recorded forward pass, and the :class:`Analysis` that computes measures from it.

What an :class:`Analysis` keeps grows linearly with the number of tokens T: per layer the queries,
keys and values ([heads or kv_heads, T, d_head]) and the final hidden states, from which the
log-probability of each next token is computed when first asked for.
T x T maps are computed when asked for, one layer at a time (the two most recent layers are kept), or read in
row blocks (:mod:`cwviz.core.method.reading`, sized by :mod:`cwviz.core.method.blocks`).

The prompt is checked first (:mod:`cwviz.core.loading.inputs`: the model's positions, ``CWVIZ_MAX_TOKENS``); then the
memory check (:mod:`cwviz.core.method.memory`) refuses a prompt whose working set would not fit.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ...vocabulary import KINDS, check_kind
from ..loading import architectures
from ..loading.inputs import check_agree, check_layer, check_length, integer_index, tokenize
from ..loading.models import Bundle
from ..util.errors import InputError, SelectionError
from ..util.progress import Progress
from ..util.tokens import display_tokens
from . import memory
from .capture import Intervention, LayerRecord, forward_pass
from .logprobs import final_states, perplexity_of, prompt_logprobs
from .measures import (
    MEASURES,
    LayerMeasures,
    QuerySide,
    expand_kv,
    grouped_matmul,
    head_weights,
    layer_measures,
    query_side,
    value_norms,
)
from .reading import attention_rows, for_blocks, record_blocks
from .residual import Stream, stream_hooks
from .spill import SpilledRecords, by_layer, record_field, spill_for
from .state import ModelState, checked
from .stream import BlockConsumer, block_streamer


def analyze(
    bundle: Bundle,
    text: str | None = None,
    *,
    input_ids: list[int] | None = None,
    progress: Progress | None = None,
    each_block: BlockConsumer | None = None,
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
    a later pass of the same analysis (:func:`cwviz.analyses.sinks.intervene_on_sink`) runs it too. None: the model
    as it is.

    ``stream``: also keep the pass's residual stream into the flow's default position (the last token, an encoder's
    first) as :attr:`Analysis.stream` (layers x T x d_model floats, in the memory check): the flow there runs no pass.

    ``each_block(layer, first, stop, measures)``: a reader of every layer (a whole-prompt reduction, an
    evaluation over a dataset) gets each layer's row blocks *during* the pass, in the blocks and with the
    measures of :meth:`Analysis.row_blocks` (``kinds``: the contribution kinds they hold; their ``value`` is
    per head, [head, key, d_head]), layer after layer (:mod:`cwviz.core.method.stream`). The measures are those of the
    returned :class:`Analysis` (which is as without ``each_block``), to float32 rounding. Keep reductions of the
    blocks rather than the blocks: together they are every layer's T x T maps.

    Raises :class:`~cwviz.core.util.errors.InputError` for an empty or over-long prompt and
    :class:`~cwviz.core.util.errors.ResourceError` when the estimate of :mod:`cwviz.core.method.memory` exceeds what is free.
    """
    if each_block is not None and intervention is not None:
        raise InputError("each_block reads the model's own pass; run an intervention without it")
    if input_ids is None:
        ids = tokenize(bundle, text if text is not None else "")
    else:
        ids = check_length(bundle, input_ids)
        if text is None:
            text = bundle.tokenizer.decode(ids)
        else:
            text = check_agree(bundle, text, ids)  # .text and .tokens say one prompt, or InputError
    device = bundle.input_device
    spill = spill_for(memory.records_bytes(bundle.info, len(ids)), device)
    memory.check(bundle.model.config, bundle.info, len(ids), device, spilled=spill is not None, stream=stream)
    attend = block_streamer(bundle, each_block, kinds)
    batch = torch.tensor([ids], device=device)
    at = len(ids) - 1 if bundle.arch.causal else 0
    # The base model only: the output layer (T x vocab logits, the largest product for a small model and
    # a long prompt) runs when the log-probabilities are first asked for, in chunks of rows.
    with (
        memory.guard(device),
        torch.inference_mode(),
        forward_pass(bundle.attention_modules, progress=progress, spill=spill, attend=attend, intervention=intervention) as records,
        stream_hooks(bundle, at) if stream else contextlib.nullcontext() as finish,
    ):
        hidden = bundle.final_hidden(batch)[0]  # (T, d_model)
    if len(records) != bundle.info.layers:
        raise RuntimeError(f"recorded {len(records)} of {bundle.info.layers} layers; is the model's attention routed through cwviz?")
    final = final_states(bundle, hidden, intervention)  # the log-probabilities' input, checked; an encoder has none
    analysis = Analysis(bundle, text or "", ids, by_layer(records, bundle.info.layers), None, final, intervention)
    analysis.stream = None if finish is None else finish(hidden)
    return analysis


class Analysis:
    """The result of :func:`analyze`: tokens, and every measure on demand.

    It belongs to its model as it was: every method that reads it checks the model's state first, itself or through
    another (:mod:`cwviz.core.method.state`; ModelChangedError once the model was freed, moved or changed).

    The records of a long prompt on the CPU are on disk (:mod:`cwviz.core.method.spill`): a layer is read back when
    one of its measures is asked for, bit for bit as recorded. ``spilled`` says whether they are.

    Read-only after construction and safe to share between threads. Arrays returned are numpy float32:

    | method                           | shape                  |
    |----------------------------------|------------------------|
    | ``attention(layer)``             | [head, query, key]     |
    | ``contributions(layer, kind)``   | [head, query, key]     |
    | ``measure(layer, name)``         | [head, query, key]     |
    | ``layer_scores(layer, name)``    | [query, key]           |
    | ``output_norms(layer)``          | [head, query], [query] |
    """

    _KEEP_LAYERS = 2

    def __init__(
        self,
        bundle: Bundle,
        text: str,
        input_ids: list[int],
        layer_records: Sequence[LayerRecord],
        next_token_logprobs: np.ndarray | None = None,
        final_hidden: torch.Tensor | None = None,
        intervention: Intervention | None = None,
    ) -> None:
        """Give ``next_token_logprobs`` [T - 1], or the final hidden states ``final_hidden``
        [T, d_model] to compute them from on first use; with neither there are none (encoders).
        ``intervention``: the one the recorded pass ran under (None: the model as it is)."""
        self.bundle = bundle
        self.text = text
        self.input_ids = list(input_ids)
        self.tokens = display_tokens(bundle.tokenizer, self.input_ids)
        self._layer_records = layer_records  # [layer] -> LayerRecord; read through the methods below
        self._logprobs = next_token_logprobs
        self._final_hidden = final_hidden
        self._layers: OrderedDict[int, LayerMeasures] = OrderedDict()
        self._value_norms: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()  # the kept layers
        self._logprobs_lock = threading.Lock()
        self._model_state = ModelState(bundle)
        #: The intervention the recorded pass ran under (:func:`analyze`), None for the model as it is.
        self.intervention = intervention
        #: The recorded pass's residual stream into the flow's default position (``analyze(stream=True)``), else None.
        self.stream: Stream | None = None

    def check_model(self) -> None:
        """ModelChangedError unless the model is as it was when this analysis was made (:class:`ModelState`)."""
        self._model_state.check()

    # -- sizes and selection checks ---------------------------------------------------------------
    @property
    def info(self):
        return self.bundle.info

    @property
    def num_layers(self) -> int:
        return self.bundle.info.layers

    @property
    def num_heads(self) -> int:
        return self.bundle.info.heads

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    @checked
    def next_token_logprobs(self) -> np.ndarray:
        """log p(token_{t+1} | tokens ..t), float32 [T - 1]; empty for encoders. Computed on first use from the final
        hidden states (:func:`~cwviz.core.method.logprobs.prompt_logprobs`), then kept."""
        with self._logprobs_lock:
            if self._logprobs is None:
                with memory.guard(torch.device("cpu") if self._final_hidden is None else self._final_hidden.device):
                    self._logprobs = prompt_logprobs(self.bundle, self._final_hidden, self.input_ids, own=self.intervention is None)
                self._final_hidden = None  # after the log-probabilities, not before: an error leaves it for a retry
            return self._logprobs

    @property
    def perplexity(self) -> float:
        """exp of the mean next-token negative log-likelihood over the prompt (nan for encoders or T = 1)."""
        return perplexity_of(self.next_token_logprobs)

    def check_layer(self, layer: int) -> int:
        return check_layer(layer, self.num_layers)

    def check_head(self, head: int) -> int:
        if not 0 <= (head := integer_index(head, "a head")) < self.num_heads:
            raise SelectionError(f"head {head} is out of range; this model has heads 0..{self.num_heads - 1}")
        return head

    def check_token(self, position: int) -> int:
        if not 0 <= (position := integer_index(position, "a token position")) < self.num_tokens:
            raise SelectionError(f"token {position} is out of range; the prompt has tokens 0..{self.num_tokens - 1}")
        return position

    # -- measures ---------------------------------------------------------------------------------
    @checked
    def w_heads(self, layer: int) -> torch.Tensor:
        """W_O of ``layer`` split per head, float32 [head, d_model, d_head], on the layer's device."""
        proj = architectures.out_projections(self.bundle.model, self.bundle.arch)[layer]
        w_o = architectures.out_proj_weight(proj, self.bundle.arch)
        return head_weights(w_o, self.num_heads).to(self.layer_device(layer))

    @checked
    def attention_tensor(self, layer: int) -> torch.Tensor:
        """α for ``layer``, float32 torch [head, query, key]."""
        rec = self._layer_records[self.check_layer(layer)]
        return rec.probabilities(rec.query.float(), rec.key.float(), rec.mask, rec.causal)

    @checked
    def layer(self, layer: int) -> LayerMeasures:
        """Every measure of one layer as float32 torch tensors (the last two layers asked for are kept)."""
        layer = self.check_layer(layer)
        with self._lock:
            if layer in self._layers:
                self._layers.move_to_end(layer)
                return self._layers[layer]
        rec = self._layer_records[layer]
        memory.check_layer_maps(self.info, self.num_tokens, rec.value.device)
        # The model's own z = α v is reused when it is float32; in lower precision it is recomputed in
        # float32 so that the identities hold to float32 rounding.
        head_output = rec.output if rec.output.dtype == torch.float32 else None
        with memory.guard(rec.value.device), torch.inference_mode():
            measures = layer_measures(
                self.attention_tensor(layer),
                rec.value,
                head_output=head_output,
                gram=self.bundle.gram(layer).to(rec.value.device),
                causal=rec.causal and rec.mask is None,
            )
        with self._lock:
            self._layers[layer] = measures
            while len(self._layers) > self._KEEP_LAYERS:
                self._layers.popitem(last=False)
        return measures

    @checked
    def value_norms(self, layer: int) -> torch.Tensor:
        """‖ṽ_j^h‖ of ``layer``, float32 [head, key] on the layer's device: computed once per layer and kept
        (H x T floats), so that reading a layer in row blocks does not redo the Gram products per block."""
        layer = self.check_layer(layer)
        cached = self._value_norms.get(layer)
        if cached is None:
            rec = self._layer_records[layer]
            with torch.inference_mode():
                cached = value_norms(rec.value, self.bundle.gram(layer).to(rec.value.device), self.num_heads)
            self._value_norms[layer] = cached  # a race computes the same tensor twice, never a wrong one
        return cached

    @checked
    def rows(self, layer: int, start: int, stop: int) -> LayerMeasures:
        """Every measure of one layer for the query rows ``start..stop-1`` only (not cached).

        Exact, because every measure of query i depends only on its own attention row (docs/METHOD.md):
        the measures of a window of W queries cost W / T of the whole layer's, in time and memory. The
        rows' tensors have a query axis of length ``stop - start``; keys are all T positions.
        """
        layer = self.check_layer(layer)
        start, stop = integer_index(start, "a first row"), integer_index(stop, "a row end")
        if not 0 <= start < stop <= self.num_tokens:
            raise SelectionError(f"rows {start}..{stop - 1} are out of range; the prompt has tokens 0..{self.num_tokens - 1}")
        return self._rows(layer, start, stop, self.num_tokens)

    def _rows(
        self,
        layer: int,
        start: int,
        stop: int,
        keys: int,
        side: QuerySide | None = None,
        kinds: tuple[str, ...] = KINDS,
        rec: LayerRecord | None = None,
    ) -> LayerMeasures:
        """:meth:`rows` against the keys ``0..keys-1`` only (the caller knows the rows see no later key); ``side``
        the rows' :class:`~cwviz.core.method.measures.QuerySide` when the caller has it for the whole layer; ``kinds``
        the contribution kinds to compute; ``rec`` the layer's record when the caller has it (:func:`for_blocks`)."""
        rec = self._layer_records[layer] if rec is None else rec
        with memory.guard(rec.value.device), torch.inference_mode():
            alpha = attention_rows(rec, start, stop, keys)
            gram = self.bundle.gram(layer).to(rec.value.device)
            if side is None and rec.output.dtype == torch.float32:
                # As in layer(): the model's own z = α v when it is float32 (a quarter of the rows' products).
                side = query_side(rec.output[:, start:stop], gram)
            value_norm = self.value_norms(layer)[:, :keys]
            return layer_measures(alpha, rec.value[:, :keys], gram=gram, value_norm=value_norm, side=side, kinds=kinds, copies=rec.copies)

    def _query_side(self, layer: int) -> QuerySide | None:
        """The whole layer's :class:`~cwviz.core.method.measures.QuerySide` from the model's own z when it is float32
        (2 x heads x T x d_head floats), else None (z is then recomputed in float32 from each block's α)."""
        rec = self._layer_records[layer]
        if rec.output.dtype != torch.float32:
            return None
        with memory.guard(rec.value.device), torch.inference_mode():
            return query_side(rec.output, self.bundle.gram(layer).to(rec.value.device))

    @checked
    def row_blocks(self, layer: int, start: int = 0, kinds: tuple[str, ...] = KINDS) -> Iterator[tuple[int, int, LayerMeasures]]:
        """``(first, stop, measures)`` for consecutive blocks of query rows ``first..stop-1`` from ``start`` to
        the last, each of about :data:`ROW_BLOCK_CELLS` cells a head: the streamed reductions (head summary,
        sink table) read a layer this way, in O(block x T) working memory.

        ``measures`` equals :meth:`rows` ``(layer, first, stop)`` on the keys it holds. In a causal layer those
        are keys ``0..stop-1`` only: the rows cannot see a later key (its attention and contributions are
        exactly 0), and leaving them out halves the work of reading the whole layer. Elsewhere they are all T.
        ``kinds``: the contribution kinds the blocks hold (``("intra",)`` or ``("inter",)`` saves a third of
        the work, for a reader that needs one kind).
        """
        layer = self.check_layer(layer)
        side = self._query_side(layer)  # one product for the layer, sliced per block
        with torch.inference_mode():
            rec = for_blocks(self._layer_records[layer])
        for first, stop, keys in record_blocks(rec, start):
            yield first, stop, self._rows(layer, first, stop, keys, None if side is None else side.rows(first, stop), kinds, rec)

    @checked
    def attention_blocks(self, layer: int, start: int = 0) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(first, stop, α)`` in the blocks of :meth:`row_blocks`, attention only (float32 [head, rows, keys])."""
        with torch.inference_mode():
            rec = for_blocks(self._layer_records[self.check_layer(layer)])
        for first, stop, keys in record_blocks(rec, start):
            yield first, stop, attention_rows(rec, first, stop, keys)

    # -- a layer's record: its metadata without reading it, or the whole layer ----------------------
    @property
    def has_learned_sinks(self) -> bool:
        """Whether any layer has learned sink logits (gpt-oss): there α over the real keys sums to less than 1."""
        return any(self.learned_sink_logits(layer) is not None for layer in range(self.num_layers))

    @checked
    def learned_sink_logits(self, layer: int) -> torch.Tensor | None:
        """The learned sink logit of each head of ``layer`` (gpt-oss ``s_aux``), float32 [head]; None in a layer
        without them. Nothing of a layer on disk is read."""
        return self._shell(self.check_layer(layer)).learned_sinks

    @checked
    def layer_device(self, layer: int) -> torch.device:
        """The device ``layer``'s tensors are on (a model spread over devices puts layers on several); the CPU for
        records on disk. Nothing of a layer on disk is read."""
        return torch.device("cpu") if self.spilled else self._layer_records[self.check_layer(layer)].query.device

    def key_mask(self, layer: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Which keys each query may attend to in ``layer``: the model's own mask (causal, sliding window), bool
        [query, key] on :meth:`layer_device`, True where a key is visible; with ``start`` and ``stop``, the query rows
        ``start..stop-1`` only (never the whole T x T). Nothing of a layer on disk is read."""
        return self._shell(self.check_layer(layer)).key_mask(start, stop, device=self.layer_device(layer))

    @checked
    def values(self, layer: int) -> torch.Tensor:
        """The values v_j^h = x_j W_V^h + b_V^h of ``layer``, one per head (a grouped-query kv head repeated for each
        head that shares it), float32 [head, key, d_head] on :meth:`layer_device`."""
        return expand_kv(self._layer_records[self.check_layer(layer)].value.float(), self.num_heads)

    @checked
    def layer_record(self, layer: int) -> LayerRecord:
        """``layer``'s :class:`~cwviz.core.method.capture.LayerRecord` as the pass recorded it (a layer on disk is
        read back whole): for the checks of the seam itself. Tables read through the methods above and the row
        blocks, which read no more of a layer than they need."""
        return self._layer_records[self.check_layer(layer)]

    @checked
    def recorded_outputs(self, layer: int) -> torch.Tensor:
        """z_i^h of ``layer`` as the pass recorded it: what the attention function returned and the output projection
        received, in the model's dtype, [head, query, d_head] on :meth:`layer_device` (of a layer on disk only these
        bytes are read). :meth:`head_outputs` recomputes them from α and v in float32 instead: equal to rounding."""
        return record_field(self._layer_records, self.check_layer(layer), "output")

    def _shell(self, layer: int) -> LayerRecord:
        """Layer ``layer``'s record for its metadata (mask, scaling, learned sinks): a spilled layer is not read."""
        return self._layer_records.shell(layer) if self.spilled else self._layer_records[layer]

    @property
    def spilled(self) -> bool:
        """Whether the records are on disk (:mod:`cwviz.core.method.spill`) rather than in memory."""
        return isinstance(self._layer_records, SpilledRecords)

    def learned_sink_attention(self, layer: int) -> np.ndarray:
        """The learned sink's share of each query's softmax, 1 − Σ_j α_ij^h, numpy float32 [head, query]: the learned
        sink (gpt-oss ``s_aux``) is a logit per head that joins the softmax and writes nothing, so its share goes nowhere
        and the real keys' contributions still sum to 1. Zeros without learned sinks. Read in row blocks."""
        layer = self.check_layer(layer)
        if self.learned_sink_logits(layer) is None:
            return np.zeros((self.num_heads, self.num_tokens), dtype=np.float32)
        with torch.inference_mode():
            share = torch.cat([1 - alpha.sum(-1) for _, _, alpha in self.attention_blocks(layer)], dim=1).clamp_(min=0)
        return _np(share)

    def head_outputs(self, layer: int) -> torch.Tensor:
        """z_i^h = Σ_j α_ij^h v_j^h recomputed in float32 from the records, [head, query, d_head] (the output
        projection's input per head), in row blocks: O(block x T) working memory, never the T x T attention."""
        layer = self.check_layer(layer)
        value = self._layer_records[layer].value
        with torch.inference_mode():
            return torch.cat(
                [grouped_matmul(alpha, value[:, : alpha.shape[-1]].float()) for _, _, alpha in self.attention_blocks(layer)], dim=1
            )

    def attention(self, layer: int) -> np.ndarray:
        """Raw attention α, [head, query, key]."""
        return _np(self.layer(layer).attention)

    def contributions(self, layer: int, kind: str = "inter") -> np.ndarray:
        """Contribution weights, intra-head c (each head sums to 1) or inter-head C (heads sum to 1)."""
        return _np(self.layer(layer).contribution(check_kind(kind)))

    def measure(self, layer: int, name: str) -> np.ndarray:
        """One of :data:`cwviz.core.method.measures.MEASURES` per head, [head, query, key]."""
        if name not in MEASURES:
            raise InputError(f"unknown measure {name!r}; choose one of: {', '.join(MEASURES)}")
        return _np(self.layer(layer).per_head(name))

    def layer_scores(self, layer: int, name: str) -> np.ndarray:
        """The layer-level (all heads) score of docs/METHOD.md, [query, key]."""
        if name not in MEASURES:
            raise InputError(f"unknown measure {name!r}; choose one of: {', '.join(MEASURES)}")
        return _np(self.layer(layer).layer_level(name))

    def output_norms(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(‖o_i^h‖ [head, query], ‖o_i‖ [query])."""
        m = self.layer(layer)
        return _np(m.head_output_norm), _np(m.output_norm)


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()
