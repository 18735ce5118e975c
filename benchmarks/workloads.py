"""What the benchmarks measure, and how they time it: the workloads (a cwviz analysis, its flows, the baselines it is
compared with), the timers that run a candidate and its baseline side by side, and the memory probe's runner.

``benchmarks.run`` (the sections and the report), ``benchmarks.dashboard``, ``benchmarks.gpu_check`` and the child
process ``benchmarks.memory_probe`` all import it, and it imports none of them: the one place these pieces live.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def long_ids(bundle, tokens: int) -> list[int]:
    """``tokens`` token ids of real text: GSM8K questions and answers, concatenated (``$CWVIZ_GSM8K``, e.g. the
    full test split, or the 40-item sample that ships with cwviz, repeated as needed)."""
    from cwviz.core.util.texts import gsm8k_path, read_texts

    texts = read_texts(gsm8k_path(), n=400)
    ids = bundle.tokenizer("\n\n".join(texts))["input_ids"]
    if len(ids) < tokens:
        ids = ids * (tokens // len(ids) + 1)
    return ids[:tokens]


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(candidate, baseline, repeats: int, *others) -> tuple[float, ...]:
    """Median seconds of each (candidate, baseline, then ``others``), run alternately so that machine
    load affects all alike."""
    fns = (candidate, baseline, *others)
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return tuple(statistics.median(t) for t in times)


# -- what is measured --------------------------------------------------------------------------------


def sdpa_forward(bundle, ids):
    """The baseline: the base model's forward pass with PyTorch SDPA attention, nothing recorded and no
    attention maps (the cheapest way to run the part of the model that cwviz analyses)."""
    bundle.model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            return bundle.final_hidden(torch.tensor([ids], device=bundle.input_device))
    finally:
        bundle.model.set_attn_implementation("cwviz")


def plain_forward(bundle, ids):
    """The second baseline: one forward pass with eager attention and output_attentions=True (every layer's
    attention maps, as bertviz and most tools get them)."""
    bundle.model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            device = bundle.input_device
            return bundle.model(
                input_ids=torch.tensor([ids], device=device), output_attentions=True, use_cache=False
            ).attentions
    finally:
        bundle.model.set_attn_implementation("cwviz")


#: Longest prompt the eager output_attentions baseline runs at: it holds every layer's [heads, T, T] maps
#: (4.4 GB for the embedded model at 2048 tokens, 18 GB at 4096).
EAGER_MAX_TOKENS = 2048


def full_analysis(bundle, ids, logprobs: bool = False):
    """Capture plus every layer's attention and inter- and intra-head contributions, read in row blocks
    (``Analysis.row_blocks``, as the head overview and the sinks table read them), and with ``logprobs`` the
    next-token log-probabilities, which run the output layer."""
    from cwviz import analyze

    analysis = analyze(bundle, input_ids=ids)
    read_every_block(analysis)
    if logprobs:
        _ = analysis.next_token_logprobs  # computed on first access
    return analysis


def read_every_block(analysis) -> None:
    """Every layer's attention and both contribution kinds, in the row blocks of ``Analysis.row_blocks``."""
    for layer in range(analysis.num_layers):
        for _, _, m in analysis.row_blocks(layer):
            m.attention, m.contribution("inter"), m.contribution("intra")


def one_pass_analysis(bundle, ids):
    """:func:`full_analysis` in one pass: ``analyze(each_row_block=...)`` hands each layer's row blocks over while the
    layer runs, so each block's scores and softmax serve both the model's attention output and the measures."""
    from cwviz import analyze

    def read(layer, first, stop, m):
        m.attention, m.contribution("inter"), m.contribution("intra")

    return analyze(bundle, input_ids=ids, each_row_block=read)


def whole_layer_analysis(bundle, ids):
    """:func:`full_analysis` through the API's whole-layer maps (``Analysis.layer``: [heads, T, T] a layer)."""
    from cwviz import analyze

    analysis = analyze(bundle, input_ids=ids)
    for layer in range(analysis.num_layers):
        m = analysis.layer(layer)
        m.attention, m.contribution("inter"), m.contribution("intra")
    return analysis


def naive_contributions(bundle, ids):
    """What the LLM Transparency Tool does: materialise every per-pair vector α_ij^h ṽ_j^h, per layer."""
    from cwviz import analyze

    analysis = analyze(bundle, input_ids=ids)
    for layer in range(analysis.num_layers):
        alpha = analysis.attention_tensor(layer)  # (H, Q, K)
        v = analysis.values(layer)
        v_tilde = torch.einsum("hmd,hkd->hkm", analysis.w_heads(layer), v)  # (H, K, D)
        per_pair = alpha[..., None] * v_tilde[:, None]  # (H, Q, K, D)
        head_out = per_pair.sum(2)  # (H, Q, D)
        out = head_out.sum(0)  # (Q, D)
        (per_pair * out[None, :, None]).sum(-1) / (out.norm(dim=-1) ** 2)[None, :, None]
        (per_pair * head_out[:, :, None]).sum(-1) / (head_out.norm(dim=-1) ** 2)[..., None]
        del per_pair
    return analysis


def value_zeroing(bundle, ids, layer: int):
    """Value zeroing (Mohebbi et al. 2023) for one layer: one forward pass per token j with v_j = 0,
    score = cosine distance between the clean and the zeroed layer output of each query."""
    from cwviz import analyze
    from cwviz.core.method.capture import forward_pass
    from cwviz.core.method.interventions import ScaleValues

    clean = analyze(bundle, input_ids=ids).layer_record(layer).output  # (H, Q, d)
    w = torch.tensor(0.0)
    for j in range(len(ids)):
        with (
            torch.inference_mode(),
            forward_pass(bundle.attention_modules, intervention=ScaleValues((j,), 0.0, frozenset({layer}))) as records,
        ):
            bundle.final_hidden(torch.tensor([ids]))  # no output layer, as in analyze
        zeroed = records[layer].output
        w = w + torch.nn.functional.cosine_similarity(clean.flatten(0), zeroed.flatten(0), dim=0)
    return w


def flow_of_prompt(bundle, ids):
    """The signed flow of the whole model into the last position (docs/METHOD.md section 6), its analysis included
    (the memory probe's ``flow``)."""
    from cwviz import analyze
    from cwviz.core.method.flow import flow

    return flow(analyze(bundle, input_ids=ids))


def effect_of_prompt(bundle, ids):
    """The effect flow of the whole prompt into its last position (docs/METHOD.md section 7.1: one backward pass, every
    layer's edges and each head's part), its analysis included (the memory probe's ``effect``)."""
    from cwviz import analyze
    from cwviz.core.method.attribution import attribute

    return attribute(analyze(bundle, input_ids=ids), "effect")


def one_layer_analysis(bundle, ids, layer: int):
    from cwviz import analyze

    return analyze(bundle, input_ids=ids).contributions(layer, "inter")


def masked_batch(bundle, tokens: int, batch: int):
    """The ids [batch, T] and the keep masks of ``batch`` distinct masked runs of one GSM8K example, as a
    faithfulness sweep makes them (the default measures, both curves, rates 10 and 50 %)."""
    from cwviz import analyze
    from cwviz.analyses import faithfulness

    ids = long_ids(bundle, tokens)
    protocol = faithfulness.Protocol(rates=(10.0, 50.0))
    analysis = analyze(bundle, input_ids=ids)
    ranked = faithfulness.rankings(analysis, protocol)
    runs = [run for run in protocol.runs() if run[0] != "value_weighted_output_normalized"][:batch]
    masks = {}
    for layer, visible in ranked.num_visible.items():
        parts = [
            faithfulness.keep_mask(
                ranked.ranks[m, d][layer], faithfulness.masked_counts(visible, r), visible, c, ranked.visible[layer]
            )
            for m, c, r, d in runs
        ]
        masks[layer] = torch.stack(parts)  # (B, 1, Q, K)
    return torch.tensor([ids] * len(runs)), masks


def base_forward(bundle, ids, intervention=None):
    """The base model's forward pass of a batch (no output layer), under ``intervention``."""
    from cwviz.core.method.capture import forward_pass

    with torch.inference_mode(), forward_pass(bundle.attention_modules, record=False, intervention=intervention):
        return bundle.final_hidden(ids)


def memory_gb(bundle, tokens: int) -> float:
    """GB of every layer's [heads, T, T] float32 attention maps (what output_attentions returns)."""
    return bundle.info.layers * bundle.info.heads * tokens * tokens * 4 / 1e9


def memory_probe(what: str, tokens: int) -> float:
    """Peak resident-size increase (MiB) of ``what`` in a fresh child process."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory_probe", what, str(tokens)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_increase_mib"]


def dashboard_steps(bundle, ids, layer: int = 0, mark=None):
    """What the heatmaps page computes for a new prompt, in its order, with its default picks (layer 0, all
    heads, the first measure family, inter, the last token as query, the window view): the recorded forward
    pass, the heatmap pair and its chart, then the head overview and its chart. Returns the seconds at which
    the first heatmap and the head overview were ready. ``mark(step)``, when given, is called after each step
    ("recording pass", "window heatmap", "head overview")."""
    from cwviz import analyze
    from cwviz.analyses import tables
    from cwviz.charts import head_grid, heatmaps

    mark = mark or (lambda step: None)
    start = time.perf_counter()
    analysis = analyze(bundle, input_ids=ids)
    mark("recording pass")
    measure = tables.measure_name(next(iter(tables.FAMILIES)), "inter")
    cells = tables.heatmap_cells(analysis, layer, None, measure, "inter", analysis.num_tokens - 1, "window")
    heatmaps.heatmap_pair(cells, query=analysis.num_tokens - 1).to_dict()
    first = time.perf_counter() - start
    mark("window heatmap")
    summary = tables.head_summary(analysis)
    head_grid.head_overview(summary, next(iter(head_grid.OVERVIEW_METRICS)), layer, None).to_dict()
    mark("head overview")
    return first, time.perf_counter() - start
