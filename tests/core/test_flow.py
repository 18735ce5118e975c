"""The signed flow across layers (docs/METHOD.md section 6): its identities on a tiny random model of every family of
the architecture table, each quantity recomputed from its definition with plain loops on T <= 8, and the three
embedded models (slow)."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import torch

import cwviz
from cwviz.core.defaults import KEPT, LAYER_KEPT
from cwviz.core.loading import architectures
from cwviz.core.method import attribution, memory, row_block_sizes
from cwviz.core.method import flow as flow_module
from cwviz.core.method.flow import flow, token_totals
from cwviz.core.method.mixing import mixing, mixing_row_blocks, replayed_stream, rollout
from cwviz.core.util.errors import InputError, ModelChangedError, SelectionError, UnsupportedModelError
from tests.helpers import DERIVED_FAMILIES, FAMILY_CONFIGS, CharTokenizer, family_model, no_hooks

FAMILIES = [family for family in FAMILY_CONFIGS if family not in DERIVED_FAMILIES]
IDS = [3, 17, 5, 42, 9, 11, 23]


def family_analysis(family: str, ids=IDS, **overrides):
    model = family_model(family, **overrides).eval()
    bundle = cwviz.bundle_from_model(model, CharTokenizer(100), model_id=f"tiny-{family}")
    return cwviz.analyze(bundle, input_ids=list(ids))


def augmented(matrix: np.ndarray) -> np.ndarray:
    """M [T, T + 1] as a square [T + 1, T + 1] map whose bias row keeps the bias (docs/METHOD.md section 6.2)."""
    tokens = matrix.shape[0]
    square = np.zeros((tokens + 1, tokens + 1), np.float64)
    square[:tokens] = matrix
    square[tokens, tokens] = 1
    return square


def test_every_row_of_the_table_has_a_block_layout():
    for arch in architectures.ARCHITECTURES.values():
        assert arch.layout in architectures.LAYOUTS
        assert (arch.mid is not None) == (arch.layout == "pre_norm"), arch.family
        assert (arch.attention_norm is not None) == (arch.layout in ("sandwich", "post_norm")), arch.family


@pytest.mark.parametrize("family", FAMILIES)
def test_mixing_and_rollout_rows_sum_to_one_on_every_family(family):
    analysis = family_analysis(family)
    for layer in range(analysis.num_layers):
        np.testing.assert_allclose(mixing(analysis, layer).sum(1), 1, atol=1e-5)
    full = rollout(analysis)
    np.testing.assert_allclose(full.sum(1), 1, atol=1e-5)
    assert no_hooks(analysis.bundle.model)


@pytest.mark.parametrize("family", FAMILIES)
def test_parts_sum_to_the_frozen_logit_difference_on_every_family(family):
    analysis = family_analysis(family)
    if not analysis.bundle.has_logits:
        result = flow(analysis)
        assert result.encoder and result.parts.empty
        assert abs(result.totals.sum() + result.bias_total - 1) < 1e-5
        return
    result = flow(analysis, foil=7)
    assert abs(result.parts["value"].sum() - result.frozen_logit_difference) < 1e-4
    assert abs(result.totals.sum() + result.bias_total - result.frozen_logit_difference) < 1e-4
    assert abs(result.norm_error) < 1e-4
    assert no_hooks(analysis.bundle.model)


@pytest.mark.parametrize("family", [f for f in FAMILIES if "final_logit_softcapping" not in FAMILY_CONFIGS[f]])
def test_frozen_norm_equal_to_the_real_one_gives_the_models_difference(family):
    """The frozen final norm is the real one at the position (RMSNorm and LayerNorm are homogeneous after
    centring), so without a soft-cap the parts sum to the model's own logit difference."""
    analysis = family_analysis(family)
    if not analysis.bundle.has_logits:
        pytest.skip("an encoder has no logits")
    result = flow(analysis, position=4, target=11, foil=60)
    assert abs(result.frozen_logit_difference - result.logit_difference) < 1e-4


def test_a_soft_capped_model_reports_the_cap_beside_the_uncapped_parts():
    analysis = family_analysis("gemma2")
    result = flow(analysis, target=11)
    cap = analysis.bundle.model.config.final_logit_softcapping
    np.testing.assert_allclose(result.logit_difference, cap * np.tanh(result.frozen_logit_difference / cap), rtol=1e-5)


# -- brute force: every entry recomputed from its definition with plain loops (T <= 8) ---------------------------


def model_states(analysis):
    """Per layer, from test-side hooks: the input x, the output projection's output (a + b_O), the post-attention
    norm's input and output where there is one, the state the MLP reads and the layer's output; and the final norm's
    input."""
    arch, model = analysis.bundle.arch, analysis.bundle.model
    layers = architectures.layer_modules(model, arch)
    states = [dict() for _ in layers]
    handles = []

    def keep(index, name, take):
        def hook(module, args, kwargs, output=None):
            states[index][name] = take(args, kwargs, output)[0].double().numpy()

        return hook

    for index, layer in enumerate(layers):
        handles.append(
            layer.register_forward_pre_hook(
                keep(index, "x", lambda a, k, o: a[0] if a else k["hidden_states"]), with_kwargs=True
            )
        )
        handles.append(
            layer.register_forward_hook(
                keep(index, "y", lambda a, k, o: o[0] if isinstance(o, tuple) else o), with_kwargs=True
            )
        )
        proj = architectures.submodule(layer, arch.out_proj)
        handles.append(proj.register_forward_hook(keep(index, "out", lambda a, k, o: o), with_kwargs=True))
        if arch.attention_norm:
            norm = architectures.submodule(layer, arch.attention_norm)
            handles.append(norm.register_forward_hook(keep(index, "norm_in", lambda a, k, o: a[0]), with_kwargs=True))
            handles.append(norm.register_forward_hook(keep(index, "norm_out", lambda a, k, o: o), with_kwargs=True))
        if arch.mid:
            mid = architectures.submodule(layer, arch.mid)
            handles.append(mid.register_forward_pre_hook(keep(index, "mid", lambda a, k, o: a[0]), with_kwargs=True))
    final = {}
    if arch.final_norm:
        norm = architectures.submodule(architectures.base_model(model), arch.final_norm)
        handles.append(norm.register_forward_pre_hook(lambda m, a: final.__setitem__("x", a[0][0].double().numpy())))
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([analysis.input_ids]))
    finally:
        for handle in handles:
            handle.remove()
    return states, final


def rms_map(weight, eps, y, plus_one=False):
    """The frozen RMSNorm of a row y (its definition), as a function of a vector."""
    gain = weight.detach().double().numpy() + (1 if plus_one else 0)
    return lambda v: gain * v / np.sqrt(np.mean(y * y) + eps)


def layer_norm_map(norm, y):
    """The frozen LayerNorm of a row y (its definition), without its bias (Cohere's has none and calls eps
    ``variance_epsilon``)."""
    gain = norm.weight.detach().double().numpy()
    eps = norm.eps if hasattr(norm, "eps") else norm.variance_epsilon
    centred = y - y.mean()
    return lambda v: gain * (v - v.mean()) / np.sqrt(np.mean(centred * centred) + eps)


def writes(analysis, layer):
    """α [H, T, T], the per-head W_O^h [H, D, dh], the values per head [H, T, dh] and b_O [D], float64 numpy."""
    alpha = analysis.attention(layer).astype(np.float64)
    w_heads = analysis.w_heads(layer).detach().double().numpy()
    value = analysis.layer_record(layer).value.double()
    value = value.repeat_interleave(analysis.num_heads // value.shape[0], 0).numpy()
    proj = analysis.bundle.out_projections[layer]
    bias = np.zeros(w_heads.shape[1]) if getattr(proj, "bias", None) is None else proj.bias.detach().double().numpy()
    return alpha, w_heads, value, bias


def definition_mixing(analysis, layer, states):
    """M of ``layer`` from its definition (docs/METHOD.md section 6.1) with plain loops over query, key and head."""
    arch, model = analysis.bundle.arch, analysis.bundle.model
    layout = architectures.layout_of(model.config, arch)
    state = states[layer]
    alpha, w_heads, value, b_o = writes(analysis, layer)
    tokens, heads = analysis.num_tokens, analysis.num_heads
    multiplier = getattr(model.config, arch.residual_multiplier, 1.0) if arch.residual_multiplier else 1.0
    norm = (
        architectures.submodule(architectures.layer_modules(model, arch)[layer], arch.attention_norm)
        if arch.attention_norm
        else None
    )
    out = np.zeros((tokens, tokens + 1))
    for i in range(tokens):
        x = state["x"][i]
        beta = np.zeros_like(x)
        if layout == "pre_norm":
            h, land, own = state["mid"][i], (lambda v: multiplier * v), x
        elif layout == "parallel":
            h, land = state["y"][i], (lambda v: multiplier * v)
            own = h - multiplier * state["out"][i]
        elif layout == "sandwich":
            y = state["norm_in"][i]
            land = rms_map(
                norm.weight,
                norm.eps if hasattr(norm, "eps") else norm.variance_epsilon,
                y,
                plus_one=arch.family.startswith("gemma"),
            )
            h, own = x + state["norm_out"][i], x
        else:  # post_norm: BERT's LayerNorm(x + a + b_O)
            land = layer_norm_map(norm, state["norm_in"][i])
            h, own, beta = state["norm_out"][i], land(x), norm.bias.detach().double().numpy()
        norm2 = h @ h
        for j in range(tokens):
            total = np.zeros_like(h)
            for head in range(heads):
                total += land(alpha[head, i, j] * (w_heads[head] @ value[head, j]))
            out[i, j] = total @ h / norm2
        out[i, i] += own @ h / norm2
        out[i, tokens] = (land(b_o) @ h + beta @ h) / norm2
    return out


@pytest.mark.parametrize("family", ["llama", "granite", "gemma2", "olmo2", "gpt_neox", "gpt2", "bert", "distilbert"])
def test_mixing_equals_the_definition_with_plain_loops(family):
    analysis = family_analysis(family, ids=IDS[:6])
    states, _ = model_states(analysis)
    for layer in range(analysis.num_layers):
        np.testing.assert_allclose(mixing(analysis, layer), definition_mixing(analysis, layer, states), atol=2e-5)


def test_rollout_is_the_product_of_the_mixings():
    analysis = family_analysis("qwen2")
    product = np.eye(analysis.num_tokens + 1)
    for layer in range(analysis.num_layers):
        product = augmented(mixing(analysis, layer)) @ product
    np.testing.assert_allclose(rollout(analysis), product[:-1], atol=1e-5)
    result = flow(analysis, position=3)
    np.testing.assert_allclose(result.rollout_row, product[3, :-1], atol=1e-5)
    assert result.rollout_cancellation == pytest.approx(np.abs(product[3]).sum(), abs=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3_text", "cohere"])
def test_parts_equal_the_definition_with_plain_loops(family):
    analysis = family_analysis(family, ids=IDS[:6])
    model, arch = analysis.bundle.model, analysis.bundle.arch
    layout = architectures.layout_of(model.config, arch)
    states, final = model_states(analysis)
    position, target, foil = 4, 11, 60
    result = flow(analysis, position=position, target=target, foil=foil, vocabulary=3)
    vocabulary = result.vocabulary_table.set_index(["layer", "head", "direction"]).sort_values("rank")
    unembed = model.get_output_embeddings().weight.detach().double().numpy()
    scale = getattr(model.config, arch.logit_scale) if arch.logit_scale else 1.0
    difference = (unembed[target] - unembed[foil]) * scale
    final_norm = architectures.submodule(architectures.base_model(model), arch.final_norm)
    x_last = final["x"][position]
    if isinstance(final_norm, torch.nn.LayerNorm) or arch.family == "cohere":
        freeze = layer_norm_map(final_norm, x_last)
    else:
        eps = getattr(final_norm, "variance_epsilon", getattr(final_norm, "eps", None))
        freeze = rms_map(final_norm.weight, eps, x_last, plus_one=arch.family.startswith("gemma"))
    assert result.other_parts.embedding == pytest.approx(freeze(states[0]["x"][position]) @ difference, abs=1e-5)
    for layer in range(analysis.num_layers):
        alpha, w_heads, value, _ = writes(analysis, layer)
        state = states[layer]
        if layout == "sandwich":
            norm = architectures.submodule(architectures.layer_modules(model, arch)[layer], arch.attention_norm)
            land = rms_map(norm.weight, norm.eps, state["norm_in"][position], plus_one=arch.family.startswith("gemma"))
            h = state["x"][position] + state["norm_out"][position]
        else:
            land = lambda v: v  # noqa: E731
            h = state["x"][position] + state["out"][position]
        for head in range(analysis.num_heads):
            for source in range(analysis.num_tokens):
                expected = (
                    freeze(land(alpha[head, position, source] * (w_heads[head] @ value[head, source]))) @ difference
                )
                assert result.attention_parts[layer, head, source] == pytest.approx(expected, abs=1e-5)
            # its vocabulary: the head's whole write at p through the frozen final norm and the output layer
            write = sum(
                alpha[head, position, source] * (w_heads[head] @ value[head, source])
                for source in range(analysis.num_tokens)
            )
            logits = unembed @ freeze(land(write))
            for direction, order in (("promoted", np.argsort(-logits)[:3]), ("suppressed", np.argsort(logits)[:3])):
                listed = vocabulary.loc[(layer, head, direction)]
                np.testing.assert_allclose(listed["logit"], logits[order], atol=1e-5)
                assert list(listed["token_id"]) == list(order)
        mlp = state["y"][position] - h  # a parallel layout's h here is x + a + b_O: the MLP adds the rest
        assert result.other_parts.mlp[layer] == pytest.approx(freeze(mlp) @ difference, abs=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gemma2"])
def test_totals_are_the_parts_routed_through_the_rollout(family):
    analysis = family_analysis(family)
    result = flow(analysis, position=5, target=11)
    layout = architectures.layout_of(analysis.bundle.model.config, analysis.bundle.arch)
    layers, tokens = analysis.num_layers, analysis.num_tokens
    # d^l from the parts table, as docs/METHOD.md section 6.3 credits them
    direct = np.zeros((layers + 1, tokens))
    parts = result.parts
    for row in parts.itertuples():
        if row.part == "attention":
            direct[row.layer, row.key] += row.value
        elif row.part == "embedding":
            direct[0, row.key] += row.value
        elif row.part == "mlp":
            direct[row.layer + (0 if layout == "parallel" else 1), row.key] += row.value
    np.testing.assert_allclose(result.direct, direct, atol=1e-6)
    below, expected = np.eye(tokens + 1), np.zeros(tokens + 1)
    for layer in range(layers + 1):
        expected += np.append(direct[layer], 0) @ below
        if layer < layers:
            below = augmented(mixing(analysis, layer)) @ below
    np.testing.assert_allclose(result.totals, expected[:-1], atol=1e-5)
    np.testing.assert_allclose(token_totals(analysis, 5, 11), result.totals, atol=1e-6)


def test_nodes_are_their_edges_plus_their_direct_parts():
    analysis = family_analysis("llama")
    result = flow(analysis, target=11, foil=60)
    edges = result.edges(1.0)
    assert result.edges_complete(1.0)
    for layer in range(analysis.num_layers):
        out_of = (
            edges[edges["layer"] == layer]
            .groupby("start")["weight"]
            .sum()
            .reindex(range(analysis.num_tokens), fill_value=0)
        )
        np.testing.assert_allclose(result.nodes[layer], out_of.to_numpy() + result.direct[layer], atol=1e-5)
    np.testing.assert_allclose(result.nodes[0], result.totals, atol=1e-6)
    table = result.node_table
    assert (
        list(table.columns) == ["layer", "position", "value", "direct"]
        and len(table) == (analysis.num_layers + 1) * analysis.num_tokens
    )


def test_pruning_keeps_the_largest_edges_up_to_the_share():
    analysis = family_analysis("llama")
    result = flow(analysis, target=11)
    for share in (0.3, 0.6, 0.9):
        edges = result.edges(share)
        for layer, kept in edges.groupby("layer"):
            weights = kept["weight"].abs().to_numpy()
            mass = result.edge_mass[layer]
            assert np.all(np.diff(weights) <= 1e-12), "largest first"
            assert weights.sum() >= share * mass * (1 - 1e-6) and weights[:-1].sum() < share * mass
    with pytest.raises(InputError):
        result.edges(0)


def test_row_blocks_change_nothing(monkeypatch):
    analysis = family_analysis("mistral", ids=list(range(3, 23)))
    whole = flow(analysis, target=11)
    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", 16)
    monkeypatch.setattr(row_block_sizes, "READ_MIN_ROWS", 1)
    cut = flow(analysis, target=11)
    np.testing.assert_allclose(cut.totals, whole.totals, atol=1e-6)
    np.testing.assert_allclose(cut.nodes, whole.nodes, atol=1e-6)
    np.testing.assert_allclose(cut.head_routed, whole.head_routed, atol=1e-6)
    np.testing.assert_allclose(cut.edge_mass, whole.edge_mass, rtol=1e-5)
    left, right = cut.edges(0.9), whole.edges(0.9)
    np.testing.assert_allclose(np.sort(left["weight"].abs()), np.sort(right["weight"].abs()), atol=1e-6)


def test_the_kept_edges_are_each_layers_largest_however_the_rows_stream(monkeypatch):
    """With a limit far under a layer's edges, kept as its row blocks stream (a cut each time the buffer doubles), the
    kept edges are exactly the layer's largest |weight| edges of all, largest first: what the graph and its share
    read."""
    analysis = family_analysis("mistral", ids=list(range(3, 23)))
    every = flow(analysis, target=11)  # 20 tokens: every edge of every layer kept
    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", 16)
    monkeypatch.setattr(row_block_sizes, "READ_MIN_ROWS", 1)
    monkeypatch.setattr(flow_module, "EDGE_LIMIT", 7)
    few = flow(analysis, target=11)
    for kept, all_kept in zip(few.kept_edges, every.kept_edges, strict=True):
        weights = kept.weights
        assert len(weights) == 7 and np.all(np.diff(np.abs(weights)) <= 0), kept.layer
        np.testing.assert_allclose(np.abs(weights), np.sort(np.abs(all_kept.weights))[::-1][:7], rtol=1e-5, atol=1e-7)
        whole = {(int(i), int(k)): w for w, i, k in zip(all_kept.weights, all_kept.queries, all_kept.keys, strict=True)}
        picked = [whole[int(i), int(k)] for i, k in zip(kept.queries, kept.keys, strict=True)]
        np.testing.assert_allclose(weights, picked, rtol=1e-5, atol=1e-7)


def test_a_layer_read_whole_is_its_row_blocks(monkeypatch):
    """``mixing_row_blocks(whole=True)`` (a kept basis's M: one row block a layer) holds what the row blocks hold,
    and 0 where a row cannot see a key (a causal or sliding-window mask)."""
    analysis = family_analysis("mistral", ids=list(range(3, 23)))
    tokens = analysis.num_tokens
    stream = replayed_stream(analysis, 13)
    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", 16)
    monkeypatch.setattr(row_block_sizes, "READ_MIN_ROWS", 1)
    for layer in range(analysis.num_layers):
        (whole,) = mixing_row_blocks(analysis, stream, layer, whole=True)
        cut = list(mixing_row_blocks(analysis, stream, layer))
        assert len(cut) > 1 and whole.mix.shape == (tokens, tokens)
        mix = torch.zeros(tokens, tokens)
        for block in cut:
            mix[block.first : block.stop, : block.mix.shape[1]] = block.mix
        torch.testing.assert_close(whole.mix, mix, rtol=1e-5, atol=1e-6)
        assert not whole.mix.triu(1).any(), "a row's later keys are 0"
        torch.testing.assert_close(whole.bias, torch.cat([b.bias for b in cut]), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(whole.heads, torch.cat([b.heads for b in cut], 1), rtol=1e-5, atol=1e-6)
        (at_p,) = [b for b in cut if b.alpha_p is not None]
        keys = at_p.alpha_p.shape[1]
        torch.testing.assert_close(whole.alpha_p[:, :keys], at_p.alpha_p, rtol=1e-5, atol=1e-6)
        assert not whole.alpha_p[:, keys:].any()


def test_edges_beyond_the_limit_say_they_are_incomplete(monkeypatch):
    monkeypatch.setattr(flow_module, "EDGE_LIMIT", 3)
    result = flow(family_analysis("llama"), target=11)
    assert not result.edges_complete(1.0)
    assert result.edges(1.0).groupby("layer").size().max() == 3


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_encoder_totals_are_the_rollout_row(family):
    analysis = family_analysis(family)
    result = flow(analysis, position=2)
    full = rollout(analysis)
    np.testing.assert_allclose(result.totals, full[2, :-1], atol=1e-5)
    np.testing.assert_allclose(result.rollout_row, full[2, :-1], atol=1e-5)
    assert np.isnan(result.logit_difference) and result.target is None
    assert flow(analysis).position == 0  # [CLS]
    with pytest.raises(InputError, match="encoder"):
        flow(analysis, target=11)


def test_selection_errors_name_the_fix():
    analysis = family_analysis("llama")
    with pytest.raises(SelectionError):
        flow(analysis, position=len(IDS))
    with pytest.raises(InputError, match="not one"):
        flow(analysis, target="ab")
    with pytest.raises(InputError, match="foil is the target"):
        flow(analysis, target=11, foil=11)
    with pytest.raises(InputError, match="vocabulary"):
        flow(analysis, target=1000)
    with pytest.raises(InputError, match="needs a target"):
        token_totals(analysis, 3, None)


def test_a_derived_row_is_refused_saying_what_to_add():
    analysis = family_analysis("phi")
    with pytest.raises(UnsupportedModelError, match="add a row"):
        flow(analysis)
    with pytest.raises(UnsupportedModelError, match="add a row"):  # the effect flow's backward, before any pass
        attribution.METHODS["effect"].compute(attribution.request(analysis))


def test_on_a_derived_row_every_registry_member_runs_or_says_why_not_before_it_is_asked():
    """The Flow page offers a member where ``available`` is None: on a derived row (no known block layout or final
    norm) the members that follow the residual stream say why not, and are refused with that reason before any pass
    (the effect flow failed inside its backward); every other member runs."""
    analysis = family_analysis("phi")
    asked = attribution.request(analysis)
    for method in attribution.METHODS.values():
        why = method.available(analysis.bundle)
        if why is None:
            assert np.isfinite(attribution.run(method, asked).scores).all(), method.name
        else:
            assert "add a row" in why, (method.name, why)
            with pytest.raises(InputError, match="add a row"):
                attribution.run(method, asked)


def test_tables_are_tidy():
    analysis = family_analysis("llama")
    result = flow(analysis, target=11, vocabulary=3)
    assert list(result.tokens.columns) == ["position", "token", "total", "rollout_row"]
    # the rollout's row, not total / Σ total
    assert (result.tokens["rollout_row"].to_numpy() == result.rollout_row).all()
    heads = result.heads
    assert list(heads.columns) == ["layer", "head", "direct", "routed", "promoted", "suppressed"]
    assert len(heads) == analysis.num_layers * analysis.num_heads and heads["promoted"].str.count(r"\|").eq(2).all()
    np.testing.assert_allclose(
        heads["direct"].sum(), result.parts.query("part == 'attention'")["value"].sum(), atol=1e-5
    )
    vocab = result.vocabulary_table
    assert len(vocab) == analysis.num_layers * analysis.num_heads * 3 * 2
    assert list(result.edges().columns) == ["layer", "start", "end", "weight"]


def test_the_vocabulary_waits_for_its_first_reader_and_is_pickled_as_its_rows():
    """The heads' vocabulary (the flow's largest product) runs when first read, once; a pickled Flow holds its rows."""
    analysis = family_analysis("llama")
    result = flow(analysis, target=11, vocabulary=3)
    calls = []
    compute = result.head_vocabulary._compute
    result.head_vocabulary._compute = lambda: calls.append(1) or compute()
    copy = pickle.loads(pickle.dumps(result))  # pickling computes it
    assert result.vocabulary == copy.vocabulary and len(calls) == 1
    pd.testing.assert_frame_equal(result.heads, copy.heads)
    assert len(calls) == 1 and copy.head_vocabulary._compute is None
    assert flow(analysis, target=11, vocabulary=0).vocabulary is None
    pending = flow(analysis, target=11, vocabulary=3)
    with torch.no_grad():
        analysis.bundle.model.get_output_embeddings().weight.mul_(2)  # the model changes before the first read
    with pytest.raises(ModelChangedError):
        _ = pending.heads


def _flows_equal(one, other):
    for name in (
        "totals",
        "rollout_row",
        "nodes",
        "direct",
        "head_direct",
        "head_routed",
        "attention_parts",
        "edge_mass",
    ):
        np.testing.assert_array_equal(getattr(one, name), getattr(other, name), err_msg=name)
    for name in ("target", "foil", "bias_total", "logit_difference", "frozen_logit_difference", "norm_error"):
        np.testing.assert_equal(getattr(one, name), getattr(other, name), err_msg=name)  # NaN = NaN (an encoder)
    pd.testing.assert_frame_equal(one.edges(1.0), other.edges(1.0))


@pytest.mark.parametrize(("family", "keep_mixing"), [("llama", True), ("llama", False), ("gpt2", True), ("bert", True)])
def test_a_kept_basis_gives_each_target_the_same_flow_without_a_forward_pass(family, keep_mixing):
    """The Flow page keeps the target-independent part (:func:`flow_basis`) per prompt and position: a flow made from it
    is the flow made from scratch, for every target and foil, and runs no forward pass of the model; with every
    layer's M kept in it (a causal model within ``MIXING_BYTES``) or made again from the records."""
    analysis = family_analysis(family)
    basis = flow_module.flow_basis(analysis, 4, vocabulary=3, keep_mixing=keep_mixing)
    assert (basis.mixing is not None) == (keep_mixing and analysis.bundle.has_logits)
    passes = []  # the first layer's calls: the stream's pass runs the base model, not the whole
    handle = architectures.layer_modules(analysis.bundle.model, analysis.bundle.arch)[0].register_forward_pre_hook(
        lambda *_: passes.append(1)
    )
    try:
        asked = [(None, None), (11, None), (11, 42)] if analysis.bundle.has_logits else [(None, None)]
        kept = [flow(analysis, 4, t, f, vocabulary=3, basis=basis) for t, f in asked]
    finally:
        handle.remove()
    assert passes == []
    for made, (t, f) in zip(kept, asked):
        _flows_equal(made, flow(analysis, 4, t, f, vocabulary=3))
    if analysis.bundle.has_logits:  # one vocabulary for every target: computed once, the same rows as from scratch
        assert all(made.head_vocabulary is basis.vocabulary for made in kept)
        assert kept[1].vocabulary == flow(analysis, 4, 11, vocabulary=3).vocabulary
        with torch.inference_mode():
            logits = analysis.bundle.model(input_ids=torch.tensor([IDS[:5]])).logits[0, -1].float()
        np.testing.assert_allclose(basis.logits, logits, atol=1e-5)  # the model's own logits at p (the page's picks)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_analysis_that_keeps_its_stream_gives_the_flow_without_a_pass(family):
    """``analyze(stream=True)`` keeps its own pass's residual stream into the flow's default position (the last token,
    an encoder's first): bit for bit the stream a replayed pass gives, so the basis into that position runs no forward
    pass and its flow is the flow made from scratch; into another position, the basis replays the pass (one)."""
    plain = family_analysis(family)
    bundle = plain.bundle
    kept = cwviz.analyze(bundle, input_ids=IDS, stream=True)
    default = len(IDS) - 1 if bundle.has_logits else 0
    assert plain.stream is None and kept.stream.position == default
    replayed = replayed_stream(plain, default)
    for mine, theirs in zip(kept.stream.layers, replayed.layers, strict=True):
        for name in ("direction", "norm2", "residual", "bias", "mlp"):
            assert torch.equal(getattr(mine, name), getattr(theirs, name)), name
    for name in ("embedding", "final", "final_output"):
        assert torch.equal(getattr(kept.stream, name), getattr(replayed, name)), name
    # What it keeps is within what the memory check adds for it.
    kept_tensors = [(part.direction, part.norm2, part.residual, part.bias) for part in kept.stream.layers]
    held = sum(t.numel() * t.element_size() for tensors in kept_tensors for t in tensors)
    config, info = bundle.model.config, bundle.info
    added = (
        memory.estimate(config, info, len(IDS), stream=True)["recorded"]
        - memory.estimate(config, info, len(IDS))["recorded"]
    )
    assert 0 < held <= added
    passes = []  # the first layer's calls: a pass through the base model (the stream's) or the whole model
    handle = architectures.layer_modules(bundle.model, bundle.arch)[0].register_forward_pre_hook(
        lambda *_: passes.append(1)
    )
    try:
        basis = flow_module.flow_basis(kept, default)
        assert passes == [] and basis.stream is kept.stream
        made = flow(kept, default, basis=basis)
        flow_module.flow_basis(kept, 2)
        assert passes == [1]
    finally:
        handle.remove()
    _flows_equal(made, flow(plain, default))
    assert no_hooks(bundle.model)


def test_a_basis_of_another_analysis_position_or_vocabulary_is_refused():
    analysis = family_analysis("llama")
    basis = flow_module.flow_basis(analysis, 4)
    for other in (dict(analysis=family_analysis("llama"), position=4), dict(analysis=analysis, position=5)):
        with pytest.raises(InputError, match="flow_basis"):
            flow(other["analysis"], other["position"], 11, basis=basis)
    with pytest.raises(InputError, match="vocabulary=2"):
        flow(analysis, 4, 11, vocabulary=2, basis=basis)


# -- the embedded models -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["embedded", "embedded-gemma", "embedded-encoder"])
def test_embedded_models_satisfy_the_identities(name):
    bundle = cwviz.load_model(name, device="cpu")
    analysis = cwviz.analyze(bundle, "The quick brown fox jumps over the lazy dog. Paris is the capital of")
    for layer in (0, analysis.num_layers - 1):
        np.testing.assert_allclose(mixing(analysis, layer).sum(1), 1, atol=1e-5)
    result = flow(analysis)
    if bundle.has_logits:
        with torch.inference_mode():
            logits = bundle.model(input_ids=torch.tensor([analysis.input_ids])).logits[0, -1].float()
        assert result.target == int(logits.argmax())  # the default target: the model's top next token
        assert result.logit_difference == pytest.approx(float(logits.max()), abs=1e-3)
        assert abs(result.parts["value"].sum() - result.frozen_logit_difference) < 1e-4
        assert abs(result.norm_error) < 1e-3
        assert abs(result.totals.sum() + result.bias_total - result.frozen_logit_difference) < 1e-3
    else:
        assert abs(result.totals.sum() + result.bias_total - 1) < 1e-5
    assert no_hooks(bundle.model)


def test_the_top_level_flow_is_the_core_s():
    """``cwviz.flow`` is the core's function; the static plot's pruning share is a share."""
    assert cwviz.flow is flow and 0 < LAYER_KEPT <= 1 and 0 < KEPT <= 1


def test_the_registrys_share_flow_from_a_kept_basis_is_the_share_flow_without_one():
    """``attribution.request(..., basis=)`` (the dashboard's kept stream): the share flow's scores and edges are those
    of a flow made from scratch (tests/app/test_flow_page.py: the page then runs no forward pass)."""
    analysis = family_analysis("llama")
    last = analysis.num_tokens - 1
    basis = flow_module.flow_basis(analysis, last)
    plain = attribution.run(attribution.METHODS["share_flow"], attribution.request(analysis, last, 11, 60))
    kept = attribution.run(attribution.METHODS["share_flow"], attribution.request(analysis, last, 11, 60, basis=basis))
    np.testing.assert_allclose(kept.scores, plain.scores, rtol=1e-5, atol=1e-6)
    for a, b in zip(kept.edges, plain.edges, strict=True):
        np.testing.assert_allclose(a.weights, b.weights, rtol=1e-5, atol=1e-6)
