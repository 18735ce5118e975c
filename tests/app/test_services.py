"""Services: caching levels, concurrent sessions, limits, generation and the JSON export."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import cwviz
from cwviz.app import services
from cwviz.core.method import memory
from cwviz.core.method.export import to_dict
from tests.helpers import TEXT, CharTokenizer, family_model, make_tiny, no_hooks, run_together


@pytest.fixture
def tiny_models(monkeypatch):
    """Serve ``tiny-<arch>`` model names from tiny random models; clear the caches around the test."""
    real = services.load_model
    built: dict[str, cwviz.Bundle] = {}

    def load(name, device="auto", dtype="auto"):
        if name.startswith("tiny-"):
            return built.setdefault(name, make_tiny(name.removeprefix("tiny-")))
        return real(name, device=device, dtype=dtype)

    monkeypatch.setattr(services, "load_model", load)
    services._bundle.clear()
    services.get_analysis.clear()
    yield built
    services._bundle.clear()
    services.get_analysis.clear()


def test_changing_layer_head_or_token_never_reruns_the_model(tiny_models, count_forward_passes):
    request = services.Request(model="tiny-llama", text=TEXT[:30])
    first = services.get_analysis(request)
    assert services.get_analysis(request) is first
    for layer in (0, 1):
        for head in (None, 0, 3):
            for query in (0, 10, 29):
                services.heatmap_cells(request, layer, head, "contribution_inter", "inter", query, "window")
                services.token_factors(request, layer, query, head, "intra")
    services.top_keys(request, 5, None, "inter", 3)
    services.head_summary(request)
    assert len(count_forward_passes) == 1
    services.get_analysis(services.Request(model="tiny-llama", text=TEXT[:31]))
    assert len(count_forward_passes) == 2


def test_bundle_is_loaded_once_per_model_device_dtype(tiny_models):
    a = services.get_bundle("tiny-llama", "cpu", "auto")
    assert services.get_bundle("tiny-llama", "cpu", "auto") is a
    assert services.get_bundle("tiny-gpt2", "cpu", "auto") is not a
    b = services.get_bundle("tiny-gpt2")  # the defaults spelled out or not: one model, loaded once
    assert services.get_bundle("tiny-gpt2", "auto", "auto") is b and services.get_bundle("tiny-gpt2", dtype="auto") is b


def test_a_model_that_fails_to_load_raises_a_message_and_is_not_cached(tmp_path):
    missing = str(tmp_path / "no-such-model")
    for _ in range(2):
        with pytest.raises(cwviz.ModelLoadError, match="does not exist"):
            services.get_analysis(services.Request(model=missing, text="hi"))


def test_prompts_over_the_dashboard_limit_get_a_message_naming_the_fix(tiny_models, monkeypatch):
    monkeypatch.setenv("CWVIZ_APP_MAX_TOKENS", "20")
    with pytest.raises(
        cwviz.InputError,
        match=r"prompt has 30 tokens; the dashboard's limit is "
        r"20.*CWVIZ_APP_MAX_TOKENS",
    ):
        services.get_analysis(services.Request(model="tiny-llama", text=TEXT[:30]))
    with pytest.raises(cwviz.InputError, match="plus 5 to generate"):
        services.get_analysis(services.Request(model="tiny-llama", text=TEXT[:18], generate=5))
    monkeypatch.setenv("CWVIZ_APP_MAX_TOKENS", "lots")
    with pytest.raises(cwviz.InputError, match="whole number"):
        services.app_max_tokens()


def test_generated_tokens_are_the_greedy_continuation(tiny_models):
    request = services.Request(model="tiny-llama", text=TEXT[:12], generate=6)
    analyzed = services.get_analysis(request)
    assert analyzed.prompt_tokens == 12
    ids = analyzed.analysis.input_ids
    assert len(ids) == 18
    bundle = tiny_models["tiny-llama"]
    with torch.inference_mode():
        logits = bundle.model(input_ids=torch.tensor([ids])).logits[0]
    # each generated token is the argmax after everything before it
    assert ids[12:] == logits[11:-1].argmax(-1).tolist()


def test_encoders_cannot_generate(tiny_models):
    with pytest.raises(cwviz.InputError, match="cannot generate"):
        services.get_analysis(services.Request(model="tiny-bert", text="abc", generate=2))


def test_json_export_is_the_cli_schema(tiny_models):
    request = services.Request(model="tiny-llama", text=TEXT[:10])
    data = json.loads(services.analysis_json(request, None))
    assert data == json.loads(json.dumps(to_dict(services.get_analysis(request).analysis)))
    one = json.loads(services.analysis_json(request, (1,)))
    assert [layer["layer"] for layer in one["layers"]] == [1]
    assert services.json_export_size(services.get_analysis(request).analysis) > 0


def test_concurrent_sessions_get_their_own_numbers(embedded):
    """Two sessions analysing different prompts at the same moment on the one shared model."""
    services.get_analysis.clear()
    texts = [
        "The cat sat on the warm mat by the door.",
        "Seven ships sailed north across the grey and stormy sea today.",
    ]
    expected = {t: cwviz.analyze(embedded, t).contributions(20, "inter") for t in texts}
    services._bundle.clear()
    bundle = services.get_bundle("embedded", "cpu", "auto")

    def session(job: tuple[int, str]):
        i, text = job
        analysis = (
            cwviz.analyze(bundle, text)
            if i % 2
            else services.get_analysis(services.Request("embedded", "cpu", "auto", text)).analysis
        )
        return analysis.contributions(20, "inter")

    results, errors = run_together(session, [(i, t) for i in range(2) for t in texts])
    assert not errors
    for (_, text), got in results.items():
        np.testing.assert_allclose(got, expected[text], atol=1e-5)
    assert no_hooks(bundle.model)  # the per-thread attention seam leaves nothing on the shared model


def test_the_dashboard_keeps_a_short_prompts_residual_stream_for_the_flow(tiny_models, monkeypatch):
    """The dashboard's analysis keeps its pass's residual stream (the Flow page's basis then runs no pass) when it fits
    ``STREAM_BYTES``, and not for a longer prompt, nor for a model whose block the flow does not know (a derived row:
    its analysis must not fail for the Flow page's sake)."""
    request = services.Request(model="tiny-llama", text=TEXT)
    kept = services.get_analysis(request).analysis
    assert kept.stream is not None and kept.stream.position == kept.num_tokens - 1
    info = kept.bundle.info
    monkeypatch.setattr(services, "STREAM_BYTES", memory.stream_bytes(info, kept.num_tokens - 1))
    assert not services.keeps_stream(kept.bundle, kept.num_tokens) and services.keeps_stream(
        kept.bundle, kept.num_tokens - 1
    )
    services.get_analysis.clear()
    assert services.get_analysis(request).analysis.stream is None
    model = family_model("phi").eval()
    derived = cwviz.bundle_from_model(model, CharTokenizer(100), model_id="tiny-phi")
    assert derived.arch.derived and not services.keeps_stream(derived, 2)
