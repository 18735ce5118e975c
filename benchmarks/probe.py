"""Probes behind the figures of BENCHMARKS.md that ``benchmarks.run`` does not print itself.

    python -m benchmarks.probe phases --tokens 8192 [--trim off]   # the page's steps: peak and seconds per phase
    python -m benchmarks.probe profile --tokens 512                # where the full analysis spends its time
    python -m benchmarks.probe attention --tokens 2048             # SDPA against α made in row blocks, one layer
    python -m benchmarks.probe copies --tokens 2048                # the one pass, kv heads held once, per head or as shipped
    python -m benchmarks.probe groups --tokens 512                 # the one pass, query sides a group or a block at a time
    python -m benchmarks.probe sinks --tokens 512                  # sink norms and cosine: head space or d_model
    python -m benchmarks.probe blocks --tokens 2048                # the one pass with taller or shorter row blocks

``phases`` runs, in this fresh process, what the heatmaps page computes for a new prompt
(:func:`benchmarks.dashboard.dashboard_steps`: the recording pass, the window heatmap, the head overview) on GSM8K text (``$CWVIZ_GSM8K``, or the shipped sample repeated) and prints,
after each phase, the peak resident size so far above the loaded model (``/proc/self/status``; Linux) and the seconds it
took. ``--trim off`` makes :func:`cwviz.core.memory.trim_heap` do nothing, to see what trimming the heap when a
layer of spilled records is read back saves and costs.

``profile`` times the recording pass and the row-block loop of the full analysis (every layer's attention and both
contribution kinds, as ``benchmarks.run``'s overhead section), and the one pass, against the plain SDPA forward, then
prints ``torch.profiler``'s tables of the loop's and the one pass's operators (self CPU time: the T² products are
``bmm`` and ``baddbmm_``; ``mm`` is the query side's product, and in the one pass also the forward's linear layers).

``attention`` asks what computing α inside the recording pass would cost (an idea to share the scores product
and its softmax between the forward and the analysis): one layer's causal attention output with the embedded
model's shapes (random queries, keys and values), by PyTorch's SDPA against α made in the analysis's row blocks
(:func:`cwviz.core.capture.causal_rows`) and multiplied by the values; medians of 30 runs, interleaved. (That idea
is now ``analyze(each_block=...)``, the one pass.)

``copies`` times the one pass (``benchmarks.run.one_pass_analysis``) as shipped, with each kv head's keys and values
held :func:`cwviz.core.measures.kv_copies` times in each block's batched products (:func:`cwviz.core.analysis.for_blocks`),
against the same pass with them held once (one batch entry a kv head, the heads of a group stacked) and once per head
(one entry a head), interleaved with the SDPA forward; medians of ``--repeats`` runs.

``groups`` times the one pass as shipped, with each group of row blocks' query side made in one product
(:func:`cwviz.core.analysis.block_groups`), against the same pass with one product a block, interleaved with the SDPA
forward; medians of ``--repeats`` runs.

``sinks`` times :func:`cwviz.analyses.sinks.sink_table` and :func:`cwviz.analyses.atlas.prompt_stats` on one analysis,
and every layer's row blocks' sink norms and cosine two ways: in each head's value space as shipped
(:func:`cwviz.analyses.sinks.sink_norms`) and through :func:`cwviz.analyses.sinks.sink_split` (the rest means and
the sink's value projected to d_model), with the largest differences between the two.

``blocks`` times the one pass with the row blocks as shipped (:data:`cwviz.core.analysis.ROW_BLOCK_CELLS` cells a
head's block, at least :data:`cwviz.core.analysis.CAUSAL_MIN_BLOCKS` blocks a causal layer) and with the other
settings of :data:`BLOCK_SETTINGS` (a height already timed is left out), then as shipped again, a control for what
the same code moves between two series of runs; interleaved with the SDPA forward, medians of ``--repeats`` runs.
Shorter blocks leave out more of the keys a causal block cannot see; taller ones make fewer, larger products.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from benchmarks.memory_probe import _status  # MiB of a /proc/self/status field


def phases(bundle, ids, trim: bool = True) -> list[tuple[str, float, float]]:
    """``(step, peak MiB above the start so far, seconds)`` for each step of
    :func:`benchmarks.dashboard.dashboard_steps` on ``ids`` (after a warm-up on 8 tokens that pages in the
    weights). ``trim=False``: :func:`cwviz.core.memory.trim_heap` does nothing meanwhile."""
    from benchmarks.dashboard import dashboard_steps
    from cwviz.core import spill

    trim_heap = spill.trim_heap
    if not trim:
        spill.trim_heap = lambda: None  # what a layer read back calls (cwviz.core.memory.trim_heap); restored below
    try:
        dashboard_steps(bundle, ids[:8])
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # peak resident size := now
        before, out, last = _status("VmRSS"), [], [time.perf_counter()]

        def mark(step):
            now = time.perf_counter()
            out.append((step, _status("VmHWM") - before, now - last[0]))
            last[0] = now

        dashboard_steps(bundle, ids, mark=mark)
        return out
    finally:
        spill.trim_heap = trim_heap


def profile(bundle, ids, rows: int = 20) -> str:
    """Seconds of the SDPA forward, the recording pass, the row-block loop and the one pass (median of three,
    interleaved), then the profiler's tables of one more run of the loop and of the one pass."""
    import statistics

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from benchmarks.run import one_pass_analysis, sdpa_forward
    from benchmarks.run import read_every_block as loop
    from cwviz import analyze

    analysis = analyze(bundle, input_ids=ids)
    loop(analysis)  # warm-up
    one_pass_analysis(bundle, ids)
    times: dict[str, list[float]] = {"SDPA forward": [], "recording pass": [], "row-block loop": [], "one pass": []}
    for _ in range(3):
        for name, fn in (
            ("SDPA forward", lambda: sdpa_forward(bundle, ids)),
            ("recording pass", lambda: analyze(bundle, input_ids=ids)),
            ("row-block loop", lambda: loop(analysis)),
            ("one pass", lambda: one_pass_analysis(bundle, ids)),
        ):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["SDPA forward"])
    lines = [f"{name}: {statistics.median(t):.3f} s ({statistics.median(t) / base:.2f} of the SDPA forward)" for name, t in times.items()]
    for name, fn in (("row-block loop", lambda: loop(analysis)), ("one pass", lambda: one_pass_analysis(bundle, ids))):
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
            fn()
        lines += [f"{name}, by operator:", prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)]
    return "\n".join(lines)


def attention(info, tokens: int, repeats: int = 30) -> str:
    """Seconds of one layer's causal attention output: SDPA against α in row blocks times the values."""
    import statistics

    import torch

    from cwviz.core.analysis import CAUSAL_BLOCK_ROWS, CAUSAL_MIN_BLOCKS
    from cwviz.core.capture import causal_rows
    from cwviz.core.measures import grouped_matmul

    g = torch.Generator().manual_seed(0)
    heads, kv_heads, d = info.heads, info.kv_heads, info.d_head
    q = torch.randn(heads, tokens, d, generator=g)
    k, v = torch.randn(kv_heads, tokens, d, generator=g), torch.randn(kv_heads, tokens, d, generator=g)
    rows = max(CAUSAL_BLOCK_ROWS, -(-tokens // CAUSAL_MIN_BLOCKS))

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)

    def blocks():
        out = torch.empty(heads, tokens, d)
        for start in range(0, tokens, rows):
            stop = min(tokens, start + rows)
            alpha = causal_rows(q[:, start:stop], k[:, :stop], d**-0.5, start)
            out[:, start:stop] = grouped_matmul(alpha, v[:, :stop])
        return out

    with torch.inference_mode():
        torch.testing.assert_close(blocks(), sdpa()[0], rtol=1e-4, atol=1e-5)  # the same output
        times: dict[str, list[float]] = {"SDPA": [], "row blocks": []}
        for _ in range(repeats):
            for name, fn in (("SDPA", sdpa), ("row blocks", blocks)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    sdpa_s, blocks_s = statistics.median(times["SDPA"]), statistics.median(times["row blocks"])
    return f"{tokens} tokens, one layer: SDPA {sdpa_s * 1e3:.1f} ms; α in row blocks x values {blocks_s * 1e3:.1f} ms ({blocks_s / sdpa_s:.2f}x)"


def one_pass_with(bundle, ids, name: str, replacement):
    """A run of the one pass (``benchmarks.run.one_pass_analysis``) with ``cwviz.core.analysis.<name>``, which the
    pass's attend calls for each layer, replaced by ``replacement``; put back after the run."""
    from benchmarks.run import one_pass_analysis
    from cwviz.core import analysis as core_analysis

    def run():
        shipped = getattr(core_analysis, name)
        setattr(core_analysis, name, replacement)
        try:
            one_pass_analysis(bundle, ids)
        finally:
            setattr(core_analysis, name, shipped)

    return run


def against_shipped(bundle, ids, repeats: int, name: str, shipped: str, alternatives: dict) -> str:
    """One line: the one pass as shipped (labelled ``shipped``) and with :func:`one_pass_with` ``name`` replaced by
    each of ``alternatives`` (label: replacement), interleaved with the SDPA forward, medians of ``repeats`` runs."""
    from benchmarks.run import interleaved, one_pass_analysis, sdpa_forward

    runs = [one_pass_with(bundle, ids, name, replacement) for replacement in alternatives.values()]
    shipped_s, base, *others = interleaved(lambda: one_pass_analysis(bundle, ids), lambda: sdpa_forward(bundle, ids), repeats, *runs)
    timed = [f"one pass {shipped} {shipped_s:.3f} s ({shipped_s / base:.2f}x)"]
    timed += [f"{label} {seconds:.3f} s ({seconds / base:.2f}x)" for label, seconds in zip(alternatives, others)]
    return f"{len(ids)} tokens: SDPA forward {base:.3f} s; " + ", ".join(timed)


def copies(bundle, ids, repeats: int = 3) -> str:
    """The one pass with each kv head held :func:`~cwviz.core.measures.kv_copies` times in its row blocks' products
    (as shipped), once, and once per head, against the SDPA forward."""
    from cwviz.core.measures import kv_copies

    heads, kv_heads = bundle.info.heads, bundle.info.kv_heads
    shipped = kv_copies(kv_heads, heads, bundle.input_device)
    return against_shipped(
        bundle,
        ids,
        repeats,
        "kv_copies",
        f"with {shipped} {'copy' if shipped == 1 else 'copies'} a kv head",
        {"once a kv head": lambda *_: 1, "once a head": lambda *_: heads // kv_heads},
    )


def sink_norms_probe(bundle, ids, repeats: int = 3) -> str:
    """Seconds of sink_table and prompt_stats, and of every row block's sink norms and cosine made both ways (head
    space as shipped, d_model through sink_split), with the largest differences between the two."""
    import torch

    from benchmarks.run import interleaved
    from cwviz import analyze
    from cwviz.analyses import atlas, sinks

    analysis = analyze(bundle, input_ids=ids)
    sink = atlas.SINK

    def every_block(split_of):
        out = []
        with torch.inference_mode():
            for layer in range(analysis.num_layers):
                (value, grams), w = sinks.head_space(analysis, layer), analysis.w_heads(layer)
                for start, stop, alpha in analysis.attention_blocks(layer):
                    out.append(split_of(layer, start, stop, alpha, value, w, grams))
        return {name: torch.cat([block[name] for block in out], dim=-1) for name in out[0]}

    def head_space(layer, start, stop, alpha, value, w, grams):
        split = sinks.sink_norms(alpha, value, grams, sink, analysis.records[layer].key_mask(start, stop))
        return {"rest_norm": split.rest_norm, "cos_sink_rest": split.cos_sink_rest, "sink_value_norm": split.sink_value_norm[:, None]}

    def d_model(layer, start, stop, alpha, value, w, grams):
        split = sinks.sink_split(analysis, layer, sink, start, stop, alpha=alpha, value=value, w=w)
        return {
            "rest_norm": split.rest_mean.norm(dim=-1),
            "cos_sink_rest": sinks._cosine(split.sink_value[:, None, :], split.rest_mean),
            "sink_value_norm": split.sink_value.norm(dim=-1)[:, None],
        }

    shipped, projected = every_block(head_space), every_block(d_model)
    differences = ", ".join(
        f"{name} {((shipped[name] - projected[name]) / projected[name].abs().clamp_min(1)).abs().nan_to_num(0).max().item():.1e}"
        for name in shipped
    )
    table_s, stats_s, head_s, model_s = interleaved(
        lambda: sinks.sink_table(analysis),
        lambda: atlas.prompt_stats(analysis),
        repeats,
        lambda: every_block(head_space),
        lambda: every_block(d_model),
    )
    return (
        f"{len(ids)} tokens: sink_table {table_s:.3f} s, atlas prompt_stats {stats_s:.3f} s; every layer's row blocks' sink norms "
        f"and cosine in head space {head_s:.3f} s, in d_model through sink_split {model_s:.3f} s; largest differences "
        f"(relative where above 1) {differences}"
    )


def groups(bundle, ids, repeats: int = 3) -> str:
    """The one pass with its row blocks' query sides made a group at a time (as shipped,
    :func:`cwviz.core.analysis.block_groups`) and a block at a time (each block a group of its own, as before),
    against the SDPA forward."""

    def one_a_group(blocks, cells):
        return ([block] for block in blocks)

    return against_shipped(bundle, ids, repeats, "block_groups", "with a query side a group", {"a block": one_a_group})


#: The row-block settings ``blocks`` compares with the shipped one: (cells a head's block holds, the fewest blocks of
#: a causal layer). A setting that gives a block as many rows as one before it, at the probe's length, is left out.
BLOCK_SETTINGS = ((1 << 17, 8), (1 << 19, 8), (1 << 20, 8), (1 << 18, 16), (1 << 18, 4), (1 << 18, 2))


def blocks(bundle, ids, repeats: int = 3, settings=BLOCK_SETTINGS) -> str:
    """The one pass with the row blocks as shipped, then as in ``settings``, then as shipped again (a control: what
    the same code moves between two series of runs), against the SDPA forward."""
    import torch

    from benchmarks.run import interleaved, one_pass_analysis, sdpa_forward
    from cwviz.core import analysis as core_analysis
    from cwviz.core.capture import LayerRecord

    shipped = (core_analysis.ROW_BLOCK_CELLS, core_analysis.CAUSAL_MIN_BLOCKS)

    def set_blocks(setting):
        core_analysis.ROW_BLOCK_CELLS, core_analysis.CAUSAL_MIN_BLOCKS = setting

    def rows(setting) -> int:
        """Rows of a causal layer's first block with ``setting`` at this length (record_blocks' own rule)."""
        empty = torch.empty(1, len(ids), 1)
        set_blocks(setting)
        try:
            first, stop, _ = next(core_analysis.record_blocks(LayerRecord(empty, empty, empty, None, 1.0, True, output=None)))
        finally:
            set_blocks(shipped)
        return stop - first

    every, seen = [shipped], {rows(shipped)}
    for setting in settings:
        if rows(setting) not in seen:
            every.append(setting)
            seen.add(rows(setting))
    every.append(shipped)

    def one_pass(setting):
        def run():
            set_blocks(setting)  # read by record_blocks while the pass runs; put back below
            try:
                one_pass_analysis(bundle, ids)
            finally:
                set_blocks(shipped)

        return run

    base, *times = interleaved(
        lambda: sdpa_forward(bundle, ids), one_pass(every[0]), repeats, *(one_pass(setting) for setting in every[1:])
    )
    lines = [f"{len(ids)} tokens: SDPA forward {base:.3f} s"]
    for index, (setting, seconds) in enumerate(zip(every, times)):
        cells, fewest = setting
        label = "shipped" if index == 0 else "shipped, again" if index == len(every) - 1 else "other"
        lines.append(
            f"one pass, {rows(setting)} rows a block (2^{cells.bit_length() - 1} cells a head's block, at least {fewest} blocks; {label}): "
            f"{seconds:.3f} s ({seconds / base:.2f}x)"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["phases", "profile", "attention", "copies", "groups", "sinks", "blocks"])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--trim", choices=["on", "off"], default="on", help="phases: trim the heap as shipped, or not")
    parser.add_argument("--repeats", type=int, default=3, help="copies, groups, sinks, blocks: runs of each, interleaved")
    args = parser.parse_args(argv)

    import transformers

    import cwviz
    from benchmarks.run import long_ids

    transformers.utils.logging.disable_progress_bar()
    bundle = cwviz.load_model("embedded", device="cpu")
    if args.what == "attention":
        print(attention(bundle.info, args.tokens))
        return 0
    ids = long_ids(bundle, args.tokens)
    if args.what == "copies":
        print(copies(bundle, ids, args.repeats))
    elif args.what == "groups":
        print(groups(bundle, ids, args.repeats))
    elif args.what == "sinks":
        print(sink_norms_probe(bundle, ids, args.repeats))
    elif args.what == "blocks":
        print(blocks(bundle, ids, args.repeats))
    elif args.what == "phases":
        for name, peak, seconds in phases(bundle, ids, trim=args.trim == "on"):
            print(f"{name}: {seconds:.1f} s; peak so far {peak:.0f} MiB above the loaded model", flush=True)
    else:
        print(profile(bundle, ids))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
