"""Dashboard interaction at about 512 tokens: server time of a selection change, and chart payloads; and on a
long prompt (8,192 tokens, :func:`bench_long`) against a plain SDPA forward pass of the same prompt.

Runs the real app through ``streamlit.testing.v1.AppTest`` (the script runs as on the server, without
a browser) on the embedded model with the shipped ~500-token example. The baseline is the first load
of the same page in the same process (model load from cache plus the analysis); each change of layer,
head or query token must not rerun the model, so it should cost a small fraction of that.
"""

from __future__ import annotations

import json
import statistics
import time

from benchmarks.workloads import ROOT, dashboard_steps, long_ids, memory_probe, sdpa_forward

LONG_EXAMPLE = "Long report (about 500 tokens)"


def _payload_bytes(at) -> list[int]:
    """Bytes of each chart sent to the browser: its Vega-Lite spec plus its Arrow datasets."""
    sizes = []
    for element in at.get("vega_lite_chart"):
        sizes.append(len(element.proto.spec.encode()) + sum(len(d.data.data) for d in element.proto.datasets))
    return sizes


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _sidebar_changes(at, repeats: int, tokens: int) -> tuple[float, float, float]:
    """Median seconds of a layer, a head and a query-token change in the sidebar (``repeats`` of each)."""

    def change(label: str, kind: str, values) -> float:
        times = []
        for value in values[:repeats]:
            widget = next(w for w in getattr(at.sidebar, kind) if w.label == label)
            times.append(_timed(lambda: widget.set_value(value).run()))
            assert not at.exception, [e.value for e in at.exception]
        return statistics.median(times)

    return (
        change("Layer", "slider", [3, 20, 9, 27]),
        change("Head", "selectbox", [2, 5, "all", 7]),
        change("Query token", "selectbox", [tokens // 2, tokens // 3, tokens - 5, 100]),
    )


def bench(repeats: int = 3) -> list[str]:
    from streamlit.testing.v1 import AppTest

    from cwviz.app import state

    text = next(e.text for e in state.examples() if e.name == LONG_EXAMPLE)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.query_params["prompt"] = text
    first = _timed(at.run)
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    sidebar = at.sidebar
    layer = next(w for w in sidebar.slider if w.label == "Layer")
    tokens = len(next(w for w in sidebar.selectbox if w.label == "Query token").options)

    layer_s, head_s, token_s = _sidebar_changes(at, repeats, tokens)
    payload = _payload_bytes(at)
    del layer
    rows = [
        f"| {tokens} tokens, heatmaps page | seconds | ratio to the first load | target |",
        "|---|---|---|---|",
        f"| first load (baseline: model from cache, analysis, charts) | {first:.2f} | 1 | |",
        f"| layer change (median of {repeats}) | {layer_s:.3f} | {layer_s / first:.3f} | ≤ 0.200 s |",
        f"| head change | {head_s:.3f} | {head_s / first:.3f} | ≤ 0.200 s |",
        f"| query token change | {token_s:.3f} | {token_s / first:.3f} | ≤ 0.200 s |",
        "",
        f"Chart payloads sent to the browser (spec + Arrow data): {', '.join(f'{b / 1024:.0f} KiB' for b in payload)}.",
    ]
    print("\n".join(rows), flush=True)
    return rows


if __name__ == "__main__":
    print(json.dumps(bench(), indent=1))


def bench_long(bundle, tokens: int = 8192, repeats: int = 3) -> list[str]:
    """The heatmaps page on a ``tokens``-token prompt (GSM8K text) on the embedded model: when the first heatmap
    and the head overview are ready (library steps as the page runs them), a layer, head or query change (the
    real page through AppTest, caches warm), and the peak resident size above the loaded model (fresh child
    processes), each against a plain SDPA forward pass of the same prompt."""
    from streamlit.testing.v1 import AppTest

    ids = long_ids(bundle, tokens)
    base = _timed(lambda: sdpa_forward(bundle, ids))
    first, overview = dashboard_steps(bundle, ids)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=1800)
    at.query_params["prompt"] = bundle.tokenizer.decode(ids)
    load = _timed(at.run)
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    shown = len(next(w for w in at.sidebar.selectbox if w.label == "Query token").options)

    layer_s, head_s, token_s = _sidebar_changes(at, repeats, shown)
    mem_base, mem_dash = memory_probe("sdpa", tokens), memory_probe("dashboard", tokens)
    rows = [
        f"| {shown} tokens, heatmaps page | seconds | ratio to the plain SDPA forward | target |",
        "|---|---|---|---|",
        f"| plain SDPA forward pass of the prompt (baseline) | {base:.1f} | 1 | |",
        f"| first heatmap ready (recorded forward, window cells, chart) | {first:.1f} | **{first / base:.2f}** | ≤ 2 |",
        f"| head overview ready (then every head's summary, streamed) | {overview:.1f} | **{overview / base:.2f}** | ≤ "
        "3 |",
        f"| the whole page through AppTest, first run | {load:.1f} | {load / base:.2f} | |",
        f"| layer change (median of {repeats}) | {layer_s:.3f} | | ≤ 0.5 s |",
        f"| head change | {head_s:.3f} | | ≤ 0.5 s |",
        f"| query token change | {token_s:.3f} | | ≤ 0.5 s |",
        "",
        "| peak resident size above the loaded model (MiB) | plain SDPA forward | the page's steps | ratio | target |",
        "|---|---|---|---|---|",
        f"| {tokens} tokens | {mem_base:.0f} | {mem_dash:.0f} | **{mem_dash / mem_base:.2f}** | ≤ 1.5 |",
    ]
    print("\n".join(rows), flush=True)
    return rows
