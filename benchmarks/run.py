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
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

import cwviz
from benchmarks import browser, dashboard, lambda_pass
from benchmarks.workloads import (
    EAGER_MAX_TOKENS,
    ROOT,
    base_forward,
    full_analysis,
    interleaved,
    long_ids,
    masked_batch,
    median_time,
    memory_gb,
    memory_probe,
    naive_contributions,
    one_layer_analysis,
    one_pass_analysis,
    plain_forward,
    sdpa_forward,
    value_zeroing,
    whole_layer_analysis,
)
from cwviz.core.util.heap import tune_heap


def bench_masked(bundle, lengths, batch: int, repeats: int) -> list[str]:
    """Masked passes (:class:`cwviz.core.method.interventions.KeepKeys`, every layer masked) against plain forward
    passes of the same batch: the whole pass with the next-token log-probabilities (what a sweep runs), and
    the base model alone (no output layer, so the attention's share is larger)."""
    from cwviz.core.method.interventions import KeepKeys, batch_logprobs

    rows = [
        "| T | batch | plain pass + log-probs (s, baseline) | masked (s) | ratio | target | plain base model (s) | "
        "masked | ratio |",
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
        "| T | plain SDPA forward (s, baseline) | full analysis in one pass (s) | ratio | target | recorded, then "
        "read in row blocks (s) | ratio | recorded + next-token log-probs: ratio | eager output_attentions (s) | one "
        "pass / eager | whole-layer maps (s) | ratio |",
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
            f"| {tokens} | {base:.3f} | {cand:.3f} | **{cand / base:.2f}** | {targets.get(tokens, '')} | "
            f"{recorded:.3f} | {recorded / base:.2f} | {with_logprobs / base:.2f} {eager}"
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
        "| T | one-pass analysis (s, baseline) | flow of an analysis (s) | ratio | target | analyze() alone (s) | "
        "flow / analyze() | flow with its heads table (s) | ratio |",
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
            f"| {tokens} | {base:.2f} | {cand:.2f} | **{cand / base:.2f}** | ≤ 1.3 | {recorded:.2f} | "
            f"{cand / recorded:.2f} | {heads:.2f} | {heads / base:.2f} |"
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
        cand, base = interleaved(
            lambda: attribute(analysis, "effect"), lambda: one_pass_analysis(bundle, ids), max(1, repeats)
        )
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
    stream, about 970 tokens) costs the analysis, and what it saves the flow into its last token (no pass of its
    own)."""
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
            f"| {tokens} | {analysing:.2f} | {keeping:.2f} | **{keeping / analysing:.2f}** | {plain_flow:.2f} | "
            f"{kept_flow:.2f} | **{kept_flow / plain_flow:.2f}** |"
        )
        print(rows[-1], flush=True)
    return rows


def bench_window(bundle, lengths, repeats) -> list[str]:
    """A windowed heatmap (all heads, the dashboard's default view of a long prompt) and the token page's
    decomposition, computing only their rows, against computing the whole layer's maps as before."""
    from cwviz import analyze
    from cwviz.analyses import tables

    rows = [
        "| T | whole layer's maps (s, baseline) | windowed heatmap (s) | ratio | one query's decomposition (s) | ratio "
        "|",
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
            fresh(
                lambda: tables.heatmap_cells(
                    analysis, layer, None, "contribution_inter", "inter", tokens // 2, "window"
                )
            ),
            fresh(lambda: analysis.layer(layer).layer_level("contribution_inter")),
            max(1, repeats if tokens <= 1024 else repeats // 2),
            fresh(lambda: tables.decomposition(analysis, layer, tokens // 2, 3)),
        )
        rows.append(
            f"| {tokens} | {whole:.3f} | {window:.3f} | **{window / whole:.3f}** | {one_query:.4f} | "
            f"{one_query / whole:.4f} |"
        )
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
        f"| peak memory above the loaded model (MiB) | {mem['naive']:.0f} | {mem['full']:.0f} | "
        f"**{mem['full'] / mem['naive']:.3f}** |",
    ]
    print("\n".join(rows), flush=True)
    return rows


def bench_value_zeroing(bundle, tokens, layer) -> list[str]:
    ids = long_ids(bundle, tokens)
    base = median_time(lambda: value_zeroing(bundle, ids, layer), 1)
    cand = median_time(lambda: one_layer_analysis(bundle, ids, layer), 3)
    rows = [
        f"| T = {tokens}, layer {layer} | value zeroing (baseline, {tokens} forward passes) | cwviz (one pass) | ratio "
        "|",
        "|---|---|---|---|",
        f"| time (s) | {base:.2f} | {cand:.3f} | **{cand / base:.4f}** |",
    ]
    print("\n".join(rows), flush=True)
    return rows


def bench_memory(bundle, lengths) -> list[str]:
    rows = [
        "| T | plain SDPA forward (MiB, baseline) | full analysis (MiB) | ratio | eager output_attentions (MiB) | "
        "ratio |",
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
        (
            "`cwviz sinks --sink first` (an argument error)",
            timed("-m", "cwviz", "sinks", "--text", "a", "--sink", "first"),
        ),
    ]
    rows = [
        f"| command line start (median of {repeats}) | seconds | × bare Python | × the old start (every command "
        "imported first) |",
        "|---|---|---|---|",
    ]
    fns = [fn for _, fn in cases]
    times = interleaved(fns[0], fns[1], repeats, *fns[2:], bare, old)
    *new, python_only, before = times
    for (name, _), seconds in zip(cases, new):
        rows.append(f"| {name} | {seconds:.2f} | {seconds / python_only:.1f} | **{seconds / before:.3f}** |")
    rows.append(
        f"| the old start: `cwviz --help` with every command's module imported | {before:.2f} | "
        f"{before / python_only:.1f} | 1 |"
    )
    rows.append(f"| bare Python start (`python -c pass`), for scale | {python_only:.2f} | 1 | |")
    print("\n".join(rows), flush=True)
    return rows


def bench_conversion(repeats: int) -> list[str]:
    """A GGUF's first conversion with its header parsed once (:func:`cwviz.core.loading.checkpoints.parsed_once`)
    against transformers' own three parses, alternated in this process; SmolLM2, and Gemma 3 270M where its packages are
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


#: A section's rows, given the loaded model, the run's token lengths and its options.
Section = Callable[[Any, list[int], argparse.Namespace], list[tuple[str, list[str]]]]


def _lengths_in(lengths: list[int], wanted: tuple[int, ...], fallback: int) -> list[int]:
    """The run's lengths that a section measures at (``wanted``), or ``[fallback]`` when it has none of them."""
    return [t for t in lengths if t in wanted] or [fallback]


def _flow(bundle, lengths: list[int], args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    memory_tokens = 8192 if 8192 in lengths else 0  # the long prompt, when the run's lengths include it
    rows = bench_flow(bundle, _lengths_in(lengths, (300, 512, 2048), 512), args.repeats, memory_tokens)
    return [("Signed flow across layers against the one-pass analysis", rows)]


def _effect(bundle, lengths: list[int], args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    memory_tokens = 2048 if 2048 in lengths else 0
    rows = bench_effect(bundle, _lengths_in(lengths, (300, 512), 512), args.repeats, memory_tokens)
    return [("The effect flow against the one-pass analysis", rows)]


def _browser_flow(bundle, lengths: list[int], args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    return [
        ("The Flow page in the browser (Chromium)", browser.bench_flow(repeats=args.repeats)),
        ("The Flow page's clicks at 30 tokens (Chromium)", browser.bench_flow_clicks(repeats=args.repeats)),
    ]


def _masked(bundle, lengths: list[int], args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    rows = bench_masked(bundle, [t for t in lengths if t <= 1024] or [256], args.batch, args.repeats)
    return [("Masked passes (faithfulness) against plain passes of the same batch", rows)]


#: Every section, in the order a run measures them (``--only`` picks some; ``browser`` brings ``browser-flow``).
SECTIONS: dict[str, Section] = {
    "overhead": lambda bundle, lengths, args: [
        ("Full analysis against a plain forward pass (time)", bench_overhead(bundle, lengths, args.repeats)),
    ],
    "memory": lambda bundle, lengths, args: [
        ("Full analysis against a plain forward pass (peak memory)", bench_memory(bundle, lengths)),
    ],
    "flow": _flow,
    "effect": _effect,
    "window": lambda bundle, lengths, args: [
        (
            "Only the rows shown: windowed heatmaps and the token page",
            bench_window(bundle, [t for t in lengths if t >= 512], args.repeats),
        )
    ],
    "naive": lambda bundle, lengths, args: [
        (
            "Against materialising every per-pair vector (LLM Transparency Tool style)",
            bench_naive(bundle, 256, args.repeats),
        )
    ],
    "zeroing": lambda bundle, lengths, args: [
        ("Against value zeroing (one forward pass per token)", bench_value_zeroing(bundle, 128, 15)),
    ],
    "cold": lambda bundle, lengths, args: [("Cold start", bench_cold_start())],
    "cli": lambda bundle, lengths, args: [("Command line start", bench_cli(max(args.repeats, 5)))],
    "conversion": lambda bundle, lengths, args: [("A GGUF's first conversion", bench_conversion(args.repeats))],
    "dashboard": lambda bundle, lengths, args: [
        ("Dashboard interaction (T = 512)", dashboard.bench(repeats=args.repeats)),
    ],
    "dashboard-long": lambda bundle, lengths, args: [
        (
            f"Dashboard on a long prompt (T = {max(lengths)})",
            dashboard.bench_long(bundle, max(lengths), repeats=args.repeats),
        )
    ],
    "browser": lambda bundle, lengths, args: [("Waits in the browser (Chromium)", browser.bench(repeats=args.repeats))],
    "browser-flow": _browser_flow,
    "lambda": lambda bundle, lengths, args: [
        ("One λ of the sinks intervention, before and after the one-pass λ", lambda_pass.bench(bundle, args.repeats)),
    ],
    "masked": _masked,
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(SECTIONS), action="append")
    parser.add_argument("--lengths", default="128,512,1024,2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=3)
    history = str(ROOT / "benchmarks" / "history.md")
    parser.add_argument("--out", default=history, help="append the report here ('-' for none)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    batch = "masked runs per forward pass in the masked section (default 8)"
    parser.add_argument("--batch", type=int, default=8, help=batch)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    tune_heap()  # measured as the dashboard's server and the cwviz command run: with their heap settings
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(t) for t in args.lengths.split(",")]
    only = set(args.only or SECTIONS) | ({"browser-flow"} if "browser" in (args.only or ()) else set())

    transformers.utils.logging.disable_progress_bar()
    bundle = cwviz.load_model("embedded", device="cpu")
    sections = [section for name, run in SECTIONS.items() if name in only for section in run(bundle, lengths, args)]
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
