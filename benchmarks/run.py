"""cwviz benchmarks: every figure a ratio against a baseline measured side by side.

    .venv/bin/python -m benchmarks.run                 # everything, appended to benchmarks/history.md
    .venv/bin/python -m benchmarks.run --only overhead --lengths 128,512

Timings: the candidate and its baseline run interleaved in this one process, each repeated, and the
median is kept. Peak memory: a process's peak resident size cannot be reset, so each memory figure comes
from a fresh child process (``benchmarks.memory_probe``) that loads the model, records its resident size,
runs one thing and reports its peak; we report the peak increase over the loaded model and its ratio.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cwviz.core.util.heap import tune_heap

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
            return bundle.model(input_ids=torch.tensor([ids], device=device), output_attentions=True, use_cache=False).attentions
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
            faithfulness.keep_mask(ranked.ranks[m, d][layer], faithfulness.masked_counts(visible, r), visible, c, ranked.visible[layer])
            for m, c, r, d in runs
        ]
        masks[layer] = torch.stack(parts)  # (B, 1, Q, K)
    return torch.tensor([ids] * len(runs)), masks


def base_forward(bundle, ids, intervention=None):
    """The base model's forward pass of a batch (no output layer), under ``intervention``."""
    from cwviz.core.method.capture import forward_pass

    with torch.inference_mode(), forward_pass(bundle.attention_modules, record=False, intervention=intervention):
        return bundle.final_hidden(ids)


def bench_masked(bundle, lengths, batch: int, repeats: int) -> list[str]:
    """Masked passes (:class:`cwviz.core.method.interventions.KeepKeys`, every layer masked) against plain forward
    passes of the same batch: the whole pass with the next-token log-probabilities (what a sweep runs), and
    the base model alone (no output layer, so the attention's share is larger)."""
    from cwviz.core.method.interventions import KeepKeys, batch_logprobs

    rows = [
        "| T | batch | plain pass + log-probs (s, baseline) | masked (s) | ratio | target | plain base model (s) | masked | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tokens in lengths:
        ids, masks = masked_batch(bundle, tokens, batch)
        keep = KeepKeys(masks)
        masked, plain, masked_base, plain_base = interleaved(
            lambda: batch_logprobs(bundle, ids, keep),
            lambda: batch_logprobs(bundle, ids),
            repeats,
            lambda: base_forward(bundle, ids, keep),
            lambda: base_forward(bundle, ids),
        )
        rows.append(
            f"| {tokens} | {len(ids)} | {plain:.3f} | {masked:.3f} | **{masked / plain:.2f}** | ≤ 1.3 "
            f"| {plain_base:.3f} | {masked_base:.3f} | **{masked_base / plain_base:.2f}** |"
        )
        print(rows[-1], flush=True)
    return rows


# -- sections ----------------------------------------------------------------------------------------


def bench_overhead(bundle, lengths, repeats) -> list[str]:
    rows = [
        "| T | plain SDPA forward (s, baseline) | full analysis in one pass (s) | ratio | target | recorded, then read in row blocks (s) "
        "| ratio | recorded + next-token log-probs: ratio | eager output_attentions (s) | one pass / eager | whole-layer maps (s) | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    targets = {512: "≤ 1.3", 2048: "≤ 1.6"}
    for tokens in lengths:
        ids = long_ids(bundle, tokens)
        reps = repeats if tokens <= 2048 else 1  # medians of 3 by default: one run of 2048 tokens moves by ±0.1
        others = [lambda: full_analysis(bundle, ids), lambda: full_analysis(bundle, ids, logprobs=True)]
        if tokens <= EAGER_MAX_TOKENS:
            others += [lambda: plain_forward(bundle, ids), lambda: whole_layer_analysis(bundle, ids)]
        cand, base, recorded, with_logprobs, *more = interleaved(
            lambda: one_pass_analysis(bundle, ids), lambda: sdpa_forward(bundle, ids), reps, *others
        )
        eager = (
            f"| {more[0]:.3f} | {cand / more[0]:.2f} | {more[1]:.3f} | {more[1] / base:.2f} |"
            if more
            else f"| not run (needs {memory_gb(bundle, tokens):.0f} GB) | | not run | |"
        )
        rows.append(
            f"| {tokens} | {base:.3f} | {cand:.3f} | **{cand / base:.2f}** | {targets.get(tokens, '')} | {recorded:.3f} | {recorded / base:.2f} "
            f"| {with_logprobs / base:.2f} {eager}"
        )
        print(rows[-1], flush=True)
    return rows


def bench_flow(bundle, lengths, repeats, memory_tokens: int) -> list[str]:
    """The signed flow of the whole model (``cwviz.core.method.flow.flow`` of an analysis: its own forward pass for the
    residual stream, replaying the analysis's attention outputs, every layer's M in row blocks, the parts, the routing,
    the graph; each head's vocabulary waits for its first reader) against the one-pass analysis of the same prompt;
    beside it the flow with its heads table read (which computes the vocabulary), and the peak memory of analysis +
    flow at ``memory_tokens``."""
    from cwviz import analyze
    from cwviz.core.method.flow import flow

    rows = [
        "| T | one-pass analysis (s, baseline) | flow of an analysis (s) | ratio | target | analyze() alone (s) | flow / analyze() "
        "| flow with its heads table (s) | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tokens in lengths:
        ids = long_ids(bundle, tokens)
        analysis = analyze(bundle, input_ids=ids)
        cand, base, recorded, heads = interleaved(
            lambda: flow(analysis),
            lambda: one_pass_analysis(bundle, ids),
            max(1, repeats if tokens <= 512 else 1),
            lambda: analyze(bundle, input_ids=ids),
            lambda: flow(analysis).heads,
        )
        rows.append(
            f"| {tokens} | {base:.2f} | {cand:.2f} | **{cand / base:.2f}** | ≤ 1.3 | {recorded:.2f} | {cand / recorded:.2f} "
            f"| {heads:.2f} | {heads / base:.2f} |"
        )
        print(rows[-1], flush=True)
    from cwviz.app.services import keeps_stream

    rows += _kept_stream_rows(bundle, [t for t in lengths if keeps_stream(bundle, t)], repeats)
    if memory_tokens:
        rows += memory_rows("flow", "analysis + flow", memory_tokens)
    return rows


def memory_rows(what: str, label: str, tokens: int) -> list[str]:
    """The peak memory of ``what`` (a :mod:`benchmarks.memory_probe` job) at ``tokens`` beside the full analysis's, each
    in a fresh process, as table rows (the target: 2 GB)."""
    full, measured = memory_probe("full", tokens), memory_probe(what, tokens)
    rows = [
        "",
        f"| T = {tokens} | full analysis (MiB above the loaded model, baseline) | {label} (MiB) | ratio | target |",
        "|---|---|---|---|---|",
        f"| peak memory | {full:.0f} | **{measured:.0f}** | {measured / full:.2f} | ≤ 2 GB |",
    ]
    print("\n".join(rows[-3:]), flush=True)
    return rows


def bench_effect(bundle, lengths, repeats, memory_tokens: int) -> list[str]:
    """The effect flow of an analysis (its pass with grad, one backward, every layer's edges and each head's part:
    ``attribute(analysis, "effect")``) against the one-pass analysis of the same prompt; the check on a 30-token
    prompt (every input token taken away, 32 a pass) against the same baseline; the peak memory of analysis + effect
    flow at ``memory_tokens`` (issue 54's targets: ≤ 2.5, ≤ 3 s, ≤ 2 GB)."""
    from cwviz import analyze
    from cwviz.analyses.check import check
    from cwviz.core.method.attribution import attribute, request

    rows = [
        "| T | one-pass analysis (s, baseline) | effect flow of an analysis (s) | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for tokens in lengths:
        ids = long_ids(bundle, tokens)
        analysis = analyze(bundle, input_ids=ids)
        cand, base = interleaved(lambda: attribute(analysis, "effect"), lambda: one_pass_analysis(bundle, ids), max(1, repeats))
        rows.append(f"| {tokens} | {base:.2f} | {cand:.2f} | **{cand / base:.2f}** | ≤ 2.5 |")
        print(rows[-1], flush=True)
    ids = long_ids(bundle, 30)
    analysis = analyze(bundle, input_ids=ids)
    asked = request(analysis)
    cand, base = interleaved(lambda: check(asked, "effect"), lambda: one_pass_analysis(bundle, ids), max(3, repeats))
    rows += [
        "",
        "| T | one-pass analysis (s, baseline) | check against knockouts (s) | ratio | target |",
        "|---|---|---|---|---|",
        f"| 30 | {base:.3f} | **{cand:.2f}** | {cand / base:.1f} | ≤ 3 s |",
    ]
    print(rows[-1], flush=True)
    if memory_tokens:
        rows += memory_rows("effect", "analysis + effect flow", memory_tokens)
    return rows


def _kept_stream_rows(bundle, lengths, repeats) -> list[str]:
    """What an analysis that keeps its residual stream (``analyze(stream=True)``: the dashboard's, up to 64 MiB of
    stream, about 970 tokens) costs the analysis, and what it saves the flow into its last token (no pass of its own)."""
    from cwviz import analyze
    from cwviz.core.method.flow import flow

    rows = [
        "",
        "| T | analyze() (s, baseline) | analyze(stream=True) (s) | ratio | flow of the plain analysis (s, baseline) "
        "| flow of the analysis that kept its stream (s) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for tokens in lengths:
        ids = long_ids(bundle, tokens)
        plain, kept = analyze(bundle, input_ids=ids), analyze(bundle, input_ids=ids, stream=True)
        keeping, analysing, plain_flow, kept_flow = interleaved(
            lambda: analyze(bundle, input_ids=ids, stream=True),
            lambda: analyze(bundle, input_ids=ids),
            max(1, repeats),
            lambda: flow(plain),
            lambda: flow(kept),
        )
        rows.append(
            f"| {tokens} | {analysing:.2f} | {keeping:.2f} | **{keeping / analysing:.2f}** | {plain_flow:.2f} | {kept_flow:.2f} "
            f"| **{kept_flow / plain_flow:.2f}** |"
        )
        print(rows[-1], flush=True)
    return rows


def memory_gb(bundle, tokens: int) -> float:
    """GB of every layer's [heads, T, T] float32 attention maps (what output_attentions returns)."""
    return bundle.info.layers * bundle.info.heads * tokens * tokens * 4 / 1e9


def bench_window(bundle, lengths, repeats) -> list[str]:
    """A windowed heatmap (all heads, the dashboard's default view of a long prompt) and the token page's
    decomposition, computing only their rows, against computing the whole layer's maps as before."""
    from cwviz import analyze
    from cwviz.analyses import tables

    rows = [
        "| T | whole layer's maps (s, baseline) | windowed heatmap (s) | ratio | one query's decomposition (s) | ratio |",
        "|---|---|---|---|---|---|",
    ]
    layer = 14
    for tokens in lengths:
        analysis = analyze(bundle, input_ids=long_ids(bundle, tokens))

        def fresh(fn):
            def run():
                analysis._layers.clear()  # no cached layer: each run computes what it needs
                return fn()

            return run

        window, whole, one_query = interleaved(
            fresh(lambda: tables.heatmap_cells(analysis, layer, None, "contribution_inter", "inter", tokens // 2, "window")),
            fresh(lambda: analysis.layer(layer).layer_level("contribution_inter")),
            max(1, repeats if tokens <= 1024 else repeats // 2),
            fresh(lambda: tables.decomposition(analysis, layer, tokens // 2, 3)),
        )
        rows.append(f"| {tokens} | {whole:.3f} | {window:.3f} | **{window / whole:.3f}** | {one_query:.4f} | {one_query / whole:.4f} |")
        print(rows[-1], flush=True)
    return rows


def bench_naive(bundle, tokens, repeats) -> list[str]:
    ids = long_ids(bundle, tokens)
    cand, base = interleaved(lambda: full_analysis(bundle, ids), lambda: naive_contributions(bundle, ids), repeats)
    mem = {what: memory_probe(what, tokens) for what in ("full", "naive")}
    rows = [
        f"| T = {tokens} | naive per-pair (baseline) | cwviz | ratio cwviz / naive |",
        "|---|---|---|---|",
        f"| time (s) | {base:.3f} | {cand:.3f} | **{cand / base:.3f}** |",
        f"| peak memory above the loaded model (MiB) | {mem['naive']:.0f} | {mem['full']:.0f} | **{mem['full'] / mem['naive']:.3f}** |",
    ]
    print("\n".join(rows), flush=True)
    return rows


def bench_value_zeroing(bundle, tokens, layer) -> list[str]:
    ids = long_ids(bundle, tokens)
    base = median_time(lambda: value_zeroing(bundle, ids, layer), 1)
    cand = median_time(lambda: one_layer_analysis(bundle, ids, layer), 3)
    rows = [
        f"| T = {tokens}, layer {layer} | value zeroing (baseline, {tokens} forward passes) | cwviz (one pass) | ratio |",
        "|---|---|---|---|",
        f"| time (s) | {base:.2f} | {cand:.3f} | **{cand / base:.4f}** |",
    ]
    print("\n".join(rows), flush=True)
    return rows


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


def bench_memory(bundle, lengths) -> list[str]:
    rows = [
        "| T | plain SDPA forward (MiB, baseline) | full analysis (MiB) | ratio | eager output_attentions (MiB) | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for tokens in lengths:
        base, cand = memory_probe("sdpa", tokens), memory_probe("full", tokens)
        if tokens <= EAGER_MAX_TOKENS:
            eager = memory_probe("plain", tokens)
            tail = f"| {eager:.0f} | {cand / eager:.2f} |"
        else:
            tail = f"| not run (needs {memory_gb(bundle, tokens) * 1e9 / 2**20:.0f}) | |"
        rows.append(f"| {tokens} | {base:.0f} | {cand:.0f} | **{cand / base:.2f}** {tail}")
        print(rows[-1], flush=True)
    return rows


def bench_cold_start() -> list[str]:
    code = "import cwviz; b = cwviz.load_model('embedded', device='cpu'); cwviz.analyze(b, 'The capital of France is')"

    def run(env) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True)
        return time.perf_counter() - start

    python_only = median_time(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), 3)
    cached = median_time(lambda: run(dict(os.environ)), 3)
    with tempfile.TemporaryDirectory() as empty:
        first = run(dict(os.environ, CWVIZ_CACHE=empty))
    rows = [
        "| cold start: process start to first finished analysis | seconds | target |",
        "|---|---|---|",
        f"| embedded model cached (median of 3) | {cached:.1f} | ≤ 10 |",
        f"| first use (GGUF conversion into an empty CWVIZ_CACHE) | {first:.1f} | |",
        f"| bare Python start, for scale | {python_only:.2f} | |",
    ]
    print("\n".join(rows), flush=True)
    return rows


#: What ``cwviz --help`` did before its parsers were split from the commands: every command's module imported
#: (torch and transformers with them) before the parser was built.
OLD_CLI_START = (
    "import cwviz.cli.analyze, cwviz.cli.dashboard, cwviz.cli.atlas, cwviz.cli.claims, cwviz.cli.compare, "
    "cwviz.cli.faithfulness, cwviz.cli.report, cwviz.cli.sinks; from cwviz.cli import main; main(['--help'])"
)


def bench_cli(repeats: int) -> list[str]:
    """``cwviz --help``, a command's help and an argument error, each a fresh process, against a bare Python start and
    against the old start (:data:`OLD_CLI_START`), interleaved in this process."""

    def timed(*argv: str):
        def run() -> None:
            subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True)

        return run

    bare = timed("-c", "pass")
    old = timed("-c", OLD_CLI_START)
    cases = [
        ("`cwviz --help`", timed("-m", "cwviz", "--help")),
        ("`cwviz faithfulness --help`", timed("-m", "cwviz", "faithfulness", "--help")),
        ("`cwviz sinks --sink first` (an argument error)", timed("-m", "cwviz", "sinks", "--text", "a", "--sink", "first")),
    ]
    rows = [
        f"| command line start (median of {repeats}) | seconds | × bare Python | × the old start (every command imported first) |",
        "|---|---|---|---|",
    ]
    fns = [fn for _, fn in cases]
    times = interleaved(fns[0], fns[1], repeats, *fns[2:], bare, old)
    *new, python_only, before = times
    for (name, _), seconds in zip(cases, new):
        rows.append(f"| {name} | {seconds:.2f} | {seconds / python_only:.1f} | **{seconds / before:.3f}** |")
    rows.append(f"| the old start: `cwviz --help` with every command's module imported | {before:.2f} | {before / python_only:.1f} | 1 |")
    rows.append(f"| bare Python start (`python -c pass`), for scale | {python_only:.2f} | 1 | |")
    print("\n".join(rows), flush=True)
    return rows


def bench_conversion(repeats: int) -> list[str]:
    """A GGUF's first conversion with its header parsed once (:func:`cwviz.core.loading.checkpoints.parsed_once`) against
    transformers' own three parses, alternated in this process; SmolLM2, and Gemma 3 270M where its packages are
    installed (one run each: about 80 s a pair)."""
    import contextlib

    from cwviz.core.loading import checkpoints

    def convert(gguf_of, once: bool) -> float:
        with tempfile.TemporaryDirectory() as out, gguf_of() as gguf:
            start = time.perf_counter()
            if once:
                checkpoints.convert_gguf(gguf, Path(out) / "model", "benchmark")
            else:  # the same steps without parsed_once: transformers reads the header itself, three times
                checkpoints.save_converted(*checkpoints.read_gguf(gguf), Path(out) / "model", "benchmark")
            return time.perf_counter() - start

    models = [("SmolLM2-135M (Q4_1)", lambda: contextlib.nullcontext(checkpoints.embedded_gguf()), repeats)]
    if importlib.util.find_spec(checkpoints.EMBEDDED_GEMMA_PACKAGE):
        models.append(("Gemma 3 270M (Q4_K_M)", checkpoints.embedded_gemma_gguf, 1))
    rows = ["| GGUF conversion | parsed once (s) | three parses (s) | ratio | runs |", "|---|---|---|---|---|"]
    for name, gguf_of, runs in models:
        once, thrice = [], []
        for _ in range(runs):
            thrice.append(convert(gguf_of, once=False))
            once.append(convert(gguf_of, once=True))
        a, b = statistics.median(once), statistics.median(thrice)
        rows.append(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} | {runs} |")
        print(rows[-1], flush=True)
    return rows


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} CPU cores ({cpu}), torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
        f"Python {platform.python_version()}, load average at the end {load}"
    )


SECTIONS = [
    "overhead",
    "memory",
    "flow",
    "effect",
    "naive",
    "zeroing",
    "cold",
    "cli",
    "conversion",
    "dashboard",
    "dashboard-long",
    "browser",
    "browser-flow",
    "lambda",
    "window",
    "masked",
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=SECTIONS, action="append")
    parser.add_argument("--lengths", default="128,512,1024,2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "history.md"), help="append the report here ('-' for none)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--batch", type=int, default=8, help="masked runs per forward pass in the masked section (default 8)")
    args = parser.parse_args(argv)
    tune_heap()  # measured as the dashboard's server and the cwviz command run: with their heap settings
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(t) for t in args.lengths.split(",")]
    only = set(args.only or SECTIONS)

    import transformers

    import cwviz

    transformers.utils.logging.disable_progress_bar()
    bundle = cwviz.load_model("embedded", device="cpu")
    sections = []
    if "overhead" in only:
        sections.append(("Full analysis against a plain forward pass (time)", bench_overhead(bundle, lengths, args.repeats)))
    if "memory" in only:
        sections.append(("Full analysis against a plain forward pass (peak memory)", bench_memory(bundle, lengths)))
    if "flow" in only:
        flow_lengths = [t for t in lengths if t in (300, 512, 2048)] or [512]
        memory_tokens = 8192 if 8192 in lengths else 0  # the long prompt, when the run's lengths include it
        sections.append(
            ("Signed flow across layers against the one-pass analysis", bench_flow(bundle, flow_lengths, args.repeats, memory_tokens))
        )
    if "effect" in only:
        effect_lengths = [t for t in lengths if t in (300, 512)] or [512]
        memory_tokens = 2048 if 2048 in lengths else 0
        sections.append(
            ("The effect flow against the one-pass analysis", bench_effect(bundle, effect_lengths, args.repeats, memory_tokens))
        )
    if "window" in only:
        sections.append(
            (
                "Only the rows shown: windowed heatmaps and the token page",
                bench_window(bundle, [t for t in lengths if t >= 512], args.repeats),
            )
        )
    if "naive" in only:
        sections.append(
            ("Against materialising every per-pair vector (LLM Transparency Tool style)", bench_naive(bundle, 256, args.repeats))
        )
    if "zeroing" in only:
        sections.append(("Against value zeroing (one forward pass per token)", bench_value_zeroing(bundle, 128, 15)))
    if "cold" in only:
        sections.append(("Cold start", bench_cold_start()))
    if "cli" in only:
        sections.append(("Command line start", bench_cli(max(args.repeats, 5))))
    if "conversion" in only:
        sections.append(("A GGUF's first conversion", bench_conversion(args.repeats)))
    if "dashboard" in only:
        from benchmarks import dashboard

        sections.append(("Dashboard interaction (T = 512)", dashboard.bench(repeats=args.repeats)))
    if "dashboard-long" in only:
        from benchmarks import dashboard

        tokens = max(lengths)
        sections.append((f"Dashboard on a long prompt (T = {tokens})", dashboard.bench_long(bundle, tokens, repeats=args.repeats)))
    if "browser" in only:
        from benchmarks import browser

        sections.append(("Waits in the browser (Chromium)", browser.bench(repeats=args.repeats)))
    if "browser" in only or "browser-flow" in only:
        from benchmarks import browser

        sections.append(("The Flow page in the browser (Chromium)", browser.bench_flow(repeats=args.repeats)))
        sections.append(("The Flow page's clicks at 30 tokens (Chromium)", browser.bench_flow_clicks(repeats=args.repeats)))
    if "lambda" in only:
        from benchmarks import lambda_pass

        sections.append(("One λ of the sinks intervention, before and after the one-pass λ", lambda_pass.bench(bundle, args.repeats)))
    if "masked" in only:
        masked_lengths = [t for t in lengths if t <= 1024] or [256]
        sections.append(
            (
                "Masked passes (faithfulness) against plain passes of the same batch",
                bench_masked(bundle, masked_lengths, args.batch, args.repeats),
            )
        )
    if args.out != "-":
        command = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
        write_report(Path(args.out), sections, command.strip())
    return 0


def write_report(path: Path, sections, command: str) -> None:
    """Append the run to the dated log (``benchmarks/history.md``) as a section of its own; BENCHMARKS.md, the results
    page, takes the figures that replace its latest ones by hand."""
    lines = [
        "",
        f"## {dt.date.today().isoformat()}: `{command}`",
        "",
        f"Machine: {machine()}.",
        "Model: the embedded SmolLM2-135M-Instruct (30 layers, 9 heads, float32, CPU). Prompts: GSM8K test text.",
        "Each ratio is measured side by side in one run (times interleaved in one process, medians; memory in",
        "fresh child processes, peak resident size above the loaded model). See `benchmarks/run.py`.",
        "",
    ]
    for title, rows in sections:
        lines += [f"### {title}", "", *rows, ""]
    with path.open("a", encoding="utf-8") as out:
        out.write("\n".join(lines))
    print(f"appended to {path}")


if __name__ == "__main__":
    raise SystemExit(main())
