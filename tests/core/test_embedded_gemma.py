"""Integration on the embedded Gemma 3 270M (gemma3_text: sliding-window layers with every sixth global, one kv
head, q/k norms): offline load from the cache, attention equal to transformers' eager attention on real text,
each layer within its own window; and a user's .gguf file (a tiny one written here) converted once into the cache."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import cwviz
from cwviz.analyses.tables import decomposition
from cwviz.core.loading import checkpoints
from tests.helpers import window, write_tiny_gguf

PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."


@pytest.fixture(scope="module")
def embedded_gemma() -> cwviz.Bundle:
    """Gemma 3 270M, loaded offline (converted once into the user cache on the first run on a machine)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        return cwviz.load_model("embedded-gemma", device="cpu")


@pytest.fixture(scope="module")
def long_analysis(embedded_gemma):
    """One analysis of real text longer than the sliding window (512 keys), so the window decides what is seen."""
    ids = embedded_gemma.tokenizer(" ".join([PROMPT] * 24))["input_ids"]
    assert len(ids) > embedded_gemma.model.config.sliding_window + 16
    return cwviz.analyze(embedded_gemma, input_ids=ids)


def _fail(*_, **__):
    raise AssertionError("a second load must be served from the safetensors cache, not converted again")


def test_embedded_gemma_loads_offline_from_the_cache(embedded_gemma, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(checkpoints, "embedded_gemma_gguf", _fail)
    monkeypatch.setattr(checkpoints, "convert_gguf", _fail)
    again = cwviz.load_model("embedded-gemma", device="cpu")
    assert again.info == embedded_gemma.info
    info = again.info
    assert (info.id, info.architecture, info.layers, info.heads, info.kv_heads, info.d_head) == (
        "google/gemma-3-270m",
        "gemma3_text",
        18,
        4,
        1,
        256,
    )
    assert info.causal and info.dtype == "float32"
    # Only the converted safetensors are kept: the assembled GGUF (250 MB) is removed after the conversion.
    assert not list(checkpoints.embedded_gemma_dir().parent.glob(".gguf-*"))


def test_attention_is_transformers_eager_attention_and_contributions_sum_to_one(embedded_gemma, long_analysis):
    """Against a separate copy of the model run with transformers' own eager attention and masks (the base model:
    no 262k-wide logits)."""
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(
        checkpoints.embedded_gemma_dir(), attn_implementation="eager", dtype=torch.float32
    )
    ids = torch.tensor([long_analysis.input_ids])
    with torch.inference_mode():
        attentions = eager.model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    assert len(attentions) == long_analysis.num_layers == 18
    for layer in (0, 5, 11, 17):  # sliding and global layers
        np.testing.assert_allclose(long_analysis.attention(layer), attentions[layer][0].numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(long_analysis.contributions(layer, "intra").sum(-1), 1, atol=1e-4)
        np.testing.assert_allclose(long_analysis.contributions(layer, "inter").sum((0, 2)), 1, atol=1e-4)
    assert np.isfinite(long_analysis.perplexity) and long_analysis.perplexity > 1


def test_sliding_layers_see_only_their_window(embedded_gemma, long_analysis):
    config, t = embedded_gemma.model.config, long_analysis.num_tokens
    types = config.layer_types
    assert types.count("full_attention") == 3 and all(types[i] == "full_attention" for i in (5, 11, 17))
    for layer in range(long_analysis.num_layers):
        size = config.sliding_window if types[layer] == "sliding_attention" else None
        visible = window(t, size)
        np.testing.assert_array_equal(long_analysis.key_mask(layer).numpy(), visible)
        assert np.all(long_analysis.attention(layer)[:, ~visible] == 0)
    # The last query of a sliding layer sees its last 512 keys; of a global layer, every key.
    assert set(decomposition(long_analysis, 0, t - 1)["key"]) == set(range(t - config.sliding_window, t))
    assert set(decomposition(long_analysis, 5, t - 1)["key"]) == set(range(t))


def test_a_user_gguf_is_converted_once_and_then_read_from_the_cache(tmp_path, monkeypatch):
    """A .gguf given by its path, as a user's file would be (:func:`write_tiny_gguf`; the real GGUFs go through the
    same :func:`cwviz.core.loading.checkpoints.convert_gguf` in the embedded models' tests). How its header is parsed
    (once, through a plain array) is pinned in tests/core/test_gguf_parse.py."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CWVIZ_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "user-model.gguf"
    write_tiny_gguf(gguf)
    first = cwviz.load_model(str(gguf), device="cpu")
    folder = checkpoints.gguf_dir(gguf)
    assert checkpoints.gguf_key(gguf) in folder.name and checkpoints.converted(folder)
    monkeypatch.setattr(checkpoints, "convert_gguf", _fail)
    again = cwviz.load_model(str(gguf), device="cpu")
    assert again.info == first.info and again.info.id == str(gguf)
    assert (again.info.architecture, again.info.layers, again.info.heads, again.info.kv_heads) == ("llama", 2, 4, 2)
    analysis = cwviz.analyze(again, "the cat sat on the mat")
    np.testing.assert_allclose(analysis.contributions(1, "intra").sum(-1), 1, atol=1e-5)


def test_the_cache_key_of_a_gguf_changes_when_the_file_does(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(40))
    key = checkpoints.gguf_key(path)
    assert checkpoints.gguf_key(path) == key
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rewritten in place
    assert checkpoints.gguf_key(path) != key
    path.write_bytes(b"GGUF" + bytes(41))
    assert checkpoints.gguf_key(path) != key


def test_processes_starting_at_once_on_an_empty_cache_convert_a_gguf_once(tmp_path, monkeypatch):
    """Two workers (two dashboards, the suite's xdist workers) asking for one GGUF at once: one converts, the other
    waits on the lock beside the cache folder and then reads what the first wrote. Threads stand in for processes:
    each opens the lock file itself, and ``flock`` belongs to the open file."""
    import threading
    import time

    monkeypatch.setenv("CWVIZ_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(40))
    calls = []

    def convert(path, target, model_id):
        calls.append(model_id)
        time.sleep(0.5)  # long enough for the second thread to arrive while the first converts
        with checkpoints.written_once(target) as tmp:
            (tmp / "config.json").write_text("{}")
            (tmp / "model.safetensors").write_bytes(b"")
        return target

    monkeypatch.setattr(checkpoints, "convert_gguf", convert)
    folders = []
    threads = [threading.Thread(target=lambda: folders.append(checkpoints.gguf_dir(gguf))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(folders) == 2 and folders[0] == folders[1]
    assert checkpoints.converted(folders[0])
