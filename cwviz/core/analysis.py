"""``analyze``: one recorded forward pass, and the :class:`Analysis` that computes measures from it.

What an :class:`Analysis` keeps grows linearly with the number of tokens T: per layer the queries,
keys and values ([heads or kv_heads, T, d_head]) and the final hidden states, from which the
log-probability of each next token is computed when first asked for.
T x T maps are computed when asked for, one layer at a time (the two most recent layers are kept), or read in
row blocks (:mod:`cwviz.core.reading`, sized by :mod:`cwviz.core.blocks`).

The prompt is checked first (:mod:`cwviz.core.inputs`: the model's positions, ``CWVIZ_MAX_TOKENS``); then the
memory check (:mod:`cwviz.core.memory`) refuses a prompt whose working set would not fit.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..vocabulary import KINDS
from . import architectures, export, memory
from .capture import Intervention, LayerRecord, forward_pass
from .errors import InputError, SelectionError
from .flow import flow
from .flow_tables import Flow
from .inputs import check_agree, check_layer, check_length, integer_index, tokenize
from .logprobs import logprobs_from_hidden, perplexity_of
from .measures import MEASURES, LayerMeasures, QuerySide, grouped_matmul, head_weights, layer_measures, query_side, value_norms
from .models import Bundle
from .progress import Progress
from .reading import attention_rows, for_blocks, record_blocks
from .spill import SpilledRecords, spill_for
from .stream import BlockConsumer, block_streamer
from .tokens import display_tokens

if TYPE_CHECKING:  # pandas is imported on first use: it is not needed to load a model and analyse
    import pandas as pd


def analyze(
    bundle: Bundle,
    text: str | None = None,
    *,
    input_ids: list[int] | None = None,
    progress: Progress | None = None,
    each_block: BlockConsumer | None = None,
    kinds: tuple[str, ...] = KINDS,
    intervention: Intervention | None = None,
) -> Analysis:
    """Run the model once on ``text`` (or on ``input_ids``) and record every attention layer. Given both, they
    must be one prompt (:func:`~cwviz.core.inputs.check_agree`), or InputError.

    ``progress(done, layers)`` (:mod:`cwviz.core.progress`) is called as each attention layer has run.

    ``intervention`` (:mod:`cwviz.core.interventions`, e.g. ``ScaleValues``) changes the pass from inside the
    attention function, for this call only: the records, measures and log-probabilities are those of the changed
    pass (what the sink intervention compares with the clean one). None: the model as it is.

    ``each_block(layer, first, stop, measures)``: a reader of every layer (a whole-prompt reduction, an
    evaluation over a dataset) gets each layer's row blocks *during* the pass, in the blocks and with the
    measures of :meth:`Analysis.row_blocks` (``kinds``: the contribution kinds they hold; their ``value`` is
    per head, [head, key, d_head]), layer after layer (:mod:`cwviz.core.stream`). The measures are those of the
    returned :class:`Analysis` (which is as without ``each_block``), to float32 rounding. Keep reductions of the
    blocks rather than the blocks: together they are every layer's T x T maps.

    Raises :class:`~cwviz.core.errors.InputError` for an empty or over-long prompt and
    :class:`~cwviz.core.errors.ResourceError` when the estimate of :mod:`cwviz.core.memory` exceeds what is free.
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
    memory.check(bundle.model.config, bundle.info, len(ids), device, spilled=spill is not None)
    attend = block_streamer(bundle, each_block, kinds)
    batch = torch.tensor([ids], device=device)
    # The base model only: the output layer (T x vocab logits, the largest product for a small model and
    # a long prompt) runs when the log-probabilities are first asked for, in chunks of rows.
    with (
        memory.guard(device),
        torch.inference_mode(),
        forward_pass(bundle.attention_modules, progress=progress, spill=spill, attend=attend, intervention=intervention) as records,
    ):
        hidden = bundle.final_hidden(batch)[0]  # (T, d_model)
    if len(records) != bundle.info.layers:
        raise RuntimeError(f"recorded {len(records)} of {bundle.info.layers} layers; is the model's attention routed through cwviz?")
    return Analysis(
        bundle=bundle,
        text=text or "",
        input_ids=ids,
        records=layer_records(records, bundle.info.layers),
        final_hidden=hidden if bundle.arch.causal else None,
    )


def layer_records(records: dict[int, LayerRecord] | SpilledRecords, layers: int) -> Sequence[LayerRecord]:
    """A recording pass's records (:func:`cwviz.core.capture.forward_pass`) as a sequence by layer: on disk as they
    are, else a tuple."""
    return records if isinstance(records, SpilledRecords) else tuple(records[layer] for layer in range(layers))


class Analysis:
    """The result of :func:`analyze`: tokens, and every measure on demand.

    The records of a long prompt on the CPU are on disk (:mod:`cwviz.core.spill`): a layer is read back when
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
        records: Sequence[LayerRecord],
        next_token_logprobs: np.ndarray | None = None,
        final_hidden: torch.Tensor | None = None,
    ) -> None:
        """Give ``next_token_logprobs`` [T - 1], or the final hidden states ``final_hidden``
        [T, d_model] to compute them from on first use; with neither there are none (encoders)."""
        self.bundle = bundle
        self.text = text
        self.input_ids = list(input_ids)
        self.tokens = display_tokens(bundle.tokenizer, self.input_ids)
        self.records = records
        self._logprobs = next_token_logprobs
        self._final_hidden = final_hidden
        self._layers: OrderedDict[int, LayerMeasures] = OrderedDict()
        self._value_norms: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()  # the kept layers
        self._logprobs_lock = threading.Lock()

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
    def next_token_logprobs(self) -> np.ndarray:
        """log p(token_{t+1} | tokens ..t), float32 [T - 1]; empty for encoders.

        Computed on first use from the final hidden states and the model's output layer (a row chunk at a
        time), then kept.
        """
        with self._logprobs_lock:
            if self._logprobs is None:
                output_logits = self.bundle.output_logits if self._final_hidden is not None and self.bundle.has_logits else None
                if output_logits is None:
                    self._logprobs = np.zeros(0, dtype=np.float32)
                else:
                    ids = torch.tensor(self.input_ids)
                    with memory.guard(self._final_hidden.device), torch.inference_mode():
                        logprobs = logprobs_from_hidden(self._final_hidden, output_logits, ids)
                    self._logprobs = logprobs.numpy()
                    self._final_hidden = None
            return self._logprobs

    @property
    def perplexity(self) -> float:
        """exp of the mean next-token negative log-likelihood over the prompt (nan for encoders or T = 1)."""
        return perplexity_of(self.next_token_logprobs)

    def check_layer(self, layer: int) -> int:
        return check_layer(layer, self.num_layers)

    def check_head(self, head: int) -> int:
        head = integer_index(head, "a head")
        if not 0 <= head < self.num_heads:
            raise SelectionError(f"head {head} is out of range; this model has heads 0..{self.num_heads - 1}")
        return head

    def check_token(self, position: int) -> int:
        position = integer_index(position, "a token position")
        if not 0 <= position < self.num_tokens:
            raise SelectionError(f"token {position} is out of range; the prompt has tokens 0..{self.num_tokens - 1}")
        return position

    # -- measures ---------------------------------------------------------------------------------
    def w_heads(self, layer: int) -> torch.Tensor:
        """W_O of ``layer`` split per head, float32 [head, d_model, d_head], on the layer's device."""
        proj = architectures.out_projections(self.bundle.model, self.bundle.arch)[layer]
        w_o = architectures.out_proj_weight(proj, self.bundle.arch)
        return head_weights(w_o, self.num_heads).to(self.records[layer].value.device)

    def attention_tensor(self, layer: int) -> torch.Tensor:
        """α for ``layer``, float32 torch [head, query, key]."""
        rec = self.records[self.check_layer(layer)]
        return rec.probabilities(rec.query.float(), rec.key.float(), rec.mask, rec.causal)

    def layer(self, layer: int) -> LayerMeasures:
        """Every measure of one layer as float32 torch tensors (the last two layers asked for are kept)."""
        layer = self.check_layer(layer)
        with self._lock:
            if layer in self._layers:
                self._layers.move_to_end(layer)
                return self._layers[layer]
        rec = self.records[layer]
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

    def value_norms(self, layer: int) -> torch.Tensor:
        """‖ṽ_j^h‖ of ``layer``, float32 [head, key] on the layer's device: computed once per layer and kept
        (H x T floats), so that reading a layer in row blocks does not redo the Gram products per block."""
        layer = self.check_layer(layer)
        cached = self._value_norms.get(layer)
        if cached is None:
            rec = self.records[layer]
            with torch.inference_mode():
                cached = value_norms(rec.value, self.bundle.gram(layer).to(rec.value.device), self.num_heads)
            self._value_norms[layer] = cached  # a race computes the same tensor twice, never a wrong one
        return cached

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
        the rows' :class:`~cwviz.core.measures.QuerySide` when the caller has it for the whole layer; ``kinds``
        the contribution kinds to compute; ``rec`` the layer's record when the caller has it (:func:`for_blocks`)."""
        rec = self.records[layer] if rec is None else rec
        with memory.guard(rec.value.device), torch.inference_mode():
            alpha = attention_rows(rec, start, stop, keys)
            gram = self.bundle.gram(layer).to(rec.value.device)
            if side is None and rec.output.dtype == torch.float32:
                # As in layer(): the model's own z = α v when it is float32 (a quarter of the rows' products).
                side = query_side(rec.output[:, start:stop], gram)
            value_norm = self.value_norms(layer)[:, :keys]
            return layer_measures(alpha, rec.value[:, :keys], gram=gram, value_norm=value_norm, side=side, kinds=kinds, copies=rec.copies)

    def _query_side(self, layer: int) -> QuerySide | None:
        """The whole layer's :class:`~cwviz.core.measures.QuerySide` from the model's own z when it is float32
        (2 x heads x T x d_head floats), else None (z is then recomputed in float32 from each block's α)."""
        rec = self.records[layer]
        if rec.output.dtype != torch.float32:
            return None
        with memory.guard(rec.value.device), torch.inference_mode():
            return query_side(rec.output, self.bundle.gram(layer).to(rec.value.device))

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
            rec = for_blocks(self.records[layer])
        for first, stop, keys in record_blocks(rec, start):
            yield first, stop, self._rows(layer, first, stop, keys, None if side is None else side.rows(first, stop), kinds, rec)

    def attention_blocks(self, layer: int, start: int = 0) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(first, stop, α)`` in the blocks of :meth:`row_blocks`, attention only (float32 [head, rows, keys])."""
        with torch.inference_mode():
            rec = for_blocks(self.records[self.check_layer(layer)])
        for first, stop, keys in record_blocks(rec, start):
            yield first, stop, attention_rows(rec, first, stop, keys)

    @property
    def has_learned_sinks(self) -> bool:
        """Whether any layer has learned sink logits (gpt-oss): there α over the real keys sums to less than 1."""
        return any(self._shell(layer).sinks is not None for layer in range(self.num_layers))

    def _shell(self, layer: int) -> LayerRecord:
        """Layer ``layer``'s record for its metadata (mask, scaling, learned sinks): a spilled layer is not read."""
        return self.records.shell(layer) if self.spilled else self.records[layer]

    @property
    def spilled(self) -> bool:
        """Whether the records are on disk (:mod:`cwviz.core.spill`) rather than in memory."""
        return isinstance(self.records, SpilledRecords)

    def learned_sink_attention(self, layer: int) -> np.ndarray:
        """The learned sink's share of each query's softmax, 1 − Σ_j α_ij^h, numpy float32 [head, query].

        The learned sink (gpt-oss ``s_aux``) is a logit per head that joins the softmax and writes nothing: its
        share is attention that goes nowhere, so the contributions of the real keys still sum to 1. Zeros in a
        layer without learned sinks. Read in row blocks (never the T x T maps).
        """
        layer = self.check_layer(layer)
        if self.records[layer].sinks is None:
            return np.zeros((self.num_heads, self.num_tokens), dtype=np.float32)
        with torch.inference_mode():
            share = torch.cat([1 - alpha.sum(-1) for _, _, alpha in self.attention_blocks(layer)], dim=1).clamp_(min=0)
        return _np(share)

    def head_outputs(self, layer: int) -> torch.Tensor:
        """z_i^h = Σ_j α_ij^h v_j^h recomputed in float32 from the records, [head, query, d_head] (the output
        projection's input per head), in row blocks: O(block x T) working memory, never the T x T attention."""
        layer = self.check_layer(layer)
        value = self.records[layer].value
        with torch.inference_mode():
            return torch.cat(
                [grouped_matmul(alpha, value[:, : alpha.shape[-1]].float()) for _, _, alpha in self.attention_blocks(layer)], dim=1
            )

    def attention(self, layer: int) -> np.ndarray:
        """Raw attention α, [head, query, key]."""
        return _np(self.layer(layer).attention)

    def contributions(self, layer: int, kind: str = "inter") -> np.ndarray:
        """Contribution weights, intra-head c (each head sums to 1) or inter-head C (heads sum to 1)."""
        if kind not in ("inter", "intra"):
            raise InputError(f"kind must be 'inter' or 'intra', not {kind!r}")
        return _np(self.layer(layer).contribution(kind))

    def measure(self, layer: int, name: str) -> np.ndarray:
        """One of :data:`cwviz.core.measures.MEASURES` per head, [head, query, key]."""
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

    def decomposition(self, layer: int, query: int, head: int | None = None, kind: str = "inter") -> pd.DataFrame:
        """The factors of each key's contribution to ``query``: one row per head and key.

        contribution = attention x norm_ratio x cosine, where norm_ratio = value_norm / output_norm and
        output_norm is ‖o_i‖ (``kind="inter"``) or ‖o_i^h‖ (``kind="intra"``). Keys the query cannot
        see in this layer (the model's own mask: the future in causal models, keys outside a sliding
        window) are left out.
        """
        import pandas as pd

        if kind not in ("inter", "intra"):
            raise InputError(f"kind must be 'inter' or 'intra', not {kind!r}")
        query = self.check_token(query)
        m = self.rows(layer, query, query + 1)  # the query's row alone (exact, T times cheaper than the layer)
        heads = range(self.num_heads) if head is None else [self.check_head(head)]
        keys = torch.nonzero(self.records[self.check_layer(layer)].key_mask(query, query + 1)[0]).flatten().cpu().numpy()
        ratio = _np(m.norm_ratio(kind)[:, 0])
        cosine = _np(m.cosine(kind)[:, 0])
        contribution = _np(m.contribution(kind)[:, 0])
        attention = _np(m.attention[:, 0])
        value_norm = _np(m.value_norm)
        if kind == "inter":
            output_norm = np.full(self.num_heads, float(m.output_norm[0]))
        else:
            output_norm = _np(m.head_output_norm[:, 0])
        frames = [
            pd.DataFrame(
                {
                    "layer": layer,
                    "head": h,
                    "query": query,
                    "key": keys,
                    "token": [self.tokens[k] for k in keys],
                    "attention": attention[h, keys],
                    "value_norm": value_norm[h, keys],
                    "output_norm": output_norm[h],
                    "norm_ratio": ratio[h, keys],
                    "cosine": cosine[h, keys],
                    "contribution": contribution[h, keys],
                }
            )
            for h in heads
        ]
        return pd.concat(frames, ignore_index=True)

    # -- export -----------------------------------------------------------------------------------
    def flow(
        self, position: int | None = None, target: int | str | None = None, foil: int | str | None = None, *, vocabulary: int = 5
    ) -> Flow:
        """The signed flow across layers into ``position`` (docs/METHOD.md section 6): :func:`cwviz.core.flow.flow`,
        a :class:`~cwviz.core.flow_tables.Flow` whose tables are ``tokens``, ``heads``, ``parts``, ``node_table`` and
        ``edges(share)``. A causal LM: toward logit(``target``) − logit(``foil``) (default: the last position and its
        top next token); an encoder: into the position's representation (default 0, [CLS])."""
        return flow(self, position, target, foil, vocabulary=vocabulary)

    def to_dict(self, layers: list[int] | int | None = None, heads: list[int] | int | None = None, digits: int = 6) -> dict:
        """The JSON export (schema in docs/cli.md; :mod:`cwviz.core.export`): tokens, and per layer and head the
        attention and inter-head contribution rows and the output norms. Causal rows keep only keys 0..i.

        ``layers``, ``heads``: None (all), one index, or a list of them (each written once, in the order given).

        Layers are read in row blocks (:meth:`row_blocks`); what the dict itself holds grows with the square of
        the prompt (about :data:`~cwviz.core.export.JSON_BYTES_PER_VALUE` bytes a value as Python floats and then
        as JSON text), so an export that would not fit raises ResourceError naming the choice to narrow."""
        layers = export.selection(layers, self.num_layers, self.check_layer)
        heads = export.selection(heads, self.num_heads, self.check_head)
        causal = self.bundle.arch.causal
        t = self.num_tokens
        values = export.value_count(len(layers), len(heads), t, causal)
        memory.check_fits(
            values * export.JSON_BYTES_PER_VALUE,
            torch.device("cpu"),
            f"the JSON of {len(layers)} layer(s) x {len(heads)} head(s) at {t:,} tokens ({values:,} values)",
            "choose one layer and one head (--layer, --head; Analysis.to_dict(layers=[...], heads=[...])) or a shorter prompt",
        )
        out_layers = []
        for layer in layers:
            # A layer with learned sinks (gpt-oss): each query's share of attention that went to the sink.
            sunk = self.learned_sink_attention(layer) if self._shell(layer).sinks is not None else None
            out_layers.append(export.layer_entry(layer, self.row_blocks(layer), heads, causal, digits, sunk))
        return {
            "schema": export.SCHEMA,
            "version": export.JSON_SCHEMA_VERSION,
            "model": vars(self.info).copy(),
            "text": self.text,
            "tokens": self.tokens,
            "input_ids": self.input_ids,
            "causal": causal,
            "perplexity": None if math.isnan(self.perplexity) else self.perplexity,
            "layers": out_layers,
        }

    def to_json(self, path: str | Path, layers: list[int] | int | None = None, heads: list[int] | int | None = None) -> Path:
        """Write :meth:`to_dict` as UTF-8 JSON; returns the path. InputError when the file cannot be written."""
        return export.write_json(path, self.to_dict(layers, heads))


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()
