"""Shared fixtures: tiny random models of every supported architecture (no downloads), and the
embedded SmolLM2 for integration tests."""

from __future__ import annotations

import threading

import pytest
import torch
import transformers

import cwviz


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


def no_hooks(model) -> bool:
    """Nothing is registered on any module of ``model`` (cwviz never registers hooks)."""
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# -- the slow marker ---------------------------------------------------------------------------------
#: Modules that serve the app or drive the browser in every test (AppTest modules are found by name).
SLOW_MODULES = {"test_browser", "test_packaging", "test_interrupts", "test_load"}


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test that loads the embedded model, runs the app (AppTest) or drives the
    browser, so that ``make test-fast`` (``pytest -m "not slow"``) skips them without anyone having
    to remember the marker: derived from the fixtures a test uses and the module it lives in."""
    for item in items:
        module = getattr(item, "module", None)
        name = module.__name__.rsplit(".", 1)[-1] if module is not None else ""
        if any(f.startswith("embedded") for f in getattr(item, "fixturenames", ())) or name in SLOW_MODULES or hasattr(module, "AppTest"):
            item.add_marker(pytest.mark.slow)
