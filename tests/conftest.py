"""Shared fixtures: tiny random models of every supported architecture (no downloads), and the
embedded SmolLM2 for integration tests."""

from __future__ import annotations

import os
import threading

import pytest
import torch
import transformers

import cwviz

if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("CWVIZ_TEST_SHARE_THREADS"):
    # make test-fast's workers share the cores: each takes its share of torch's threads. Two workers of two threads
    # each on two cores made the tiny models' tests (thread overhead, not arithmetic) take about twice as long. The
    # whole suite (make test) leaves torch its threads: there a worker's real model often has the cores to itself
    # while the other waits on a browser or a server, and the shared threads made a clean run slower (BENCHMARKS.md).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


class CharTokenizer:
    """A stand-in tokenizer for tiny models: one token per character, ids = code point mod vocab."""

    def __init__(self, vocab_size: int = 100):
        self.vocab_size = vocab_size

    def __call__(self, text, add_special_tokens=True, **_):
        return {"input_ids": [ord(c) % self.vocab_size for c in text]}

    def decode(self, ids, **_):
        return "".join(chr(97 + int(i) % 26) for i in ids)

    def convert_ids_to_tokens(self, i):
        return chr(97 + int(i) % 26)


def tiny_config(arch: str):
    """Small configs with the features that matter: grouped-query attention, biases, partial rotary."""
    common = dict(vocab_size=100, num_hidden_layers=2, max_position_embeddings=256)
    if arch == "llama":
        return transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, **common)
    if arch == "mistral":
        return transformers.MistralConfig(
            hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=1, sliding_window=8, **common
        )
    if arch == "qwen2":
        # Qwen2 has biases on q, k and v.
        return transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, **common)
    if arch == "qwen3":
        return transformers.Qwen3Config(
            hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=24, **common
        )
    if arch == "gpt2":
        return transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0)
    if arch == "gpt_neox":
        return transformers.GPTNeoXConfig(
            hidden_size=64, intermediate_size=96, num_attention_heads=4, rotary_pct=0.25, attention_bias=True, **common
        )
    if arch == "bert":
        return transformers.BertConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, **common)
    raise ValueError(arch)


ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox", "bert"]

#: Every row of cwviz's architecture table, and a few model types that run through a derived row, as tiny
#: configs with the feature that matters for each (AutoConfig.for_model keyword arguments; 2 layers, width 64).
_DECODER = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
_ENCODER = dict(
    hidden_size=64, intermediate_size=96, num_attention_heads=4, num_hidden_layers=2, vocab_size=100, max_position_embeddings=64
)
_MOE = dict(num_experts_per_tok=2)
FAMILY_CONFIGS: dict[str, dict] = {
    "llama": _DECODER,
    "mistral": dict(_DECODER, num_key_value_heads=1, sliding_window=8),
    "qwen2": _DECODER,  # q/k/v biases
    "qwen3": dict(_DECODER, head_dim=24),  # q/k norms, a head width that is not hidden / heads
    "olmo2": _DECODER,  # q/k norms over all heads
    "mixtral": dict(_DECODER, num_local_experts=4, sliding_window=None, **_MOE),
    "qwen2_moe": dict(_DECODER, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, **_MOE),
    "qwen3_moe": dict(_DECODER, num_experts=4, moe_intermediate_size=32, head_dim=16, **_MOE),
    "gemma": dict(_DECODER, head_dim=16),
    # soft-capping strong enough to matter, alternating sliding (4) and global layers, final logit soft-capping
    "gemma2": dict(
        _DECODER,
        head_dim=16,
        query_pre_attn_scalar=20,
        attn_logit_softcapping=1.5,
        final_logit_softcapping=2.0,
        sliding_window=4,
        initializer_range=0.3,
    ),
    "gemma3_text": dict(
        _DECODER, head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"], final_logit_softcapping=3.0
    ),
    "phi3": dict(_DECODER, partial_rotary_factor=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2),  # fused qkv_proj, partial rotary
    "granite": dict(_DECODER, attention_multiplier=0.3, logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5),
    "stablelm": dict(_DECODER, partial_rotary_factor=0.25, use_qkv_bias=True, qk_layernorm=True, use_parallel_residual=True),
    "starcoder2": dict(_DECODER, sliding_window=6, use_bias=True),
    "cohere": dict(_DECODER, logit_scale=0.5, use_qk_norm=True),
    "gpt_oss": dict(_DECODER, head_dim=16, num_local_experts=4, sliding_window=4, **_MOE),  # learned sinks
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64),
    "gpt_neox": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, rotary_pct=0.25, attention_bias=True),
    "bert": _ENCODER,
    "roberta": dict(_ENCODER, pad_token_id=1),
    "xlm-roberta": dict(_ENCODER, pad_token_id=1),
    "electra": dict(_ENCODER, embedding_size=32),
    "distilbert": dict(dim=64, hidden_dim=96, n_heads=4, n_layers=2, vocab_size=100, max_position_embeddings=64),
    "modernbert": dict(
        _ENCODER,
        global_attn_every_n_layers=2,
        local_attention=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    ),
    # no row in the table: derived at load time
    "phi": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, partial_rotary_factor=0.5),
    "opt": dict(hidden_size=64, ffn_dim=96, num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=64),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, multi_query=True),
    "persimmon": dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, partial_rotary_factor=0.5, qk_layernorm=True),
    "camembert": dict(_ENCODER, pad_token_id=1),  # an encoder (RoBERTa layout) through a derived row
}
#: Model types above that have no row of their own.
DERIVED_FAMILIES = ("phi", "opt", "gpt_bigcode", "persimmon", "camembert")


def family_model(model_type: str, seed: int = 0, **overrides):
    """A tiny random transformers model of ``model_type`` (:data:`FAMILY_CONFIGS`, with ``overrides``), float32,
    biases random."""
    from cwviz.core.loading import architectures
    from cwviz.core.loading.models import auto_class_name

    torch.manual_seed(seed)
    kwargs = dict(vocab_size=100, num_hidden_layers=2, max_position_embeddings=64)
    if model_type in ("gpt2", "gpt_bigcode", "distilbert"):
        kwargs = dict(vocab_size=100)
    config = transformers.AutoConfig.for_model(model_type, **{**kwargs, **FAMILY_CONFIGS[model_type], **overrides})
    auto = getattr(transformers, auto_class_name(config, architectures.ARCHITECTURES.get(model_type)))
    model = auto.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random biases and norm weights, so their handling is exercised
        for name, param in model.named_parameters():
            if name.endswith("bias") or "sinks" in name:
                param.normal_(0, 0.5 if "sinks" in name else 0.1)
    return model


def make_tiny(arch: str, seed: int = 0) -> cwviz.Bundle:
    torch.manual_seed(seed)
    config = tiny_config(arch)
    auto = transformers.AutoModelForMaskedLM if arch == "bert" else transformers.AutoModelForCausalLM
    model = auto.from_config(config)
    with torch.no_grad():  # random biases, so bias handling is exercised (from_config zero-initialises them)
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
    return cwviz.bundle_from_model(model, CharTokenizer(config.vocab_size), model_id=f"tiny-{arch}")


@pytest.fixture(params=ARCHS)
def tiny(request) -> cwviz.Bundle:
    """A tiny random model of each supported architecture."""
    return make_tiny(request.param)


@pytest.fixture(scope="session")
def embedded() -> cwviz.Bundle:
    """The embedded SmolLM2-135M-Instruct (converted once into the user cache)."""
    return cwviz.load_model("embedded", device="cpu")


TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps."


def run_together(work, jobs) -> tuple[dict, list]:
    """Call ``work(job)`` for every job, each in its own thread, all released at once by a barrier.

    Returns the results by job and the exceptions raised (for the caller to assert there are none).
    """
    barrier = threading.Barrier(len(jobs))
    results, errors = {}, []

    def run(job):
        try:
            barrier.wait()
            results[job] = work(job)
        except Exception as err:  # surfaced by the caller
            errors.append(err)

    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def default_signals() -> None:
    """``preexec_fn`` of a child a test interrupts: SIGINT and SIGTERM as a fresh shell gives them. A pytest started
    with SIGINT ignored (``nohup``, a background job) passes SIG_IGN on, and Python then never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def no_hooks(model) -> bool:
    """Nothing is registered on any module of ``model`` (cwviz never registers hooks)."""
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# -- the slow marker ---------------------------------------------------------------------------------
#: Modules that serve the app or drive the browser in every test (AppTest modules are found by name).
SLOW_MODULES = {"test_browser", "test_packaging", "test_interrupts", "test_load"}


#: What a test's own code names when it loads a real model, runs a page or starts a Python process (a fresh
#: interpreter imports torch and transformers: seconds before it does anything).
SLOW_WORDS = ("embedded", "AppTest", "sys.executable")


def _starts_slow_work(item) -> bool:
    import inspect

    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        return False
    return any(word in source for word in SLOW_WORDS)


#: The longest test modules, longest first. Their times beside the other worker, warm cache (2026-12-06, a timeline of
#: each worker's modules): the browser module 294 s, the 8,192-token memory test's module 185 s, the load module 60 s,
#: the sweeps 48 s, the packaging tests 32 s, embedded Gemma 26 s (about 45 s on a cold cache: its conversion). make
#: test hands whole modules to its workers in collection order (``--dist loadscope --no-loadscope-reorder``): these go
#: first, so that the last modules to start are short ones and no worker waits idle while another finishes a long one
#: (with packaging and Gemma among the last, one worker finished 22 s after the other).
LONGEST_FIRST = (
    "browser/test_browser.py",
    "core/test_long.py",
    "load/test_load.py",
    "analyses/test_sweep.py",
    "tests/test_packaging.py",
    "core/test_embedded_gemma.py",
)


def _longest_first(item) -> int:
    path = item.path.as_posix()
    return next((rank for rank, tail in enumerate(LONGEST_FIRST) if path.endswith(tail)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test that loads the embedded model, runs the app (AppTest), starts a Python process or
    drives the browser, so that ``make test-fast`` (``pytest -m "not slow"``) skips them without anyone having
    to remember the marker: derived from the fixtures a test uses, the module it lives in and the words of its own
    code (:data:`SLOW_WORDS`)."""
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        if any(f.startswith("embedded") for f in getattr(item, "fixturenames", ())) or name in SLOW_MODULES or hasattr(module, "AppTest"):
            item.add_marker(pytest.mark.slow)
        elif _starts_slow_work(item):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_longest_first)  # stable: each module keeps its own order
