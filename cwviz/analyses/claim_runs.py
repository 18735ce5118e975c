"""Running the claims check on a model (:mod:`cwviz.analyses.claims` judges what it gives): the faithfulness protocol
claim 1 is checked under (:func:`protocol`), one item's claims record (:func:`item_payload`, run through the sweep
runner :mod:`cwviz.analyses.sweep` by ``cwviz claims`` and the Claims page), and the page's items
(:func:`gsm8k_items`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..core.defaults import CLAIMS_MAX_TOKENS, CLAIMS_RATES, DEFAULT_BATCH_SIZE, DEFAULT_DRAWS, SEED
from ..core.method.analysis import analyze
from ..core.method.interventions import ScaleValues
from . import claim_items, faithfulness, sinks
from .claims import RANKINGS
from .codecs.checks import CLAIMS


def protocol(
    rates: Sequence[float] = CLAIMS_RATES,
    max_tokens: int = CLAIMS_MAX_TOKENS,
    *,
    seed: int = SEED,
    batch_size: int = DEFAULT_BATCH_SIZE,
    draws: int = DEFAULT_DRAWS,
) -> faithfulness.Protocol:
    """The faithfulness protocol claim 1 is checked under, for ``cwviz claims`` and the Claims page alike: the claims'
    rankings (:data:`~cwviz.analyses.claims.RANKINGS`, the random control among them) at ``rates`` (%), each item cut
    to ``max_tokens``; every other choice is faithfulness's default (each rank scope is set per run by
    :func:`item_payload`)."""
    return faithfulness.Protocol(
        rates=rates,
        measures=RANKINGS,
        seed=seed,
        batch_size=batch_size,
        max_tokens=max_tokens,
        draws=draws,
    )


def item_payload(bundle, text: str, protocol, scopes: Sequence[str], sink=0, example: int = 0) -> dict:
    """One item's claims record payload: ``{"skipped", "tokens", "faithfulness": {scope: faithfulness payload},
    "sinks": {name: float for SINK_STATS}}``. One clean pass is shared by every scope's masked runs and the sink table;
    one more pass removes the sink's value in every layer (attention kept) for claim 5, and one its control: in each
    layer the value of one non-sink key of about the sink's attention mass (:func:`claim_items.control_keys`)."""
    ids = faithfulness.example_ids(bundle, text, protocol.max_tokens)
    if ids is None or len(ids) < 3:  # the sink statistics need a query that sees the sink and another key
        return CLAIMS.encode(0 if ids is None else len(ids))
    analysis = analyze(bundle, input_ids=ids)
    tables = {
        scope: faithfulness.run_example(
            bundle, ids, replace(protocol, rank_scope=scope), example=example, analysis=analysis
        )
        for scope in scopes
    }
    sink = sinks.resolve_sink(analysis, sink)
    after = analyze(bundle, input_ids=ids, intervention=ScaleValues(positions=(sink,), factor=0.0))
    draw = claim_items.control_keys(claim_items.attention_mass(analysis), sink, protocol.seed, example)
    control = analyze(bundle, input_ids=ids, intervention=claim_items.remove_values(draw.keys))
    stats = claim_items.sink_statistics(analysis, after, sinks.sink_table(analysis, sink), sink, control, draw)
    return CLAIMS.encode(len(ids), tables, stats)


def gsm8k_items(n: int) -> list[str]:
    """The first ``n`` GSM8K items ``--gsm8k`` reads (the shipped sample, or ``$CWVIZ_GSM8K``): the page's run."""
    from ..core.util.texts import gsm8k_path, read_texts

    return read_texts(gsm8k_path(), n=n)
