"""Dashboard interaction at about 512 tokens: server time of a selection change, and chart payloads.

Runs the real app through ``streamlit.testing.v1.AppTest`` (the script runs as on the server, without
a browser) on the embedded model with the shipped ~500-token example. The baseline is the first load
of the same page in the same process (model load from cache plus the analysis); each change of layer,
head or query token must not rerun the model, so it should cost a small fraction of that.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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

    def change(label: str, kind: str, values) -> float:
        times = []
        for value in values[:repeats]:
            widget = next(w for w in getattr(at.sidebar, kind) if w.label == label)
            times.append(_timed(lambda: widget.set_value(value).run()))
            assert not at.exception, [e.value for e in at.exception]
        return statistics.median(times)

    layer_s = change("Layer", "slider", [3, 20, 9, 27])
    head_s = change("Head", "selectbox", [2, 5, "all", 7])
    token_s = change("Query token", "selectbox", [tokens // 2, tokens // 3, tokens - 5, 100])
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
