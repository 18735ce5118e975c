"""The residual recorder's hooks and the attention seam share one per-context mechanism: what one thread registers
reads that thread's passes only, however many threads run the shared model, and nothing is left on the model."""

from __future__ import annotations

import threading

import pytest
import torch

from cwviz.core.method import residual
from cwviz.core.method.capture import forward_pass
from cwviz.core.method.hooks import Hook, context_hooks
from tests.helpers import make_tiny, no_hooks

IDS = [3, 17, 5, 42, 9, 11]


def _in_thread(work) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as err:  # surfaced below
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not errors, errors


def test_a_threads_hooks_and_pass_read_only_its_own_passes():
    bundle = make_tiny("llama")
    ids = torch.tensor([IDS])
    layer = bundle.attention_modules[0]
    seen: list[str] = []

    def other_pass() -> None:
        with torch.inference_mode():
            bundle.model(input_ids=ids)

    with (
        context_hooks([Hook(layer, "output", lambda _: seen.append("hook"))]),
        forward_pass(bundle.attention_modules) as records,
    ):
        _in_thread(other_pass)  # another thread's pass of the same model, while both are registered
        assert seen == [] and len(records) == 0
        other_pass()
        assert seen == ["hook"] and len(records) == bundle.info.layers
    assert no_hooks(bundle.model)


def test_the_recorder_records_only_the_pass_of_its_thread():
    bundle = make_tiny("llama")
    with residual.stream_hooks(bundle, 4) as finish:
        _in_thread(lambda: bundle.final_hidden(torch.tensor([IDS])).detach())
        with pytest.raises(RuntimeError, match="saw 0 of 2 layers"):
            finish(torch.zeros(len(IDS), bundle.info.d_model))
        with torch.inference_mode():
            hidden = bundle.final_hidden(torch.tensor([IDS]))[0]
        stream = finish(hidden)
    assert no_hooks(bundle.model)
    assert len(stream.layers) == 2 and stream.layout == "pre_norm"
    expected = residual.record_stream(bundle, IDS, 4)
    for mine, theirs in zip(stream.layers, expected.layers, strict=True):
        assert torch.equal(mine.direction, theirs.direction) and torch.equal(mine.mlp, theirs.mlp)


def test_hooks_are_removed_when_the_pass_raises():
    bundle = make_tiny("llama")

    def fail(_) -> None:
        raise KeyError("a hook that fails")

    with pytest.raises(KeyError), context_hooks([Hook(bundle.attention_modules[1], "output", fail)]):
        with torch.inference_mode():
            bundle.model(input_ids=torch.tensor([IDS]))
    assert no_hooks(bundle.model)
