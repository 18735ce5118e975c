"""Records of long prompts on disk (cwviz.core.method.spill): the same numbers as in memory, nothing left behind.

Tiny models' records are far below the default threshold, so these tests lower it to zero (every pass spills)
and compare with the same prompt analysed in memory.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

import cwviz
from cwviz.analyses import sink_interventions, tables
from cwviz.core.method import memory, spill
from tests.helpers import TEXT, CharTokenizer, family_model, make_tiny

FIELDS = ("query", "key", "value", "output")


@pytest.fixture
def always(monkeypatch, tmp_path):
    """Every pass spills, into a folder of the test's own."""
    monkeypatch.setattr(spill, "spill_bytes", lambda: 0)
    monkeypatch.setenv("CWVIZ_SPILL_DIR", str(tmp_path / "spill"))
    return tmp_path / "spill"


def _both(bundle, text, monkeypatch):
    spilled = cwviz.analyze(bundle, text)
    with monkeypatch.context() as m:
        m.setattr(spill, "spill_bytes", lambda: 1 << 60)
        whole = cwviz.analyze(bundle, text)
    assert spilled.spilled and not whole.spilled
    return spilled, whole


def _same_records(spilled, whole):
    for layer in range(whole.num_layers):
        # the recorded head outputs alone, read before the layer is (only their bytes) and after (the loaded record's)
        assert torch.equal(spilled.recorded_outputs(layer), whole.recorded_outputs(layer)), layer
        a, b = spilled.layer_record(layer), whole.layer_record(layer)
        assert torch.equal(spilled.recorded_outputs(layer), b.output), layer
        for name in FIELDS:
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), (layer, name)
        assert (a.scaling, a.causal, a.softcap) == (b.scaling, b.causal, b.softcap)
        assert (a.mask is None) == (b.mask is None) and (a.mask is None or torch.equal(a.mask, b.mask))
        assert (a.learned_sinks is None) == (b.learned_sinks is None) and (
            a.learned_sinks is None or torch.equal(a.learned_sinks, b.learned_sinks)
        )


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert"])
def test_spilled_records_give_the_numbers_of_records_in_memory(arch, always, monkeypatch):
    """Grouped-query Llama, GPT-2 with biases, a bidirectional encoder: every record bit for bit, every
    measure and table the pages show equal, and the spill file is unlinked (the folder stays empty)."""
    bundle = make_tiny(arch)
    spilled, whole = _both(bundle, TEXT * 3, monkeypatch)
    assert os.listdir(always) == []  # unlinked at creation: nothing to clean up, even after a crash
    assert spilled._layer_records.nbytes == memory.records_bytes(bundle.info, spilled.num_tokens)
    _same_records(spilled, whole)
    for layer in range(whole.num_layers):
        for kind in ("inter", "intra"):
            np.testing.assert_array_equal(spilled.contributions(layer, kind), whole.contributions(layer, kind))
        for (f1, s1, m1), (f2, s2, m2) in zip(spilled.row_blocks(layer), whole.row_blocks(layer)):
            assert (f1, s1) == (f2, s2) and torch.equal(m1.contribution("inter"), m2.contribution("inter"))
    assert tables.head_summary(spilled).equals(tables.head_summary(whole))
    query = spilled.num_tokens - 1
    for view in ("window", "binned"):
        a = tables.heatmap_cells(spilled, 1, None, "contribution_inter", "inter", query, view).frame
        b = tables.heatmap_cells(whole, 1, None, "contribution_inter", "inter", query, view).frame
        assert a.equals(b), view
    np.testing.assert_array_equal(spilled.next_token_logprobs, whole.next_token_logprobs)


@pytest.mark.parametrize("model_type", ["gpt_oss", "gemma2"])
def test_learned_sinks_soft_capping_and_windows_survive_the_disk(model_type, always, monkeypatch):
    """The metadata a layer record carries besides its tensors (learned sinks, soft-capping, each layer's own
    sliding or global mask) comes back with the layer; ``has_learned_sinks`` reads no layer to answer."""
    bundle = cwviz.bundle_from_model(family_model(model_type), CharTokenizer(100))
    spilled, whole = _both(bundle, TEXT, monkeypatch)
    _same_records(spilled, whole)
    assert spilled.has_learned_sinks == whole.has_learned_sinks == (model_type == "gpt_oss")
    for layer in range(whole.num_layers):
        np.testing.assert_array_equal(spilled.learned_sink_attention(layer), whole.learned_sink_attention(layer))
        np.testing.assert_array_equal(spilled.attention(layer), whole.attention(layer))


def test_a_bfloat16_model_spills_its_own_dtype(always, monkeypatch):
    bundle = make_tiny("llama")
    bundle.model.to(torch.bfloat16)
    spilled, whole = _both(bundle, TEXT, monkeypatch)
    assert spilled.layer_record(0).query.dtype == torch.bfloat16
    _same_records(spilled, whole)
    np.testing.assert_array_equal(spilled.contributions(1), whole.contributions(1))


def test_the_sinks_intervention_spills_its_pass_and_gives_the_same_table(always, monkeypatch):
    bundle = make_tiny("llama")
    spilled, whole = _both(bundle, TEXT * 2, monkeypatch)
    a = sink_interventions.intervene_on_sink(spilled, factor=0.0)
    with monkeypatch.context() as m:
        m.setattr(spill, "spill_bytes", lambda: 1 << 60)
        b = sink_interventions.intervene_on_sink(whole, factor=0.0)
    assert a.table.equals(b.table) and a.perplexity == b.perplexity


def test_threads_reading_different_layers_at_once_each_get_their_own(always, monkeypatch):
    """More threads than layers kept in memory, each reading its own layer over and over: each always gets
    its layer's bytes (the LRU of read layers is shared)."""
    bundle = make_tiny("llama")
    spilled, whole = _both(bundle, TEXT * 3, monkeypatch)
    errors = []

    def read(layer):
        try:
            for _ in range(20):
                assert torch.equal(spilled.layer_record(layer).key, whole.layer_record(layer).key)
        except AssertionError as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=read, args=(layer % whole.num_layers,)) for layer in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_the_records_stay_in_memory_below_the_threshold_on_another_device_or_without_room(monkeypatch, tmp_path):
    monkeypatch.setenv("CWVIZ_SPILL_DIR", str(tmp_path))
    need = 600 << 20
    assert spill.spill_for(need - (200 << 20), torch.device("cpu")) is None  # under CWVIZ_SPILL_MB's default 512
    assert spill.spill_for(need, torch.device("meta")) is None  # records on an accelerator stay there
    assert isinstance(spill.spill_for(need, torch.device("cpu")), spill.SpilledRecords)
    monkeypatch.setattr(spill.shutil, "disk_usage", lambda _: type("Usage", (), {"free": need})())
    assert spill.spill_for(need, torch.device("cpu")) is None  # needs a tenth more than the records
    monkeypatch.setenv("CWVIZ_SPILL_MB", "2000")
    assert spill.spill_bytes() == 2000 << 20
    monkeypatch.setenv("CWVIZ_SPILL_MB", "many")
    with pytest.raises(cwviz.InputError, match="CWVIZ_SPILL_MB must be a whole number"):
        spill.spill_bytes()


def test_spilling_lets_a_prompt_through_that_memory_alone_would_refuse(always, monkeypatch):
    """The memory check counts what a spilled analysis keeps in memory (the layers read back and the one being
    written, of 8 here): a prompt refused with its records in memory is analysed with them on disk."""
    bundle = cwviz.bundle_from_model(family_model("llama", num_hidden_layers=8), CharTokenizer(100))
    # an allowance for long prompts' heap: larger than a tiny model's records
    monkeypatch.setattr(memory, "HEAP_ALLOWANCE", 0)
    config, info, tokens = bundle.model.config, bundle.info, 50
    whole = memory.estimate(config, info, tokens)
    spilled = memory.estimate(config, info, tokens, spilled=True)
    assert (
        spilled["total"] < whole["total"]
        and spilled["disk"] == memory.records_bytes(info, tokens)
        and whole["disk"] == 0
    )
    have = int((spilled["total"] + whole["total"]) / 2 / memory.HEADROOM)
    monkeypatch.setenv("CWVIZ_MEMORY_BYTES", str(have))
    text = "x" * (tokens - 1)
    with monkeypatch.context() as m:
        m.setattr(spill, "spill_bytes", lambda: 1 << 60)
        with pytest.raises(cwviz.ResourceError):
            cwviz.analyze(bundle, text)
    assert cwviz.analyze(bundle, text).spilled
