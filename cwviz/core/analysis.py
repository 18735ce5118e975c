"""``analyze``: one recorded forward pass, and the :class:`Analysis` that computes measures from it.

What an :class:`Analysis` keeps grows linearly with the number of tokens T: per layer the queries,
keys and values ([heads or kv_heads, T, d_head]) and the final hidden states, from which the
log-probability of each next token is computed when first asked for.
T x T maps are computed when asked for, one layer at a time (the two most recent layers are kept).

The token limit is the model's positions (``max_position_embeddings``, or GPT-2's ``n_positions``;
:data:`MAX_TOKENS` for a config that names none); ``CWVIZ_MAX_TOKENS`` lowers it. Beyond that the memory check
(:mod:`cwviz.core.memory`) refuses a prompt whose working set would not fit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import architectures, memory
from .capture import LayerRecord, causal_rows, forward_pass
from .errors import InputError, SelectionError
from .measures import (
    KINDS,
    MEASURES,
    LayerMeasures,
    QuerySide,
    check_kinds,
    expand_kv,
    grouped_matmul,
    head_weights,
    kv_copies,
    layer_measures,
    query_side,
    value_norms,
)
from .models import Bundle
from .progress import Progress
from .settings import env_int
from .spill import SpilledRecords, spill_for
from .texts import check_text
from .tokens import display_tokens

if TYPE_CHECKING:  # pandas is imported on first use: it is not needed to load a model and analyse
    import pandas as pd

#: The limit for a model whose config gives no positions (``CWVIZ_MAX_TOKENS`` to change it).
MAX_TOKENS = 32_768
#: Cells a head's block of query rows holds when a layer is read in blocks (:meth:`Analysis.row_blocks`,
#: the binned heatmap view): [head, rows, T] at a time, never the layer's T x T maps. With CAUSAL_MIN_BLOCKS below,
#: no other block height made the one pass faster on the two-core benchmark machine (32 to 256 rows at 512 tokens,
#: 64 to 256 at 2,048: ``python -m benchmarks.probe blocks``, BENCHMARKS.md).
ROW_BLOCK_CELLS = 1 << 18
#: The same on a CUDA device, where a block is a handful of kernel launches and a larger one keeps the device
#: busy: 128 rows a block at 32k tokens (a 32-head block's maps about 6 GB), 2^18 cells would be 8.
ROW_BLOCK_CELLS_GPU = 1 << 22
#: A causal layer is read in at least this many row blocks (each ``CAUSAL_BLOCK_ROWS`` rows or more): block b
#: needs keys up to its last row only, so the whole layer costs about (1 + 1 / blocks) / 2 of the dense maps.
CAUSAL_MIN_BLOCKS = 8
CAUSAL_BLOCK_ROWS = 32
JSON_SCHEMA_VERSION = 1


def row_block_cells(device: torch.device | str) -> int:
    """Cells a head's row block holds on ``device``: :data:`ROW_BLOCK_CELLS_GPU` on CUDA, else :data:`ROW_BLOCK_CELLS`."""
    return ROW_BLOCK_CELLS_GPU if torch.device(device).type == "cuda" else ROW_BLOCK_CELLS


def attention_rows(rec: LayerRecord, start: int, stop: int, keys: int) -> torch.Tensor:
    """α of ``rec``'s query rows ``start..stop-1`` over the keys ``0..keys-1``, float32 [head, rows, keys]."""
    with torch.inference_mode():
        query, key = rec.query[:, start:stop].float(), rec.key[:, :keys].float()
        if rec.mask is None and rec.causal and rec.plain:
            return causal_rows(query, key, rec.scaling, start, rec.copies)
        # The general path: the rows' own mask (causal, sliding window or the model's), soft-capping, learned sinks.
        mask = rec.key_mask(start, stop)[:, :keys] if rec.mask is not None or rec.causal else None  # (W, K)
        return rec.probabilities(query, key[:: rec.copies], mask, False)


def for_blocks(rec: LayerRecord) -> LayerRecord:
    """``rec`` prepared for reading in row blocks: float32 queries, and float32 keys and values that hold each kv
    head :func:`~cwviz.core.measures.kv_copies` times in a row (contiguous; O(T d) a layer), so that each of a
    block's batched products (scores, α v, contributions) spreads evenly over the CPU threads. The other fields
    are ``rec``'s. On the two-core benchmark machine the one pass at 2,048 tokens took 1.57x the SDPA forward with
    the embedded model's 3 kv heads held twice (6 batch entries), against 1.65x held once per head (9 entries,
    as before) and 1.75x held once (3 entries): ``python -m benchmarks.probe copies``, BENCHMARKS.md "Even
    batches"."""
    heads, kv_heads = rec.query.shape[0], rec.key.shape[0]
    copies = kv_copies(kv_heads, heads, rec.query.device)
    held = kv_heads * copies  # expand_kv repeats each kv head held / kv_heads times in a row
    return dataclasses.replace(
        rec,
        query=rec.query.float().contiguous(),
        key=expand_kv(rec.key.float(), held).contiguous(),
        value=expand_kv(rec.value.float(), held).contiguous(),
        copies=copies,
    )


def record_blocks(rec: LayerRecord, start: int = 0) -> Iterator[tuple[int, int, int]]:
    """``(first, stop, keys)`` of the row blocks of :meth:`Analysis.row_blocks` for the layer ``rec`` records:
    query rows ``first..stop-1`` against the keys ``0..keys-1`` (in a causal layer, the keys they can see)."""
    num_tokens = rec.query.shape[-2]
    block = max(1, row_block_cells(rec.query.device) // num_tokens)
    if rec.causal:  # at least CAUSAL_MIN_BLOCKS blocks, so that the keys left out add up to about half
        block = min(block, max(CAUSAL_BLOCK_ROWS, -(-num_tokens // CAUSAL_MIN_BLOCKS)))
    for first in range(start, num_tokens, block):
        stop = min(num_tokens, first + block)
        keys = num_tokens
        if rec.causal and (rec.mask is None or not rec.key_mask(first, stop)[:, stop:].any()):
            keys = stop
        yield first, stop, keys


def block_groups(blocks: Iterable[tuple[int, int, int]], cells: int) -> Iterator[list[tuple[int, int, int]]]:
    """Consecutive ``(first, stop, keys)`` row blocks (:func:`record_blocks`) in groups whose blocks hold at most
    ``cells`` cells a head together (a block larger than that is a group of its own).

    The one pass (:func:`analyze` with ``each_block``) keeps a group's α while it makes the group's query side
    (:func:`~cwviz.core.measures.query_side`) in one product instead of one a block: a causal layer's short
    prompt is read in :data:`CAUSAL_MIN_BLOCKS` blocks of a few rows, whose query sides are small, slow products.
    With ``cells`` the cells of a dense layer's row block (:func:`cwviz.core.memory.block_cells`), a group's α is at
    most one such block's map, which the memory estimate counts. At 512 tokens on the embedded model (eight blocks of
    64 rows, one group) the one pass took 1.31x the SDPA forward, against 1.36x with a query side a block
    (``python -m benchmarks.probe groups``, BENCHMARKS.md "Query side by group"); at 2,048 tokens most groups are
    one or two blocks.
    """
    group: list[tuple[int, int, int]] = []
    held = 0
    for first, stop, keys in blocks:
        size = (stop - first) * keys
        if group and held + size > cells:
            yield group
            group, held = [], 0
        group.append((first, stop, keys))
        held += size
    if group:
        yield group


#: Bytes a value of :meth:`Analysis.to_dict` costs at its peak: a Python float and its list slot, then its JSON text.
JSON_BYTES_PER_VALUE = 48


def max_tokens(bundle: Bundle | None = None) -> int:
    """The prompt length limit: the model's positions (:data:`MAX_TOKENS` when its config names none),
    or ``$CWVIZ_MAX_TOKENS`` when that is lower (or the model is unknown)."""
    positions = int(bundle.info.max_positions) if bundle is not None and bundle.info.max_positions else None
    limit = env_int("CWVIZ_MAX_TOKENS", positions or MAX_TOKENS)
    return min(limit, positions) if positions else limit


def tokenize(bundle: Bundle, text: str) -> list[int]:
    """Token ids for ``text`` (with the tokenizer's own special tokens), checked against the limit.

    InputError for text that is not valid (:func:`~cwviz.core.texts.check_text`) and for a prompt of which the
    tokenizer keeps nothing but the special tokens it adds (a normaliser that drops zero-width characters leaves a
    BERT encoder [CLS] [SEP]); special tokens typed in the prompt count as text, and ids given as ``input_ids``
    are taken as they are.
    """
    if not isinstance(text, str):
        raise InputError(f"the prompt must be text, not {type(text).__name__}")
    if not text.strip():
        raise InputError("the prompt is empty; type some text to analyse")
    check_text(text)
    ids = check_length(bundle, bundle.tokenizer(text, add_special_tokens=True)["input_ids"])
    special = set(getattr(bundle.tokenizer, "all_special_ids", None) or ())
    if special and all(i in special for i in ids) and not bundle.tokenizer(text, add_special_tokens=False)["input_ids"]:
        raise InputError(
            "the prompt has no text the model's tokenizer keeps (it drops characters such as zero-width spaces, "
            "leaving only its special tokens); give some text to analyse"
        )
    return ids


def token_ids(value) -> list[int]:
    """Token ids as a list of ints from a 1-D sequence of integers: a list or tuple of ints (numpy integers
    included), or a 1-D integer numpy array or torch tensor. Anything else (text, a number, nested lists,
    None, floats, bools, 2-D arrays) raises InputError: cwviz never truncates a float or reads a digit."""
    kind = type(value).__name__
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise InputError(f"input_ids must be a 1-D integer tensor, not {value.dim()}-D {value.dtype}")
        return [int(i) for i in value.tolist()]
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
            raise InputError(f"input_ids must be a 1-D integer array, not {value.ndim}-D {value.dtype}")
        return [int(i) for i in value.tolist()]
    if not isinstance(value, (list, tuple)):
        raise InputError(f"input_ids must be a 1-D sequence of token ids (a list, tuple, numpy or torch 1-D array), not {kind}")
    for k, item in enumerate(value):
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            raise InputError(f"input_ids[{k}] is {item!r} ({type(item).__name__}); token ids must be integers")
    return [int(i) for i in value]


def check_length(bundle: Bundle, ids) -> list[int]:
    """``ids`` (:func:`token_ids`) checked against the length limit and the model's vocabulary."""
    ids = token_ids(ids)
    if not ids:
        raise InputError("the prompt gives no tokens; type some text to analyse")
    limit = max_tokens(bundle)
    if len(ids) > limit:
        source = "the model's maximum" if bundle.info.max_positions == limit else "set CWVIZ_MAX_TOKENS to change it"
        raise InputError(f"prompt has {len(ids):,} tokens; the limit is {limit:,} ({source})")
    vocab = getattr(bundle.model.config, "vocab_size", None)
    if vocab is not None and any(i < 0 or i >= vocab for i in ids):
        raise InputError(f"token ids must lie in 0..{vocab - 1} for this model")
    return ids


def next_token_logprobs(
    hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor, chunk: int = memory.LOGIT_CHUNK
) -> torch.Tensor:
    """log p(token_{t+1} | tokens ..t) for t = 0..T-2, float32 [T - 1] on the CPU.

    From the final hidden states ``hidden`` [T, d_model] and the model's logits function ``head``
    (:meth:`cwviz.core.models.Bundle.output_logits`: the output layer with the family's logit scaling or
    soft-capping), run on ``chunk`` rows at a time, each chunk's logits turned into a log-sum-exp in place:
    no [T, vocab] tensor is made.
    """
    out = []
    for start in range(0, hidden.shape[0] - 1, chunk):
        end = min(start + chunk, hidden.shape[0] - 1)
        logits = head(hidden[start:end]).float()  # (rows, vocab), a fresh tensor
        target = logits.gather(1, ids[start + 1 : end + 1, None].to(logits.device))[:, 0]
        peak = logits.amax(dim=-1, keepdim=True)
        out.append(target - logits.sub_(peak).exp_().sum(-1).log_() - peak[:, 0])
    return torch.cat(out).cpu() if out else torch.zeros(0)


def perplexity(logprobs: np.ndarray | torch.Tensor) -> float:
    """exp of the mean negative log-probability (mean taken in float64); nan when there are none."""
    logprobs = np.asarray(logprobs, dtype=np.float64)
    return math.exp(-logprobs.mean()) if logprobs.size else math.nan


def integer_index(value, what: str) -> int:
    """``value`` as a Python int when it is an integer: an int, a numpy integer or a one-element integer
    tensor (anything with ``__index__``), never a bool. Anything else (``"1"``, ``1.0``, ``True``) raises
    SelectionError saying that ``what`` must be an integer: cwviz does not guess what a float or text meant."""
    dtype = str(getattr(value, "dtype", ""))
    if isinstance(value, (bool, np.bool_)) or dtype in ("bool", "torch.bool"):
        raise SelectionError(f"{what} must be an integer, not the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise SelectionError(f"{what} must be an integer, not {value!r} ({type(value).__name__})") from None


def check_layer(layer: int, num_layers: int, hint: str = "") -> int:
    """``layer`` as an int, or SelectionError naming the model's layers: the one layer check of cwviz
    (analyses, sinks, faithfulness, CLI). ``hint`` is added to the message (e.g. "or use all")."""
    layer = integer_index(layer, "a layer")
    if not 0 <= layer < num_layers:
        raise SelectionError(f"layer {layer} is out of range; this model has layers 0..{num_layers - 1}" + (f" ({hint})" if hint else ""))
    return layer


#: What :func:`analyze` calls for each row block of each layer during the pass: ``(layer, first, stop, measures)``.
BlockConsumer = Callable[[int, int, int, LayerMeasures], None]


def analyze(
    bundle: Bundle,
    text: str | None = None,
    *,
    input_ids: list[int] | None = None,
    progress: Progress | None = None,
    each_block: BlockConsumer | None = None,
    kinds: tuple[str, ...] = KINDS,
) -> Analysis:
    """Run the model once on ``text`` (or on ``input_ids``) and record every attention layer.

    ``progress(done, layers)`` (:mod:`cwviz.core.progress`) is called as each attention layer has run.

    ``each_block(layer, first, stop, measures)``: a reader of every layer (a whole-prompt reduction, an
    evaluation over a dataset) gets each layer's row blocks *during* the pass, in the blocks and with the
    measures of :meth:`Analysis.row_blocks` (``kinds``: the contribution kinds they hold; their ``value`` is
    per head, [head, key, d_head]), layer after layer.
    Each block's α is computed once, for the measures and for the layer's output z = α v (float32, then the
    model's dtype), which the model then continues with instead of SDPA's: equal to rounding, and the
    scores and softmax that reading the layers afterwards would redo are saved (BENCHMARKS.md, "one
    pass"). The measures are those of the returned :class:`Analysis` (which is as without ``each_block``),
    to float32 rounding. Keep reductions of the blocks rather than the blocks: together they are every
    layer's T x T maps.

    Raises :class:`~cwviz.core.errors.InputError` for an empty or over-long prompt and
    :class:`~cwviz.core.errors.ResourceError` when the estimate of :mod:`cwviz.core.memory` exceeds what is free.
    """
    if input_ids is None:
        ids = tokenize(bundle, text if text is not None else "")
    else:
        ids = check_length(bundle, input_ids)
        if text is None:
            text = bundle.tokenizer.decode(ids)
    device = bundle.input_device
    spill = spill_for(memory.records_bytes(bundle.info, len(ids)), device)
    memory.check(bundle.model.config, bundle.info, len(ids), device, spilled=spill is not None)
    batch = torch.tensor([ids], device=device)
    # The base model only: the output layer (T x vocab logits, the largest product for a small model and
    # a long prompt) runs when the log-probabilities are first asked for, in chunks of rows.
    with (
        memory.guard(device),
        memory.compact_heap(),
        torch.inference_mode(),
        forward_pass(bundle.attention_modules, progress=progress, spill=spill, attend=_streamer(bundle, each_block, kinds)) as records,
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


def _streamer(bundle: Bundle, each_block: BlockConsumer | None, kinds: tuple[str, ...]):
    """The :class:`~cwviz.core.capture.Attend` of :func:`analyze` with ``each_block``: a layer's z from its
    row blocks, each block's measures handed to ``each_block`` on the way; None without ``each_block``."""
    kinds = check_kinds(kinds)
    if each_block is None:
        return None

    def attend(layer: int, rec: LayerRecord) -> torch.Tensor:
        gram = bundle.gram(layer).to(rec.value.device)
        norms = value_norms(rec.value, gram, bundle.info.heads)
        rec = for_blocks(rec)
        heads, num_tokens, _ = rec.query.shape
        z = torch.empty(heads, num_tokens, rec.value.shape[-1], dtype=torch.float32, device=rec.value.device)
        for group in block_groups(record_blocks(rec), memory.block_cells(num_tokens, rec.value.device)):
            alphas = []
            for first, stop, keys in group:
                alphas.append(alpha := attention_rows(rec, first, stop, keys))
                z[:, first:stop] = grouped_matmul(alpha, rec.value[:, :keys], rec.copies)
            start = group[0][0]
            side = query_side(z[:, start : group[-1][1]], gram)  # one product for the group's rows
            for (first, stop, keys), alpha in zip(group, alphas):
                query = side.rows(first - start, stop - start)
                measures = layer_measures(
                    alpha, rec.value[:, :keys], gram=gram, value_norm=norms[:, :keys], query=query, kinds=kinds, copies=rec.copies
                )
                each_block(layer, first, stop, measures)
        return z

    return attend


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
                head = self.bundle.output_logits if self._final_hidden is not None and self.bundle.has_logits else None
                if head is None:
                    self._logprobs = np.zeros(0, dtype=np.float32)
                else:
                    ids = torch.tensor(self.input_ids)
                    with memory.guard(self._final_hidden.device), torch.inference_mode():
                        logprobs = next_token_logprobs(self._final_hidden, head, ids)
                    self._logprobs = logprobs.numpy()
                    self._final_hidden = None
            return self._logprobs

    @property
    def perplexity(self) -> float:
        """exp of the mean next-token negative log-likelihood over the prompt (nan for encoders or T = 1)."""
        return perplexity(self.next_token_logprobs)

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
        query: QuerySide | None = None,
        kinds: tuple[str, ...] = KINDS,
        rec: LayerRecord | None = None,
    ) -> LayerMeasures:
        """:meth:`rows` against the keys ``0..keys-1`` only (the caller knows the rows see no later key); ``query``
        the rows' :class:`~cwviz.core.measures.QuerySide` when the caller has it for the whole layer; ``kinds``
        the contribution kinds to compute; ``rec`` the layer's record when the caller has it (:func:`for_blocks`)."""
        rec = self.records[layer] if rec is None else rec
        with memory.guard(rec.value.device), torch.inference_mode():
            alpha = attention_rows(rec, start, stop, keys)
            gram = self.bundle.gram(layer).to(rec.value.device)
            if query is None and rec.output.dtype == torch.float32:
                # As in layer(): the model's own z = α v when it is float32 (a quarter of the rows' products).
                query = query_side(rec.output[:, start:stop], gram)
            value_norm = self.value_norms(layer)[:, :keys]
            return layer_measures(alpha, rec.value[:, :keys], gram=gram, value_norm=value_norm, query=query, kinds=kinds, copies=rec.copies)

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
        query = self._query_side(layer)  # one product for the layer, sliced per block
        with torch.inference_mode():
            rec = for_blocks(self.records[layer])
        for first, stop, keys in record_blocks(rec, start):
            yield first, stop, self._rows(layer, first, stop, keys, None if query is None else query.rows(first, stop), kinds, rec)

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
    def to_dict(self, layers: list[int] | int | None = None, heads: list[int] | int | None = None, digits: int = 6) -> dict:
        """The JSON export (schema in the README): tokens, and per layer and head the attention and
        inter-head contribution rows and the output norms. Causal rows keep only keys 0..i.

        ``layers``, ``heads``: None (all), one index, or a list of them (each written once, in the order given).

        Layers are read in row blocks (:meth:`row_blocks`); what the dict itself holds grows with the
        square of the prompt (about :data:`JSON_BYTES_PER_VALUE` bytes a value as Python floats and then
        as JSON text), so an export that would not fit raises ResourceError naming the choice to narrow."""
        layers = _selection(layers, self.num_layers, self.check_layer)
        heads = _selection(heads, self.num_heads, self.check_head)
        causal = self.bundle.arch.causal
        t = self.num_tokens
        values = 2 * len(layers) * len(heads) * (t * (t + 1) // 2 if causal else t * t)
        memory.check_fits(
            values * JSON_BYTES_PER_VALUE,
            torch.device("cpu"),
            f"the JSON of {len(layers)} layer(s) x {len(heads)} head(s) at {t:,} tokens ({values:,} values)",
            "choose one layer and one head (--layer, --head; Analysis.to_dict(layers=[...], heads=[...])) or a shorter prompt",
        )

        out_layers = []
        for layer in layers:
            attention: dict[int, list] = {h: [] for h in heads}
            contribution: dict[int, list] = {h: [] for h in heads}
            head_norms, layer_norms = [], []
            for first, _, m in self.row_blocks(layer):
                a, c = _np(m.attention), _np(m.contribution("inter"))  # (H, rows, keys)
                for h in heads:
                    for r in range(a.shape[1]):
                        end = first + r + 1 if causal else a.shape[2]
                        attention[h].append(_round(a[h, r, :end], digits))
                        contribution[h].append(_round(c[h, r, :end], digits))
                head_norms.append(_np(m.head_output_norm))
                layer_norms.append(_np(m.output_norm))
            head_norm, layer_norm = np.concatenate(head_norms, axis=1), np.concatenate(layer_norms)
            # A layer with learned sinks (gpt-oss): each query's share of attention that went to the sink.
            sunk = self.learned_sink_attention(layer) if self._shell(layer).sinks is not None else None
            out_layers.append(
                {
                    "layer": layer,
                    "output_norm": _round(layer_norm, digits),
                    "heads": [
                        {
                            "head": h,
                            "attention": attention[h],
                            "contribution_inter": contribution[h],
                            "output_norm": _round(head_norm[h], digits),
                            **({} if sunk is None else {"learned_sink_attention": _round(sunk[h], digits)}),
                        }
                        for h in heads
                    ],
                }
            )
        return {
            "schema": "cwviz.analysis",  # the id of version 1, whatever the module is called
            "version": JSON_SCHEMA_VERSION,
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
        path = Path(path)
        text = json.dumps(self.to_dict(layers, heads), ensure_ascii=False)
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise InputError(
                f"cannot write {str(path)!r}: {reason}; choose a file in a folder that exists and that you can write to"
            ) from None
        return path


def _selection(values, count: int, check: Callable[[int], int]) -> list[int]:
    """Layers or heads to export: every one of ``count`` for None, one index, or several, each ``check``-ed and
    kept once in the order given."""
    if values is None:
        return list(range(count))
    try:
        values = [values] if isinstance(values, (str, bytes)) else list(values)
    except TypeError:  # one index (an int, a numpy integer, a 0-d tensor)
        values = [values]
    return list(dict.fromkeys(check(v) for v in values))


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _round(values: np.ndarray, digits: int) -> list[float | None]:
    """Round to ``digits`` significant digits; non-finite values become None (JSON null)."""
    return [float(f"{v:.{digits}g}") if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64).ravel()]
