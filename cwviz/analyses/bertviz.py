"""bertviz head view and model view, for attention or contribution weights, behind one function.

Choices, stated on the page:

* bertviz draws each weight as the opacity of a line, which cannot be negative. Contribution weights
  are drawn as ``max(c, 0)`` with intra-head contributions (each head's row sums to 1, as attention
  does); negative contributions are therefore not drawn. The Heatmaps page shows their sign.
* bertviz loads require.js, d3 and jQuery from cdnjs. The returned page says so in plain words when
  those scripts cannot load (offline), instead of leaving an empty box.
* Size: the head view shows the selected layer, the model view at most :data:`MODEL_VIEW_LAYERS`
  layers around it; both at most :data:`HEAD_VIEW_TOKENS` (head) / :data:`MODEL_VIEW_TOKENS` (model) tokens,
  the first ones. For causal models the leading block of the matrix is exact: rows of the first n
  queries only involve the first n keys; an encoder's rows also weigh the later keys, and the note says so.
* Tokens enter bertviz's JSON as placeholders that are replaced with JSON strings in which ``<``, ``>``
  and ``&`` are escaped, so a token such as ``</script>`` cannot end the script. bertviz draws tokens
  with d3's ``.text()``, as text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from ..core.method.analysis import Analysis

#: Leading tokens the head view and the model view show at most (bertviz draws a line per pair).
HEAD_VIEW_TOKENS = 96
MODEL_VIEW_TOKENS = 40
MODEL_VIEW_LAYERS = 4
#: bertviz's two renderers (the heatmaps' window/binned views are :data:`cwviz.analyses.schema.VIEWS`).
BERTVIZ_VIEWS = ("head", "model")
WEIGHTS = ("attention", "contribution")
FALLBACK_ID = "cwviz-bertviz-offline"
OFFLINE_MESSAGE = (
    "The bertviz view could not load its scripts (require.js, d3 and jQuery from cdnjs.cloudflare.com). "
    "This page needs network access to that CDN; the rest of cwviz works offline. "
    "The same weights are on the Heatmaps page."
)


@dataclass(frozen=True)
class BertvizScope:
    layers: tuple[int, ...]
    tokens: int
    note: str


def scope(analysis: Analysis, view: str, layer: int) -> BertvizScope:
    """Which layers and how many leading tokens a view shows, and a sentence saying so."""
    if view not in BERTVIZ_VIEWS:
        raise ValueError(f"view must be one of {BERTVIZ_VIEWS}, not {view!r}")
    layer = analysis.check_layer(layer)
    t = analysis.num_tokens
    if view == "head":
        layers, cap = (layer,), HEAD_VIEW_TOKENS
    else:
        lo = max(0, min(layer - MODEL_VIEW_LAYERS // 2, analysis.num_layers - MODEL_VIEW_LAYERS))
        layers, cap = tuple(range(lo, min(lo + MODEL_VIEW_LAYERS, analysis.num_layers))), MODEL_VIEW_TOKENS
    n = min(t, cap)
    where = f"layer {layer}" if view == "head" else f"layers {layers[0]}–{layers[-1]}"
    note = (
        f"{where}, all {t} tokens"
        if n == t
        else f"{where}, the first {n} of {t} tokens (bertviz slows down beyond {cap})"
    )
    if n < t and not analysis.info.causal:  # an encoder's rows also weigh the later keys, which are not drawn
        note += f"; these rows also weigh the {t - n} later tokens, which are not drawn"
    return BertvizScope(layers, n, note)


def weights(analysis: Analysis, layer: int, shown: str, n: int) -> np.ndarray:
    """[head, query, key] weights for bertviz: attention (``shown`` "attention"), or intra-head contributions clipped
    at 0 ("contribution")."""
    if shown not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, not {shown!r}")
    rows = analysis.rows(layer, 0, n)  # the first n query rows only, never the layer's T x T maps
    w = rows.attention if shown == "attention" else rows.contribution("intra").clamp_min(0.0)
    return w[:, :, :n].float().cpu().numpy()


def _placeholder(i: int) -> str:
    return f"__cwviz_token_{i}__"


def _safe_json_string(text: str) -> str:
    return json.dumps(text).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(analysis: Analysis, view: str = "head", weights: str = "attention", layer: int = 0) -> str:
    """A self-contained HTML page with the bertviz ``view`` ("head" or "model") of ``weights``."""
    from bertviz import head_view, model_view

    where = scope(analysis, view, layer)
    n = where.tokens
    tensors = {l: torch.from_numpy(_weights(analysis, l, weights, n))[None] for l in where.layers}  # (1, H, n, n)
    first = tensors[where.layers[0]]
    per_layer = [tensors.get(l, first) for l in range(analysis.num_layers)]  # bertviz indexes by layer
    placeholders = [_placeholder(i) for i in range(n)]
    if view == "head":
        html = head_view(
            per_layer,
            placeholders,
            prettify_tokens=False,
            layer=where.layers[0],
            include_layers=list(where.layers),
            html_action="return",
        ).data
    else:
        html = model_view(
            per_layer, placeholders, prettify_tokens=False, include_layers=list(where.layers), html_action="return"
        ).data
    for i in reversed(range(n)):  # reversed: token_1 must not match inside token_10
        html = html.replace(json.dumps(placeholders[i]), _safe_json_string(analysis.tokens[i]))
    return _page(html)


_weights = weights


REQUIRE_TAG = '<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js"></script>'


def _page(body: str) -> str:
    """Wrap bertviz's HTML so that a failed CDN load shows a plain message (and raises no script error)."""
    message = json.dumps(OFFLINE_MESSAGE)
    guard = """<script>
  if (typeof window.requirejs === "undefined") {
    window.require = { config: function () {} };
    window.requirejs = function () { cwvizOffline(); };
  } else {
    window.requirejs.onError = function () { cwvizOffline(); };
  }
</script>"""
    body = body.replace(REQUIRE_TAG, REQUIRE_TAG + guard, 1) if REQUIRE_TAG in body else guard + body
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"></head>
<body style="margin:0; background:#fff; color:#222; font-family: sans-serif;">
<div id="{FALLBACK_ID}"
     style="display:none; padding:12px; border:1px solid #e0a800; background:#fff8e1; border-radius:6px;"></div>
<script>
  function cwvizOffline() {{
    var box = document.getElementById("{FALLBACK_ID}");
    box.textContent = {message};
    box.style.display = "block";
    document.querySelectorAll('[id^="bertviz-"]').forEach(function (el) {{ el.style.display = "none"; }});
  }}
</script>
{body}
<script>
  setTimeout(function () {{ if (!document.querySelector("#vis svg, svg")) cwvizOffline(); }}, 10000);
</script>
</body></html>"""
