"""Atlas (issue 16, part 2): per-prompt statistics against their definitions, pooled statistics against a
pooling by hand (means and bootstrap intervals), saving and reloading, the map, and ``cwviz atlas``."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

import cwviz
from cwviz.analyses import atlas, sinks, tables
from cwviz.analyses.schema import ATLAS_METRICS
from cwviz.charts import atlas as charts
from cwviz.cli.main import main
from tests.helpers import make_tiny

TEXTS = ["the cat sat on the mat", "a b c d e f g", "hello world, hello", "x", "one more prompt here"]


@pytest.fixture(scope="module")
def llama() -> cwviz.Bundle:
    return make_tiny("llama")


@pytest.fixture(scope="module")
def result(llama) -> atlas.Atlas:
    return atlas.run(llama, TEXTS, bootstrap=300, seed=7)


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2", "bert"])
def test_prompt_statistics_follow_their_definitions(arch, monkeypatch):
    """Each column equals its definition: the head summary's, the sinks table's cos_sink_rest (made in d_model
    space; the atlas computes it in each head's value space), negative_share by hand. GQA, GPT-2's biases,
    Mistral's sliding window (8 keys, so later queries do not see the sink), an encoder; small row blocks."""
    from cwviz.core.method import row_block_sizes

    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", 7 * 40)
    analysis = cwviz.analyze(make_tiny(arch), (TEXTS[0] + " " + TEXTS[4]) * 2)
    stats = atlas.prompt_stats(analysis)
    summary = tables.head_summary(analysis)
    for name in ("sink_attention", "sink_contribution", "divergence", "output_norm"):
        np.testing.assert_allclose(stats[name], summary[name], atol=1e-6)
    table = sinks.sink_table(analysis)
    cos = table[(table["query"] >= 1) & (table["other_keys"] > 0)].groupby(["layer", "head"])["cos_sink_rest"].mean()
    np.testing.assert_allclose(stats["cos_sink_rest"], cos.to_numpy(), atol=1e-6)
    c = analysis.contributions(1, "intra")[:, 1:]  # (head, queries 1.., key)
    by_hand = (np.clip(-c, 0, None).sum(-1) / np.abs(c).sum(-1)).mean(-1)
    np.testing.assert_allclose(stats.loc[stats["layer"] == 1, "negative_share"], by_hand, atol=1e-6)
    assert stats["negative_share"].between(0, 1).all()


def test_pooled_statistics_equal_those_pooled_by_hand(llama, result):
    per_prompt = [atlas.prompt_stats(cwviz.analyze(llama, text)) for text in TEXTS]  # prompt by prompt
    pooled = result.pooled
    assert len(pooled) == llama.info.layers * llama.info.heads and (pooled["prompts"] == len(TEXTS)).all()
    rng = np.random.default_rng(7)
    draws = rng.integers(0, len(TEXTS), size=(300, len(TEXTS)))
    for name in ATLAS_METRICS:
        values = np.stack([frame[name].to_numpy() for frame in per_prompt])  # (prompt, layer x head)
        with warnings.catch_warnings():  # a head whose value is NaN in every prompt
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(values, axis=0)
        np.testing.assert_allclose(pooled[name], mean, atol=1e-6)
        # The bootstrap by hand: prompts resampled with the same generator, the 2.5th and 97.5th percentiles.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            means = np.array([np.nanmean(values[d], axis=0) for d in draws])
            low, high = np.nanpercentile(means, [2.5, 97.5], axis=0)
        np.testing.assert_allclose(pooled[f"{name}_low"], low, atol=1e-6)
        np.testing.assert_allclose(pooled[f"{name}_high"], high, atol=1e-6)
        assert (pooled[f"{name}_low"] <= pooled[name] + 1e-9).all() and (
            pooled[name] <= pooled[f"{name}_high"] + 1e-9
        ).all()
    # The one-token prompt has no query after the first: its cos is NaN and is left out of the pooled mean.
    assert result.per_prompt.loc[result.per_prompt["prompt"] == 3, "cos_sink_rest"].isna().all()


def test_saved_results_reload_to_the_same_maps(result, tmp_path):
    folder = atlas.save(result, tmp_path / "atlas")
    again = atlas.load(folder)
    pd.testing.assert_frame_equal(again.pooled, result.pooled)
    pd.testing.assert_frame_equal(again.per_prompt, result.per_prompt)
    assert again.prompts == result.prompts and again.manifest == result.manifest
    for metric in ATLAS_METRICS:
        assert (
            charts.atlas_map(again.pooled, metric, 1, 2).to_dict()
            == charts.atlas_map(result.pooled, metric, 1, 2).to_dict()
        )
    (folder / atlas.FILES["pooled"]).unlink()
    with pytest.raises(cwviz.InputError, match="holds no atlas results"):
        atlas.load(folder)


def test_the_prompts_where_a_head_shows_the_behaviour_most_strongly(result):
    top = result.top_prompts(1, 2, "cos_sink_rest", k=3)
    assert list(top["rank"]) == [1, 2, 3] and top["value"].is_monotonic_increasing  # most anti-aligned first
    assert top["text"].tolist() == [TEXTS[p] for p in top["prompt"]]
    top = result.top_prompts(0, 1, "sink_attention", k=10)
    assert top["value"].is_monotonic_decreasing and len(top) == len(TEXTS)


def test_the_map_draws_the_pooled_table_with_its_intervals(result):
    spec = charts.atlas_map(result.pooled, "cos_sink_rest", layer=1, head=2).to_dict()
    grid = spec["layer"][0]
    assert grid["encoding"]["color"]["field"] == "cos_sink_rest" and len(spec["layer"]) == 2
    assert {t["field"] for t in grid["encoding"]["tooltip"]} >= {"cos_sink_rest_low", "cos_sink_rest_high"}
    with pytest.raises(ValueError):
        charts.atlas_map(result.pooled, "nope")


def test_the_cli_refuses_bad_arguments_with_one_line(tmp_path, capsys):
    assert main(["atlas", "--load", str(tmp_path)]) == 2
    assert "holds no atlas results" in capsys.readouterr().err
    assert main(["atlas", "--gsm8k", "--bootstrap", "0"]) == 2
    assert "--bootstrap must be a whole number of resamples from 1 to" in capsys.readouterr().err


def test_the_cli_pools_prompts_saves_and_reloads(embedded, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"text": t}) for t in ["The cat sat.", "Two plus two is four.", "Hi"]), encoding="utf-8"
    )
    out = tmp_path / "atlas"
    assert (
        main(["atlas", "--jsonl", str(prompts), "--n", "2", "--out", str(out), "--bootstrap", "50", "--top", "2"]) == 0
    )
    printed = capsys.readouterr().out
    assert "prompts: 2" in printed and "cos(ṽ_sink, m)" in printed and f"wrote {out}" in printed
    saved = atlas.load(out)
    assert len(saved.prompts) == 2 and len(saved.pooled) == embedded.info.layers * embedded.info.heads
    assert main(["atlas", "--load", str(out), "--top", "2"]) == 0
    reloaded = capsys.readouterr().out
    # the same tables
    assert printed.split("sink: the first token")[1].split("wrote")[0] == reloaded.split("sink: the first token")[1]
