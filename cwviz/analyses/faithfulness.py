"""Faithfulness by causal intervention (docs/METHOD.md section 3): mask what a measure ranks first (or last)
and see how much the model's perplexity suffers.

For each example, one clean forward pass (:func:`cwviz.core.method.analysis.analyze`) records every layer; every
measure's ranking of the keys of every query comes from that pass. Then each masked run (one measure,
one curve, one removal rate) is one forward pass of the same tokens through
:class:`cwviz.core.method.interventions.KeepKeys`, the runs of one example batched along the batch dimension.

Protocol (our defaults; the paper's exact protocol is not public):

* **Scores**: layer-level (all heads, aggregated as :data:`cwviz.core.method.measures.LAYER_AGGREGATION` says:
  raw attention averaged, value-weighted and inter-head measures summed, intra-head contributions
  averaged), or per head with ``per_head=True`` (each head masks its own top keys).
* **Ranking**: by the signed score (``rank_by="signed"``: a negative contribution ranks below every positive one) or by
  its magnitude (``rank_by="absolute"``). Scores within :data:`cwviz.analyses.masks.TIE_TOLERANCE` of the pool's largest
  |score| tie, and ties keep key order (:func:`cwviz.analyses.masks.rank_keys`). ``random`` is the control: ``draws``
  rankings of uniform scores, draw d seeded by ``(seed, example index, d)``, averaged within each example
  (:func:`~cwviz.analyses.faithfulness_summary.per_example_means`).
* **Share**: for query i with n_i visible keys (keys 0..i in a causal model; fewer under a sliding
  window) a removal rate r% masks k_i = min(ceil(r/100 · n_i), n_i − 1) keys; a query that sees a single key
  (query 0) is never masked (:func:`cwviz.analyses.masks.maskable`); rate 0 masks nothing.
* **Scope** (``rank_scope``, docs/METHOD.md section 3): ``query`` ranks each query's keys (k_i of them masked
  per query, as above); ``token`` ranks the keys by their score averaged over the queries that see them and
  masks the top ceil(r/100 · T) keys for every query; ``layer`` ranks all visible (query, key) pairs of a
  layer together and masks the top ceil(r/100 · N) of the N pairs (:func:`scope_ranks`).
* **Comprehensiveness** masks the k_i highest-ranked keys; **sufficiency** the k_i lowest-ranked.
* **Where**: rankings from the clean pass of each layer, the masks applied in every layer at once in
  one forward pass (``layer=L``: only in layer L). Masking key j for query i removes
  α_ij^h ṽ_j^h from the layer output in every head; attention is not renormalised.
* **ΔPPL** = PPL(masked) − PPL(clean), perplexity of the example's own next tokens (all positions), and the
  scale-free **log-perplexity ratio** log(PPL(masked) / PPL(clean))
  (:func:`~cwviz.analyses.faithfulness_summary.log_ratio`).
* **Summary** (:mod:`cwviz.analyses.faithfulness_summary`): mean ΔPPL over examples with a seeded
  percentile-bootstrap 95 % interval; each measure's gap to the random control; the area under each curve by the
  trapezoid rule over the rates given as fractions (rate / 100), from the first rate to the last (from 0 when rate 0
  is given).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..core.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_DRAWS,
    DEFAULT_RATES,
    EXAMPLE_MAX_TOKENS,
    RANKED_MEASURES,
    SEED,
)
from ..core.loading.inputs import check_layer, check_length
from ..core.loading.models import Bundle
from ..core.method.analysis import Analysis, analyze
from ..core.method.interventions import KeepKeys, batch_logprobs
from ..core.method.logprobs import perplexity_of as sequence_perplexity
from ..core.util.errors import InputError, UnsupportedModelError
from ..core.util.progress import Progress
from ..core.util.texts import check_text
from .faithfulness_summary import log_ratio
from .masks import CURVES, keep_mask, maskable, masked_counts, scope_ranks
from .schema import ALL_MEASURES, AUTO_BATCH, RANK_BY, RANK_SCOPES

log = logging.getLogger(__name__)

#: Columns of the per-example table :func:`run_example` returns.
EXAMPLE_COLUMNS = [
    "example",
    "measure",
    "curve",
    "rate",
    "draw",
    "tokens",
    "ppl_clean",
    "ppl_masked",
    "delta_ppl",
    "log_ppl_ratio",
]


@dataclass(frozen=True)
class Protocol:
    """How a faithfulness sweep runs (see the module docstring for each choice)."""

    rates: tuple[float, ...] = DEFAULT_RATES
    measures: tuple[str, ...] = RANKED_MEASURES
    layer: int | None = None  # None: mask in every layer at once
    per_head: bool = False
    rank_by: str = "signed"
    rank_scope: str = "query"
    seed: int = SEED
    batch_size: int = DEFAULT_BATCH_SIZE
    max_tokens: int = EXAMPLE_MAX_TOKENS
    draws: int = DEFAULT_DRAWS  # random rankings per example (the control)

    def __post_init__(self) -> None:
        if isinstance(self.rates, (str, bytes)) or not isinstance(self.rates, Iterable):
            raise InputError(f"rates must be a sequence of percentages such as (10, 50), not {self.rates!r}")
        if not self.rates:
            raise InputError("give at least one removal rate, e.g. --rates 10,50")
        for rate in self.rates:
            if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, (int, float, np.integer, np.floating)):
                raise InputError(
                    f"removal rates are percentages in 0..100 (numbers), not {rate!r} ({type(rate).__name__})"
                )
            if not 0 <= rate <= 100:
                raise InputError(f"removal rates are percentages in 0..100, not {rate:g}")
        for name in ("seed", "batch_size", "max_tokens", "draws"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise InputError(f"{name} must be an integer, not {value!r} ({type(value).__name__})")
        if self.draws < 1:
            raise InputError(f"the random control needs at least one draw, not {self.draws}")
        if self.seed < 0:  # numpy's generators take non-negative seeds only
            raise InputError(f"the seed must be a non-negative integer, not {self.seed}")
        object.__setattr__(self, "rates", tuple(sorted({float(r) for r in self.rates})))
        unknown = [m for m in self.measures if m not in ALL_MEASURES]
        if unknown or not self.measures:
            raise InputError(
                f"unknown measure(s) {', '.join(unknown) or '(none given)'}; choose from: {', '.join(ALL_MEASURES)}"
            )
        object.__setattr__(self, "measures", tuple(dict.fromkeys(self.measures)))
        if self.rank_by not in RANK_BY:
            raise InputError(f"rank_by must be one of {', '.join(RANK_BY)}, not {self.rank_by!r}")
        if self.rank_scope not in RANK_SCOPES:
            raise InputError(f"rank_scope must be one of {', '.join(RANK_SCOPES)}, not {self.rank_scope!r}")
        if self.batch_size < 0:
            raise InputError(f"the batch size must be at least 1 (or {AUTO_BATCH}: auto), not {self.batch_size}")
        if self.max_tokens < 2:
            raise InputError(f"the token cap must be at least 2 (perplexity needs a next token), not {self.max_tokens}")

    def ranked(self) -> list[tuple[str, int]]:
        """Every ranking of one example: (measure, draw), draw 0 for a measure, 0..draws-1 for ``random``."""
        return [(m, d) for m in self.measures for d in range(self.draws if m == "random" else 1)]

    def runs(self) -> list[tuple[str, str, float, int]]:
        """Every masked run of one example: (measure, curve, rate, draw)."""
        return [(m, c, r, d) for m, d in self.ranked() for c in CURVES for r in self.rates]


# -- one example ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rankings:
    """Every measure's key ranks in the masked layers of one example.

    ``ranks[measure, draw][layer]``: [1 or head, query, key] (1 = layer-level scores);
    ``num_visible[layer]``: the size of each ranked pool (:func:`scope_ranks`): [query] (n_i) under the query
    scope, [1, 1] under the token and layer scopes; ``visible[layer]``: [query, key] bool.
    """

    ranks: dict[tuple[str, int], dict[int, torch.Tensor]]
    num_visible: dict[int, torch.Tensor]
    visible: dict[int, torch.Tensor] | None = None


def rankings(analysis: Analysis, protocol: Protocol, example: int = 0) -> Rankings:
    """The rankings of :class:`Protocol`'s measures from the clean pass of ``analysis``, keyed by (measure, draw)
    (:meth:`Protocol.ranked`). Random draw d of example e is seeded by (seed, e, d). Only :func:`maskable` pairs are
    ranked: a query that sees a single key is never masked (docs/METHOD.md section 3, the sufficiency rule)."""
    layers = masked_layers(analysis.num_layers, protocol.layer)
    ranked = protocol.ranked()
    rngs = {d: np.random.default_rng([protocol.seed, example, d]) for m, d in ranked if m == "random"}
    ranks: dict[tuple[str, int], dict[int, torch.Tensor]] = {key: {} for key in ranked}
    num_visible: dict[int, torch.Tensor] = {}
    visibility: dict[int, torch.Tensor] = {}
    for layer in layers:
        visible = maskable(analysis.key_mask(layer))  # (Q, K)
        visibility[layer] = visible
        measures = analysis.layer(layer)
        heads = analysis.num_heads if protocol.per_head else 1
        for name, draw in ranked:
            if name == "random":
                shape = (heads, *visible.shape)
                scores = torch.from_numpy(rngs[draw].random(shape, dtype=np.float32)).to(visible.device)
            else:
                scores = measures.per_head(name) if protocol.per_head else measures.layer_level(name)[None]
                if protocol.rank_by == "absolute":
                    scores = scores.abs()
            ranks[name, draw][layer], num_visible[layer] = scope_ranks(scores, visible, protocol.rank_scope)
    return Rankings(ranks, num_visible, visibility)


def masked_layers(num_layers: int, layer: int | None) -> list[int]:
    """Every layer, or the one chosen (checked)."""
    if layer is None:
        return list(range(num_layers))
    return [check_layer(layer, num_layers, hint="or use all")]


def check_causal(bundle: Bundle) -> None:
    if not bundle.info.causal:
        raise UnsupportedModelError(
            f"faithfulness measures next-token perplexity, so it needs a causal language model; "
            f"{bundle.info.id} ({bundle.info.architecture}) is an encoder"
        )


def example_ids(bundle: Bundle, text: str, max_tokens: int) -> list[int] | None:
    """Token ids of one example, cut to ``max_tokens``; None when fewer than two tokens remain. InputError for
    text that is not valid (:func:`~cwviz.core.util.texts.check_text`)."""
    if not isinstance(text, str):
        raise InputError(f"an example must be text, not {type(text).__name__}")
    check_text(text, "an example")
    ids = list(bundle.tokenizer(text, add_special_tokens=True)["input_ids"])[:max_tokens]
    if len(ids) < 2:
        return None
    return check_length(bundle, ids)


def masked_logprobs(
    bundle: Bundle, analysis: Analysis, protocol: Protocol, example: int = 0, progress: Progress | None = None
) -> dict[tuple[str, str, float, int], np.ndarray]:
    """Next-token log-probabilities [T - 1] of every masked run of one example (the keys of
    :meth:`Protocol.runs`), the rankings taken from the clean pass ``analysis``.

    Each distinct masked run is one forward pass, ``batch_size`` runs at a time. Runs whose masks are identical are run
    once: measures that rank every query's keys alike (at the layer level under the query scope, output normalisation by
    ‖o_i‖ divides a whole row by one number, so ``value_weighted_output_normalized`` ranks exactly as
    ``value_weighted``; the token and layer scopes compare rows, so there they differ), and rates that give the same k_i
    everywhere (short texts). Rate 0 masks nothing, so its runs are the clean pass itself (not a masked pass that masks
    nothing, which would differ from it by float rounding): with nothing masked, every score equals the clean one
    exactly.

    ``progress(done, total)`` (:mod:`cwviz.core.util.progress`) counts the example's forward passes: the clean one
    (done when this is called, so reported first) and each batch of masked runs.
    """
    ranked = rankings(analysis, protocol, example)
    layers = list(ranked.num_visible)
    counts = {rate: {l: masked_counts(ranked.num_visible[l], rate) for l in layers} for rate in protocol.rates}
    same_measure = _first_equal(
        protocol.ranked(), lambda a, b: all(torch.equal(ranked.ranks[a][l], ranked.ranks[b][l]) for l in layers)
    )
    same_rate = _first_equal(protocol.rates, lambda a, b: all(torch.equal(counts[a][l], counts[b][l]) for l in layers))
    runs = protocol.runs()
    distinct = list(dict.fromkeys((same_measure[m, d], c, same_rate[r]) for m, c, r, d in runs if r > 0))
    ids = torch.tensor([analysis.input_ids])  # (1, T)
    out: dict[tuple[tuple[str, int], str, float], np.ndarray] = {}
    size = batch_size_for(bundle, analysis.num_tokens, protocol, len(distinct))
    passes = 1 + -(-len(distinct) // size)
    if progress is not None:
        progress(1, passes)
    for done, start in enumerate(range(0, len(distinct), size), start=2):
        chunk = distinct[start : start + size]
        masks = {
            l: torch.stack(
                [
                    keep_mask(ranked.ranks[m][l], counts[r][l], ranked.num_visible[l], c, ranked.visible[l])
                    for m, c, r in chunk
                ]
            )
            for l in layers
        }  # layer -> (B, 1 or head, Q, K)
        batch = ids.expand(len(chunk), -1)
        out.update(zip(chunk, batch_logprobs(bundle, batch, KeepKeys(masks)).numpy()))
        if progress is not None:
            progress(done, passes)
    clean = analysis.next_token_logprobs
    return {(m, c, r, d): clean if r <= 0 else out[same_measure[m, d], c, same_rate[r]] for m, c, r, d in runs}


def masked_run_bytes(bundle: Bundle, tokens: int, per_head: bool = False) -> int:
    """Bytes one more masked run adds to a batched forward pass of ``tokens`` tokens: its keep masks in every
    layer (bool, held for the whole pass), one layer's float32 scores, probabilities and masked product
    [head, T, T], and its activations (the MLP's three [T, intermediate] and a few [T, d_model])."""
    info, config = bundle.info, bundle.model.config
    item = torch.finfo(getattr(torch, info.dtype)).bits // 8 if hasattr(torch, info.dtype) else 4
    masks = info.layers * (info.heads if per_head else 1) * tokens * tokens
    maps = 3 * info.heads * tokens * tokens * 4
    intermediate = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * info.d_model
    return masks + maps + tokens * (3 * intermediate + 8 * info.d_model) * item


def batch_size_for(bundle: Bundle, tokens: int, protocol: Protocol, runs: int) -> int:
    """The masked runs per forward pass: ``protocol.batch_size``, or with :data:`AUTO_BATCH` as many as fit in
    :data:`cwviz.core.method.memory.HEADROOM` of the free memory (less one chunk of logits), at most ``runs`` on a GPU
    and :data:`DEFAULT_BATCH_SIZE` elsewhere."""
    from ..core.method import memory

    if protocol.batch_size != AUTO_BATCH:
        return protocol.batch_size
    device = bundle.input_device
    cap = max(1, runs if device.type == "cuda" else min(runs, DEFAULT_BATCH_SIZE))
    have = memory.available(device)
    if have is None:
        return min(cap, DEFAULT_BATCH_SIZE)
    vocab = getattr(bundle.model.config, "vocab_size", 0) or 0
    spare = memory.HEADROOM * have - memory.LOGIT_CHUNK * vocab * 8
    return max(1, min(cap, int(spare // masked_run_bytes(bundle, tokens, protocol.per_head))))


def run_example(
    bundle: Bundle,
    input_ids: Sequence[int],
    protocol: Protocol = Protocol(),
    example: int = 0,
    progress: Progress | None = None,
    analysis: Analysis | None = None,
) -> pd.DataFrame:
    """Every masked run of one example: a table with :data:`EXAMPLE_COLUMNS`, one row per run.

    One clean pass gives the rankings and PPL(clean) (``analysis``: that pass already made of ``input_ids``, e.g.
    shared by several protocols); the masked runs are :func:`masked_logprobs` (which reports ``progress``).
    """
    check_causal(bundle)
    if analysis is None:
        analysis = analyze(bundle, input_ids=list(input_ids))
    logprobs = masked_logprobs(bundle, analysis, protocol, example, progress=progress)
    return runs_table(protocol, example, analysis, logprobs)


def runs_table(
    protocol: Protocol,
    example: int,
    clean: Analysis,
    logprobs: dict[tuple[str, str, float, int], np.ndarray],
) -> pd.DataFrame:
    """One row per masked run of ``protocol`` (:data:`EXAMPLE_COLUMNS`): the clean pass's perplexity (of ``clean``)
    beside each run's, from its next-token log-probabilities [T - 1] (``logprobs``, :func:`masked_logprobs`). A text
    example's table, and a multiple-choice item's (its correct choice's sequence) before its answers are added."""
    runs = protocol.runs()
    ppl_masked = np.array([sequence_perplexity(logprobs[run]) for run in runs])  # (run,)
    ppl_clean = clean.perplexity
    return pd.DataFrame(
        {
            "example": example,
            "measure": [m for m, _, _, _ in runs],
            "curve": [c for _, c, _, _ in runs],
            "rate": [r for _, _, r, _ in runs],
            "draw": [d for _, _, _, d in runs],
            "tokens": clean.num_tokens,
            "ppl_clean": ppl_clean,
            "ppl_masked": ppl_masked,
            "delta_ppl": ppl_masked - ppl_clean,
            "log_ppl_ratio": log_ratio(ppl_masked, ppl_clean),
        },
        columns=EXAMPLE_COLUMNS,
    )


def _first_equal(items: Sequence, equal: Callable) -> dict:
    """Map each item to the first item equal to it (itself when none is)."""
    first: dict = {}
    for i, item in enumerate(items):
        first[item] = next((other for other in items[:i] if first[other] == other and equal(other, item)), item)
    return first


def iter_examples(
    bundle: Bundle,
    texts: Iterable[str],
    protocol: Protocol = Protocol(),
    *,
    start: int = 0,
    guard: Callable[[], AbstractContextManager] | None = None,
    progress: Progress | None = None,
) -> Iterator[tuple[int, pd.DataFrame | None]]:
    """:func:`run_example` for each text in turn (cut to ``protocol.max_tokens``): yields
    ``(index, table)``, one pair per text, so a caller can save, report progress or stop between examples.

    The one example loop of cwviz: the CLI and the dashboard's faithfulness page both use it.
    ``start`` numbers the first text (a resumed run); ``guard``, when given, makes a context entered
    around each example's forward passes (the dashboard's shared-server slot). A text with fewer than
    two tokens yields ``(index, None)`` (and is logged). ``progress`` reports the forward passes of the example
    in progress (:func:`masked_logprobs`), afresh for each example.
    """
    if isinstance(texts, str):
        raise InputError(
            "give a list of prompts, not one string (iter_examples(bundle, [text], ...) for a single example)"
        )
    check_causal(bundle)
    masked_layers(bundle.info.layers, protocol.layer)
    for index, text in enumerate(texts, start=start):
        ids = example_ids(bundle, text, protocol.max_tokens)
        if ids is None:
            log.warning("example %d has fewer than two tokens; skipped", index)
            yield index, None
            continue
        with guard() if guard is not None else nullcontext():
            table = run_example(bundle, ids, protocol, example=index, progress=progress)
        yield index, table
