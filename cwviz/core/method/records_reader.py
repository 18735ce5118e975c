"""The records reader: the layer records of one recorded pass, read as float32 torch tensors.

:class:`RecordsReader` knows the records (:class:`~cwviz.core.method.capture.LayerRecord`, in memory or on disk:
:mod:`cwviz.core.method.spill`) and the model they came from, and nothing of the prompt's text or its tokens:
:class:`cwviz.Analysis` (:mod:`cwviz.core.method.analysis`) adds those, its checks and the numpy API.

A layer's T x T maps are computed when asked for, one layer at a time (the two most recent layers are kept), or read
in row blocks (:mod:`cwviz.core.method.row_blocks`, their height set by :mod:`cwviz.core.method.row_block_sizes`).
Attention is read one way, :meth:`RecordsReader.attention_tensor` (any range of query rows, every key);
:meth:`~RecordsReader.attention_row_blocks` gives the same rows a row block at a time, against the keys each row block
can see; the measures (:meth:`~RecordsReader.layer`, :meth:`~RecordsReader.rows`, :meth:`~RecordsReader.row_blocks`)
hold that α beside what is computed from it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import torch

from ..loading import architectures
from ..loading.inputs import check_layer, integer_index
from ..loading.models import Bundle
from ..util.errors import SelectionError
from ..vocabulary import KINDS
from . import memory
from .capture import LayerRecord
from .measures import LayerMeasures, QuerySide, expand_kv, grouped_matmul, head_weights, layer_measures, query_side
from .measures import value_norms as compute_value_norms
from .row_blocks import attention_rows, for_row_blocks, record_row_blocks
from .spill import SpilledRecords, record_field
from .state import ModelState, checked

#: What :meth:`RecordsReader.row_blocks` yields: ``(first, stop, measures)`` of the query rows ``first..stop-1``.
RowBlockMeasures = tuple[int, int, LayerMeasures]


class RecordsReader:
    """Every layer of one recorded pass as float32 torch tensors: attention, the measures, values, outputs, masks.

    It belongs to its model as it was: every method that reads it checks the model's state first, itself or through
    another (:mod:`cwviz.core.method.state`; ModelChangedError once the model was freed, moved or changed). The records
    of a long prompt on the CPU are on disk (:mod:`cwviz.core.method.spill`): a layer is read back when one of its
    tensors is asked for, bit for bit as recorded; ``spilled`` says whether they are. Read-only after construction and
    safe to share between threads.

    | method                                   | returns                                             |
    |------------------------------------------|-----------------------------------------------------|
    | ``attention_tensor(layer, first, stop)`` | α [head, rows, key]: the one attention reader       |
    | ``attention_row_blocks(layer, start)``   | ``(first, stop, α [head, rows, keys])`` a row block |
    | ``layer(layer)``                         | :class:`LayerMeasures` of every query row (kept)    |
    | ``rows(layer, start, stop)``             | :class:`LayerMeasures` of rows start..stop-1        |
    | ``row_blocks(layer, start, kinds)``      | ``(first, stop, LayerMeasures)`` a row block        |
    | ``values(layer)``                        | v [head, key, d_head]                               |
    | ``w_heads(layer)``                       | W_O per head [head, d_model, d_head]                |
    | ``recorded_outputs(layer)``              | z as recorded [head, query, d_head], model dtype    |
    | ``head_outputs(layer)``                  | z recomputed from α and v [head, query, d_head]     |
    | ``key_mask(layer, start, stop)``         | bool [query, key], True where a key is visible      |
    | ``layer_record(layer)``                  | the :class:`LayerRecord` itself                     |
    """

    _KEEP_LAYERS = 2

    def __init__(self, bundle: Bundle, layer_records: Sequence[LayerRecord], num_tokens: int) -> None:
        """``layer_records[layer]``: each layer's record of a pass over ``num_tokens`` tokens (a tuple, or
        :class:`~cwviz.core.method.spill.SpilledRecords` on disk)."""
        self.bundle = bundle
        self._layer_records = layer_records  # [layer] -> LayerRecord; read through the methods below
        self._num_tokens = num_tokens
        self._layers: OrderedDict[int, LayerMeasures] = OrderedDict()
        self._value_norms: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()  # the kept layers
        self._model_state = ModelState(bundle)

    def check_model(self) -> None:
        """ModelChangedError unless the model is as it was when these records were made (:class:`ModelState`)."""
        self._model_state.check()

    @property
    def num_layers(self) -> int:
        return self.bundle.info.layers

    @property
    def num_heads(self) -> int:
        return self.bundle.info.heads

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def spilled(self) -> bool:
        """Whether the records are on disk (:mod:`cwviz.core.method.spill`) rather than in memory."""
        return isinstance(self._layer_records, SpilledRecords)

    def check_layer(self, layer: int) -> int:
        return check_layer(layer, self.num_layers)

    def _check_rows(self, start: int, stop: int) -> tuple[int, int]:
        """``(start, stop)`` as integers, or SelectionError unless they are query rows of the prompt."""
        start, stop = integer_index(start, "a first row"), integer_index(stop, "a row end")
        if not 0 <= start < stop <= self.num_tokens:
            last = self.num_tokens - 1
            raise SelectionError(f"rows {start}..{stop - 1} are out of range; the prompt has tokens 0..{last}")
        return start, stop

    # -- attention: one reader, and its row blocks ---------------------------------------------------
    @checked
    def attention_tensor(self, layer: int, first: int = 0, stop: int | None = None) -> torch.Tensor:
        """α of ``layer``'s query rows ``first..stop-1`` (default: every row) over every key, float32 torch
        [head, rows, key]; exactly 0 where a row cannot see a key. Every row depends on its own scores only, so a
        range of rows costs (stop - first) / T of the whole map."""
        rec = self._layer_records[self.check_layer(layer)]
        first, stop = self._check_rows(first, self.num_tokens if stop is None else stop)
        if first == 0 and stop == self.num_tokens:  # the whole map: a causal one skips its upper triangle
            return rec.probabilities(rec.query.float(), rec.key.float(), rec.mask, rec.causal)
        return attention_rows(rec, first, stop, self.num_tokens)

    @checked
    def attention_row_blocks(self, layer: int, start: int = 0) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(first, stop, α)`` for the row blocks of :meth:`row_blocks`: :meth:`attention_tensor` of the rows
        ``first..stop-1`` cut to the keys they can see in a causal layer (float32 [head, rows, keys])."""
        with torch.inference_mode():
            rec = for_row_blocks(self._layer_records[self.check_layer(layer)])
        for first, stop, keys in record_row_blocks(rec, start):
            yield first, stop, attention_rows(rec, first, stop, keys)

    # -- measures ------------------------------------------------------------------------------------
    @checked
    def layer(self, layer: int) -> LayerMeasures:
        """Every measure of one layer as float32 torch tensors (the last two layers asked for are kept)."""
        layer = self.check_layer(layer)
        with self._lock:
            if layer in self._layers:
                self._layers.move_to_end(layer)
                return self._layers[layer]
        rec = self._layer_records[layer]
        memory.check_layer_maps(self.bundle.info, self.num_tokens, rec.value.device)
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
    def rows(self, layer: int, start: int, stop: int) -> LayerMeasures:
        """Every measure of one layer for the query rows ``start..stop-1`` only (not kept).

        Exact, because every measure of query i depends only on its own attention row (docs/METHOD.md):
        the measures of a window of W queries cost W / T of the whole layer's, in time and memory. The
        rows' tensors have a query axis of length ``stop - start``; keys are all T positions.
        """
        layer = self.check_layer(layer)
        start, stop = self._check_rows(start, stop)
        return self._rows(layer, start, stop, self.num_tokens)

    @checked
    def row_blocks(self, layer: int, start: int = 0, kinds: tuple[str, ...] = KINDS) -> Iterator[RowBlockMeasures]:
        """``(first, stop, measures)`` for consecutive row blocks ``first..stop-1`` from ``start`` to the last, each of
        about :data:`~cwviz.core.method.row_block_sizes.ROW_BLOCK_CELLS` cells a head: the streamed reductions (head
        summary, sink table) read a layer this way, in O(rows x T) working memory.

        ``measures`` equals :meth:`rows` ``(layer, first, stop)`` on the keys it holds. In a causal layer those
        are keys ``0..stop-1`` only: the rows cannot see a later key (its attention and contributions are
        exactly 0), and leaving them out halves the work of reading the whole layer. Elsewhere they are all T.
        ``kinds``: the contribution kinds the row blocks hold (``("intra",)`` or ``("inter",)`` saves a third of
        the work, for a reader that needs one kind).
        """
        layer = self.check_layer(layer)
        side = self._query_side(layer)  # one product for the layer, sliced per row block
        with torch.inference_mode():
            rec = for_row_blocks(self._layer_records[layer])
        for first, stop, keys in record_row_blocks(rec, start):
            rows_side = None if side is None else side.rows(first, stop)
            yield first, stop, self._rows(layer, first, stop, keys, rows_side, kinds, rec)

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
        the contribution kinds to compute; ``rec`` the layer's record when the caller has it
        (:func:`~cwviz.core.method.row_blocks.for_row_blocks`)."""
        rec = self._layer_records[layer] if rec is None else rec
        with memory.guard(rec.value.device), torch.inference_mode():
            alpha = attention_rows(rec, start, stop, keys)  # (H, rows, keys)
            gram = self.bundle.gram(layer).to(rec.value.device)
            if side is None and rec.output.dtype == torch.float32:
                # As in layer(): the model's own z = α v when it is float32 (a quarter of the rows' products).
                side = query_side(rec.output[:, start:stop], gram)
            norm, value = self.value_norms(layer)[:, :keys], rec.value[:, :keys]
            return layer_measures(alpha, value, gram=gram, value_norm=norm, side=side, kinds=kinds, copies=rec.copies)

    def _query_side(self, layer: int) -> QuerySide | None:
        """The whole layer's :class:`~cwviz.core.method.measures.QuerySide` from the model's own z when it is float32
        (2 x heads x T x d_head floats), else None (z is then recomputed in float32 from each row block's α)."""
        rec = self._layer_records[layer]
        if rec.output.dtype != torch.float32:
            return None
        with memory.guard(rec.value.device), torch.inference_mode():
            return query_side(rec.output, self.bundle.gram(layer).to(rec.value.device))

    @checked
    def value_norms(self, layer: int) -> torch.Tensor:
        """‖ṽ_j^h‖ of ``layer``, float32 [head, key] on the layer's device: computed once per layer and kept
        (H x T floats), so that reading a layer in row blocks does not redo the Gram products per row block."""
        layer = self.check_layer(layer)
        cached = self._value_norms.get(layer)
        if cached is None:
            rec = self._layer_records[layer]
            with torch.inference_mode():
                cached = compute_value_norms(rec.value, self.bundle.gram(layer).to(rec.value.device), self.num_heads)
            self._value_norms[layer] = cached  # a race computes the same tensor twice, never a wrong one
        return cached

    # -- the layer's tensors: values, weights, outputs --------------------------------------------------
    @checked
    def values(self, layer: int) -> torch.Tensor:
        """The values v_j^h = x_j W_V^h + b_V^h of ``layer``, one per head (a grouped-query kv head repeated for each
        head that shares it), float32 [head, key, d_head] on :meth:`layer_device`."""
        return expand_kv(self._layer_records[self.check_layer(layer)].value.float(), self.num_heads)

    @checked
    def w_heads(self, layer: int) -> torch.Tensor:
        """W_O of ``layer`` split per head, float32 [head, d_model, d_head], on the layer's device."""
        proj = architectures.out_projections(self.bundle.model, self.bundle.arch)[self.check_layer(layer)]
        w_o = architectures.out_proj_weight(proj, self.bundle.arch)
        return head_weights(w_o, self.num_heads).to(self.layer_device(layer))

    @checked
    def recorded_outputs(self, layer: int) -> torch.Tensor:
        """z_i^h of ``layer`` as the pass recorded it: what the attention function returned and the output projection
        received, in the model's dtype, [head, query, d_head] on :meth:`layer_device` (of a layer on disk only these
        bytes are read). :meth:`head_outputs` recomputes them from α and v in float32 instead: equal to rounding."""
        return record_field(self._layer_records, self.check_layer(layer), "output")

    def head_outputs(self, layer: int) -> torch.Tensor:
        """z_i^h = Σ_j α_ij^h v_j^h recomputed in float32 from the records, [head, query, d_head] (the output
        projection's input per head), in row blocks: O(rows x T) working memory, never the T x T attention."""
        value = self._layer_records[self.check_layer(layer)].value
        with torch.inference_mode():
            value = value.float()  # (kv_head, T, d_head)
            blocks = self.attention_row_blocks(layer)
            parts = [grouped_matmul(alpha, value[:, : alpha.shape[-1]]) for *_, alpha in blocks]  # (H, rows, d_head)
            return torch.cat(parts, dim=1)  # (H, T, d_head)

    # -- a layer's record: its metadata without reading it, or the whole record -----------------------
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
    def layer_record(self, layer: int) -> LayerRecord:
        """``layer``'s :class:`~cwviz.core.method.capture.LayerRecord` as the pass recorded it (a layer on disk is
        read back whole): for the checks of the seam itself. Tables read through the methods above and the row
        blocks, which read no more of a layer than they need."""
        return self._layer_records[self.check_layer(layer)]

    def _shell(self, layer: int) -> LayerRecord:
        """Layer ``layer``'s record for its metadata (mask, scaling, learned sinks): a spilled layer is not read."""
        return self._layer_records.shell(layer) if self.spilled else self._layer_records[layer]
