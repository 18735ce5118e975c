"""Device paths that need no GPU: the GPU check script at smoke size, and a model split by a device map."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import cwviz
from benchmarks import gpu_check
from tests.conftest import TEXT, make_tiny


def test_gpu_check_smoke_passes_its_identities(capsys):
    assert gpu_check.main(["--smoke"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["dtype"] for r in results} == {"torch.bfloat16", "torch.float32"}
    assert all(r["identities_ok"] for r in results)
    assert all(r["ratio"] > 0 and r["one_pass_ratio"] > 0 for r in results)
    # The long-context run checks its identities block by block; the eager baseline runs up to EAGER_MAX_TOKENS.
    long = [r for r in results if r["model"].endswith(", long")]
    assert [r["tokens"] for r in long] == list(gpu_check.SMOKE_LONG_LENGTHS)
    assert all(r["identities_ok"] and r["write_rel"] < 1e-2 and "eager_s" in r for r in long)


def test_model_split_by_an_explicit_device_map(tmp_path):
    """A model dispatched by accelerate with an explicit device map gives the same analysis.

    On this CPU-only machine the second layer is offloaded to disk, so the model goes through accelerate's
    dispatch (hf_device_map, hooks that move weights and activations between devices), the path that
    spreads a large model over several GPUs.
    """
    import transformers

    reference = make_tiny("llama")
    reference.model.save_pretrained(tmp_path)
    device_map = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, device_map=device_map, offload_folder=str(tmp_path / "offload"), attn_implementation="cwviz"
    )
    assert model.hf_device_map == device_map
    split = cwviz.bundle_from_model(model, reference.tokenizer)
    a, b = cwviz.analyze(reference, TEXT), cwviz.analyze(split, TEXT)
    for layer in range(a.num_layers):
        np.testing.assert_allclose(a.contributions(layer), b.contributions(layer), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.next_token_logprobs, b.next_token_logprobs, rtol=1e-5, atol=1e-5)


def test_auto_dtype_rules():
    from cwviz.core.loading.models import resolve_dtype

    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(cwviz.ModelLoadError, match="unknown dtype"):
        resolve_dtype("float8", torch.device("cpu"))


def test_device_selection_prefers_cuda_and_explains_a_missing_one(monkeypatch):
    """``auto`` picks CUDA where torch sees a GPU (mocked here), and bfloat16 with it; asking for CUDA
    without one is a clear error, not a crash deep in the model."""
    from cwviz.core.loading.models import resolve_device, resolve_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(cwviz.ModelLoadError, match="'cuda:2' was asked for but this machine has 2 CUDA GPU"):
        resolve_device("cuda:2")
    assert resolve_dtype("auto", resolve_device("auto")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(cwviz.ModelLoadError, match="no CUDA GPU is available"):
        resolve_device("cuda")
    with pytest.raises(cwviz.ModelLoadError, match="unknown device"):
        resolve_device("tpu:0")
