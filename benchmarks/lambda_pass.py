"""One λ of the Sinks page's intervention at about 300 tokens, in the library: before (a whole recorded analysis of
the intervened pass, the head-output statistics recomputed from its records: how cwviz computed it until issue 44's
one-pass λ) against after (:func:`cwviz.analyses.sink_interventions.intervene_on_sink` with the clean side given, as
the page calls it: one pass that records nothing) and a plain pass of the model with its perplexity, the floor.
Interleaved, a new λ each time (the page caches a λ once computed). Beside them the clean side, made once per prompt
(:func:`cwviz.analyses.sink_interventions.head_output_stats`: the analysis's recorded head outputs reduced, no pass;
until the records were read it was a pass of its own, about the plain pass)."""

from __future__ import annotations

import statistics
import time

import torch


def bench(bundle, repeats: int = 3) -> list[str]:
    from cwviz import analyze
    from cwviz.analyses import sink_interventions
    from cwviz.app import state
    from cwviz.core.method.interventions import ScaleValues, batch_perplexity
    from tests.sink_reference import recorded_output_stats

    examples = [e.text for e in state.examples()]
    analysis = analyze(bundle, " ".join(" ".join(examples).split()[:230]))  # the browser benchmark's long prompt
    clean = sink_interventions.head_output_stats(analysis, 0)
    _ = analysis.perplexity  # the clean side's perplexity, made once per prompt on the page too
    ids = torch.tensor([analysis.input_ids])
    every = frozenset(range(analysis.num_layers))
    times: dict[str, list[float]] = {"before": [], "after": [], "plain": [], "clean": []}
    for i in range(repeats):
        factor = 0.05 * (i + 1)
        start = time.perf_counter()
        after = analyze(
            bundle, analysis.text, input_ids=analysis.input_ids, intervention=ScaleValues((0,), factor, every)
        )
        recorded_output_stats(after, 0)
        _ = after.perplexity
        times["before"].append(time.perf_counter() - start)
        del after
        start = time.perf_counter()
        sink_interventions.intervene_on_sink(analysis, 0, factor, None, clean=clean)
        times["after"].append(time.perf_counter() - start)
        start = time.perf_counter()
        batch_perplexity(bundle, ids)
        times["plain"].append(time.perf_counter() - start)
        start = time.perf_counter()
        sink_interventions.head_output_stats(analysis, 0)
        times["clean"].append(time.perf_counter() - start)
    before, after, plain, clean = (statistics.median(times[k]) for k in ("before", "after", "plain", "clean"))
    rows = [
        f"| λ at {analysis.num_tokens} tokens, every layer (median of {repeats}) | before (s) | after (s) | plain pass "
        "(s) | after / before | after / plain | clean side (s) | clean side / plain |",
        "|---|---|---|---|---|---|---|---|",
        f"| one λ | {before:.2f} | {after:.2f} | {plain:.2f} | {after / before:.2f} | {after / plain:.2f} | "
        f"{clean:.2f} | {clean / plain:.2f} |",
    ]
    print("\n".join(rows), flush=True)
    return rows
