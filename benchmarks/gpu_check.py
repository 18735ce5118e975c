"""GPU check, one run of about 5-8 minutes on a CUDA machine with 80 GB or more:

    python -m benchmarks.gpu_check                  # on a GPU machine
    python -m benchmarks.gpu_check --long 0         # without the long-context runs
    python -m benchmarks.gpu_check --smoke          # tiny sizes, any device (used by the tests on CPU)

For the embedded model and for a Llama-3-8B-shaped model with random weights built from a config (no
download), in bfloat16 and float32, it checks the docs/METHOD.md identities (contributions sum to 1; Σ_j α ṽ_j
equals the model's own o_proj input) and measures the overhead ratio of a full analysis (every layer's
attention and both contribution kinds, read in row blocks as the dashboard reads them) against the plain
SDPA forward pass of the base model, with the eager output_attentions=True pass beside it, at T = 2048.

Then the long contexts (``--long``, default 8192 and 32768 tokens): the Llama-8B shape in bfloat16 with
32,768 positions, the identities checked block by block (``Analysis.row_blocks``; Σ_j α ṽ_j from
``Analysis.head_outputs``: the layer's T x T maps are never held), the same ratio and the peak memory against
the SDPA forward's. It prints one JSON line per check and exits non-zero if an identity fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import transformers

import cwviz
from benchmarks.workloads import (
    EAGER_MAX_TOKENS,
    full_analysis,
    interleaved,
    one_pass_analysis,
    plain_forward,
    sdpa_forward,
)
from cwviz.core.loading.models import resolve_device

# Llama-3.1-8B's shape: 32 layers, 32 heads, 8 kv heads, d_model 4096, d_head 128.
LLAMA_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    rope_theta=500000.0,
)
LONG_LENGTHS = (8192, 32768)
SMOKE_LONG_LENGTHS = (300,)
SMOKE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)

# Tolerances of the identities by dtype: the measures are float32, but the model's own write (the
# reference) is computed in the model's dtype.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class IdTokenizer:
    """Random-weight models have no tokenizer; tokens are shown as their ids."""

    def decode(self, ids, **_):
        return " ".join(str(int(i)) for i in ids)

    def convert_ids_to_tokens(self, token_id):
        return str(int(token_id))


def random_llama(shape: dict, dtype: torch.dtype, device: torch.device) -> cwviz.Bundle:
    config = transformers.LlamaConfig(**shape)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return cwviz.bundle_from_model(
        model, IdTokenizer(), model_id="random Llama-8B shape" if shape is LLAMA_8B else "random tiny Llama"
    )


def analyze_seen(bundle: cwviz.Bundle, ids: list[int], layers: list[int]) -> tuple[cwviz.Analysis, dict]:
    """The analysis, and what the model's own output projections received in ``layers`` (float32 [T, H d])."""
    seen = {}
    handles = [
        bundle.out_projections[l].register_forward_pre_hook(lambda m, a, l=l: seen.__setitem__(l, a[0][0].float()))
        for l in layers
    ]
    try:
        return cwviz.analyze(bundle, input_ids=ids), seen
    finally:
        for h in handles:
            h.remove()


def check_identities(bundle: cwviz.Bundle, ids: list[int], layers: list[int]) -> dict:
    analysis, seen = analyze_seen(bundle, ids, layers)
    worst = {"intra_sum": 0.0, "inter_sum": 0.0, "write_rel": 0.0}
    for l in layers:
        m = analysis.layer(l)
        worst["intra_sum"] = max(worst["intra_sum"], (m.contribution("intra").sum(-1) - 1).abs().max().item())
        worst["inter_sum"] = max(worst["inter_sum"], (m.contribution("inter").sum((0, 2)) - 1).abs().max().item())
        alpha_v = analysis.attention_tensor(l) @ analysis.values(l)
        z = alpha_v.permute(1, 0, 2).reshape(len(ids), -1)
        rel = ((z - seen[l]).norm() / seen[l].norm()).item()
        worst["write_rel"] = max(worst["write_rel"], rel)
    return worst


def check_streamed(bundle: cwviz.Bundle, ids: list[int], layers: list[int]) -> dict:
    """:func:`check_identities` in row blocks: the sums of every block, and Σ_j α ṽ_j from ``head_outputs``."""
    analysis, seen = analyze_seen(bundle, ids, layers)
    worst = {"intra_sum": 0.0, "inter_sum": 0.0, "write_rel": 0.0}
    for l in layers:
        for _, _, m in analysis.row_blocks(l):
            worst["intra_sum"] = max(worst["intra_sum"], (m.contribution("intra").sum(-1) - 1).abs().max().item())
            worst["inter_sum"] = max(worst["inter_sum"], (m.contribution("inter").sum((0, 2)) - 1).abs().max().item())
        z = analysis.head_outputs(l).permute(1, 0, 2).reshape(len(ids), -1)
        worst["write_rel"] = max(worst["write_rel"], ((z - seen[l]).norm() / seen[l].norm()).item())
        del z
    return worst


def overhead(bundle: cwviz.Bundle, ids: list[int], device: torch.device, repeats: int = 3) -> dict:
    """The benchmark's full analysis (recorded then read, and in one pass) against the SDPA forward pass (and, up to
    ``EAGER_MAX_TOKENS``, the eager output_attentions one), synchronised, interleaved."""

    def synced(fn, **kwargs):
        def run():
            fn(bundle, ids, **kwargs)
            sync(device)

        return run

    others = [synced(full_analysis, logprobs=True), synced(one_pass_analysis)]
    if len(ids) <= EAGER_MAX_TOKENS:
        others.append(synced(plain_forward))
    full_s, sdpa_s, logprobs_s, one_pass_s, *eager = interleaved(
        synced(full_analysis), synced(sdpa_forward), repeats, *others
    )
    result = {
        "sdpa_s": sdpa_s,
        "full_s": full_s,
        "ratio": full_s / sdpa_s,
        "one_pass_s": one_pass_s,
        "one_pass_ratio": one_pass_s / sdpa_s,
        "with_logprobs_s": logprobs_s,
        "ratio_with_logprobs": logprobs_s / sdpa_s,
    }
    if eager:
        result.update(eager_s=eager[0], ratio_to_eager=full_s / eager[0])
    return result


def peak_memory(bundle: cwviz.Bundle, ids: list[int], device: torch.device) -> dict:
    """Peak CUDA memory above the loaded model: the SDPA forward, then the full analysis (empty elsewhere)."""
    if device.type != "cuda":
        return {}
    peaks = {}
    for name, fn in (("sdpa", sdpa_forward), ("full", full_analysis)):
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn(bundle, ids)
        sync(device)
        peaks[name] = (torch.cuda.max_memory_allocated(device) - base) / 2**30
    return {
        "sdpa_peak_gib": peaks["sdpa"],
        "full_peak_gib": peaks["full"],
        "memory_ratio": peaks["full"] / peaks["sdpa"],
    }


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def random_ids(vocab: int, tokens: int) -> list[int]:
    return torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny model and T = 150, on whatever device there is")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument(
        "--long",
        default=",".join(map(str, LONG_LENGTHS)),
        help="comma-separated long-context lengths for the Llama-8B shape; 0 for none",
    )
    args = parser.parse_args(argv)
    long_lengths = SMOKE_LONG_LENGTHS if args.smoke else tuple(int(n) for n in args.long.split(",") if int(n) > 0)
    transformers.utils.logging.disable_progress_bar()
    device = resolve_device("auto")
    tokens = 150 if args.smoke else args.tokens  # 150: more than one causal row block
    failed = False
    targets = (
        [("random tiny Llama", SMOKE)] if args.smoke else [("embedded", None), ("random Llama-8B shape", LLAMA_8B)]
    )
    for name, shape in targets:
        for dtype in (torch.bfloat16, torch.float32):
            start = time.perf_counter()
            if shape is None:
                bundle = cwviz.load_model("embedded", device=str(device), dtype=dtype)
            else:
                bundle = random_llama(shape, dtype, device)
            vocab = bundle.model.config.vocab_size
            ids = random_ids(vocab, tokens)
            layers = sorted({0, bundle.info.layers // 2, bundle.info.layers - 1})
            worst = check_identities(bundle, ids, layers)
            ok = all(v <= TOLERANCE[dtype] for v in worst.values())
            failed |= not ok
            result = {
                "model": name,
                "dtype": str(dtype),
                "device": str(device),
                "tokens": tokens,
                "identities_ok": ok,
                **worst,
            }
            result.update(overhead(bundle, ids, device, repeats=1 if args.smoke else 3))
            if device.type == "cuda":
                result["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            result["seconds"] = time.perf_counter() - start
            print(json.dumps(result), flush=True)
            del bundle
            release(device)
    if long_lengths:
        shape = dict(SMOKE if args.smoke else LLAMA_8B, max_position_embeddings=max(long_lengths))
        bundle = random_llama(shape, torch.bfloat16, device)
        layers = sorted({0, bundle.info.layers // 2, bundle.info.layers - 1})
        for tokens in long_lengths:
            start = time.perf_counter()
            ids = random_ids(bundle.model.config.vocab_size, tokens)
            worst = check_streamed(bundle, ids, layers)
            ok = all(v <= TOLERANCE[torch.bfloat16] for v in worst.values())
            failed |= not ok
            result = {
                "model": f"{bundle.info.id}, long",
                "dtype": "torch.bfloat16",
                "device": str(device),
                "tokens": tokens,
            }
            result.update(identities_ok=ok, **worst)
            release(device)
            result.update(overhead(bundle, ids, device, repeats=1))
            result.update(peak_memory(bundle, ids, device))
            result["seconds"] = time.perf_counter() - start
            print(json.dumps(result), flush=True)
            release(device)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
