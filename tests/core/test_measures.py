"""docs/METHOD.md identities on tensors: the cheap computation against brute force and hand-made cases."""

from __future__ import annotations

import math

import pytest
import torch

from cwviz.core.method.attention import attention_probabilities
from cwviz.core.method.measures import LAYER_AGGREGATION, MEASURES, expand_kv, head_weights, layer_measures


def random_layer(heads=3, kv_heads=3, tokens=7, d_head=5, d_model=11, seed=0, causal=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, tokens, d_head, generator=g)
    k = torch.randn(kv_heads, tokens, d_head, generator=g)
    v = torch.randn(kv_heads, tokens, d_head, generator=g) + 0.3
    w_o = torch.randn(d_model, heads * d_head, generator=g)
    alpha = attention_probabilities(q, k, d_head**-0.5, None, causal)
    return alpha, expand_kv(v, heads), head_weights(w_o, heads)


def brute_force(alpha, v, w):
    """Materialise every projected value ṽ_j^h = W_O^h v_j^h and compute the measures directly."""
    v_tilde = torch.einsum("hmd,hkd->hkm", w, v)  # (H, K, D)
    per_pair = alpha[..., None] * v_tilde[:, None]  # (H, Q, K, D): fine at tiny sizes
    head_out = per_pair.sum(2)  # (H, Q, D)
    out = head_out.sum(0)  # (Q, D)
    intra = (per_pair * head_out[:, :, None]).sum(-1) / (head_out.norm(dim=-1) ** 2)[..., None]
    inter = (per_pair * out[None, :, None]).sum(-1) / (out.norm(dim=-1) ** 2)[None, :, None]
    cos_inter = torch.einsum("hkm,qm->hqk", v_tilde, out) / (
        v_tilde.norm(dim=-1)[:, None] * out.norm(dim=-1)[None, :, None]
    )
    return dict(
        v_norm=v_tilde.norm(dim=-1),
        head_norm=head_out.norm(dim=-1),
        out_norm=out.norm(dim=-1),
        intra=intra,
        inter=inter,
        cos_inter=cos_inter,
    )


@pytest.mark.parametrize("heads,kv_heads,causal", [(3, 3, True), (4, 2, True), (4, 1, False)])
def test_cheap_computation_equals_brute_force(heads, kv_heads, causal):
    alpha, v, w = random_layer(heads=heads, kv_heads=kv_heads, causal=causal, seed=heads + kv_heads)
    m = layer_measures(alpha, v, w)
    ref = brute_force(alpha, v, w)
    torch.testing.assert_close(m.value_norm, ref["v_norm"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.head_output_norm, ref["head_norm"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.output_norm, ref["out_norm"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.contribution("intra"), ref["intra"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.contribution("inter"), ref["inter"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.cosine("inter"), ref["cos_inter"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_contributions_sum_to_one(seed):
    alpha, v, w = random_layer(heads=4, kv_heads=2, tokens=9, seed=seed)
    m = layer_measures(alpha, v, w)
    ones = torch.ones(4, 9)
    torch.testing.assert_close(m.contribution("intra").sum(-1), ones, rtol=0, atol=1e-5)  # each head, each query
    torch.testing.assert_close(m.contribution("inter").sum((0, 2)), ones[0], rtol=0, atol=1e-5)  # over heads and keys
    torch.testing.assert_close(m.layer_level("contribution_inter").sum(-1), ones[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(m.layer_level("contribution_intra").sum(-1), ones[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(m.layer_level("raw").sum(-1), ones[0], rtol=0, atol=1e-5)


def test_factorisation_attention_times_norm_ratio_times_cosine():
    alpha, v, w = random_layer(heads=2, kv_heads=1, seed=3)
    m = layer_measures(alpha, v, w)
    for kind in ("intra", "inter"):
        product = m.attention * m.norm_ratio(kind) * m.cosine(kind)
        torch.testing.assert_close(product, m.contribution(kind), rtol=1e-4, atol=1e-6)


def test_hand_computed_destructive_interference():
    # One head, identity W_O (d_model = d_head = 2), query 1 sees key 0 and key 1 with α = (0.25, 0.75).
    # ṽ_0 = (-1, 0) points against ṽ_1 = (2, 0): o_1 = 0.25*(-1,0) + 0.75*(2,0) = (1.25, 0).
    alpha = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])
    v = torch.tensor([[[-1.0, 0.0], [2.0, 0.0]]])
    w = torch.eye(2)[None]
    m = layer_measures(alpha, v, w)
    c = m.contribution("intra")[0, 1]
    # c_10 = <o, α ṽ_0>/|o|^2 = (1.25 * -0.25) / 1.5625 = -0.2 ; c_11 = (1.25 * 1.5) / 1.5625 = 1.2
    torch.testing.assert_close(c, torch.tensor([-0.2, 1.2]))
    assert m.cosine("intra")[0, 1, 0].item() == pytest.approx(-1.0)
    assert m.norm_ratio("intra")[0, 1, 1].item() == pytest.approx(2 / 1.25)


def test_layer_level_aggregation_follows_method():
    alpha, v, w = random_layer(heads=3, kv_heads=3, seed=7)
    m = layer_measures(alpha, v, w)
    assert set(LAYER_AGGREGATION) == set(MEASURES)
    torch.testing.assert_close(m.layer_level("raw"), m.attention.mean(0))
    torch.testing.assert_close(m.layer_level("value_weighted"), m.value_weighted().sum(0))
    torch.testing.assert_close(m.layer_level("contribution_inter"), m.contribution("inter").sum(0))
    torch.testing.assert_close(m.layer_level("contribution_intra"), m.contribution("intra").mean(0))
    vw_on = m.layer_level("value_weighted_output_normalized")
    torch.testing.assert_close(vw_on, m.value_weighted().sum(0) / m.output_norm[:, None])


def test_attention_probabilities_respects_masks():
    q = torch.randn(2, 4, 3)
    k = torch.randn(2, 4, 3)
    causal = attention_probabilities(q, k, 1.0, None, causal=True)
    assert torch.all(causal.triu(1) == 0)
    torch.testing.assert_close(causal.sum(-1), torch.ones(2, 4))
    window = torch.ones(4, 4, dtype=torch.bool).tril() & ~torch.ones(4, 4, dtype=torch.bool).tril(-2)
    sliding = attention_probabilities(q, k, 1.0, window, causal=True)
    assert torch.all(sliding[:, 3, :2] == 0) and torch.all(sliding[:, 3, 2:] > 0)
    additive = torch.zeros(4, 4).masked_fill(~window, -math.inf)
    torch.testing.assert_close(attention_probabilities(q, k, 1.0, additive, causal=True), sliding)
    full = attention_probabilities(q, k, 1.0, None, causal=False)
    assert torch.all(full > 0)


def test_unknown_measure_is_rejected():
    alpha, v, w = random_layer()
    with pytest.raises(ValueError, match="choose one of"):
        layer_measures(alpha, v, w).per_head("attention_rollout")


def test_grouped_values_and_cached_gram_give_the_same_measures():
    from cwviz.core.method.measures import full_gram

    g = torch.Generator().manual_seed(11)
    heads, kv_heads, tokens, d_head, d_model = 6, 2, 8, 4, 10
    q = torch.randn(heads, tokens, d_head, generator=g)
    k = torch.randn(kv_heads, tokens, d_head, generator=g)
    v = torch.randn(kv_heads, tokens, d_head, generator=g)
    w_o = torch.randn(d_model, heads * d_head, generator=g)
    alpha = attention_probabilities(q, k, 0.5, None, True)
    # The grouped attention equals the one with keys copied per head.
    torch.testing.assert_close(alpha, attention_probabilities(q, expand_kv(k, heads), 0.5, None, True))
    expanded = layer_measures(alpha, expand_kv(v, heads), head_weights(w_o, heads))
    grouped = layer_measures(alpha, v, gram=full_gram(w_o))
    for name in MEASURES:
        torch.testing.assert_close(grouped.per_head(name), expanded.per_head(name), rtol=1e-5, atol=1e-6)
    for kind in ("intra", "inter"):
        torch.testing.assert_close(grouped.cosine(kind), expanded.cosine(kind), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kinds", [("intra",), ("inter",), ("inter", "intra")])
def test_one_kind_gives_the_same_contributions(kinds, causal):
    """A reader of one contribution kind (the head overview: intra) gets the same weights as both kinds give,
    and as brute force; the kind it did not ask for is refused, not
    silently the other one; its dot products and cosines still cover both kinds."""
    from cwviz.core.method.measures import full_gram

    g = torch.Generator().manual_seed(5)
    heads, kv_heads, tokens, d_head, d_model = 6, 2, 9, 4, 10
    q, k = torch.randn(heads, tokens, d_head, generator=g), torch.randn(kv_heads, tokens, d_head, generator=g)
    v, w_o = torch.randn(kv_heads, tokens, d_head, generator=g), torch.randn(d_model, heads * d_head, generator=g)
    alpha = attention_probabilities(q, k, 0.5, None, causal)
    expected = brute_force(alpha, expand_kv(v, heads), head_weights(w_o, heads))
    both = layer_measures(alpha, v, gram=full_gram(w_o))
    some = layer_measures(alpha, v, gram=full_gram(w_o), kinds=kinds)
    assert some.kinds == kinds and some.contributions.shape[0] == len(kinds)
    for kind in kinds:
        torch.testing.assert_close(some.contribution(kind), expected[kind], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(some.contribution(kind), both.contribution(kind), rtol=1e-5, atol=1e-7)
    for kind in {"intra", "inter"} - set(kinds):
        with pytest.raises(ValueError, match="contributions only"):
            some.contribution(kind)
    torch.testing.assert_close(some.cosine("inter"), expected["cos_inter"], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="kinds must be"):
        layer_measures(alpha, v, gram=full_gram(w_o), kinds=("intra", "intra"))


@pytest.mark.parametrize("tokens", [1, 63, 64, 65, 200, 1100])
def test_causal_blocks_equal_the_dense_computation(tokens):
    """The causal fast paths (lower-triangle row blocks, 64 rows, taller past 16 blocks) give the dense
    results for lengths below, at and across block boundaries, with grouped-query heads."""
    from cwviz.core.method.measures import full_gram

    g = torch.Generator().manual_seed(tokens)
    heads, kv_heads, d_head, d_model = 6, 2, 8, 20
    q = torch.randn(heads, tokens, d_head, generator=g)
    k = torch.randn(kv_heads, tokens, d_head, generator=g)
    v = torch.randn(kv_heads, tokens, d_head, generator=g) + 0.2
    gram = full_gram(torch.randn(d_model, heads * d_head, generator=g))
    tril = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    fast = attention_probabilities(q, k, 0.3, None, causal=True)
    dense = attention_probabilities(q, k, 0.3, tril, causal=True)  # an explicit mask takes the dense path
    torch.testing.assert_close(fast, dense, rtol=1e-6, atol=1e-7)
    assert torch.all(fast.triu(1) == 0)
    blocked = layer_measures(fast, v, gram=gram, causal=True)
    reference = layer_measures(dense, v, gram=gram, causal=False)
    for kind in ("intra", "inter"):
        torch.testing.assert_close(blocked.contribution(kind), reference.contribution(kind), rtol=1e-5, atol=1e-6)
        assert torch.all(blocked.contribution(kind).triu(1) == 0)
    torch.testing.assert_close(blocked.contribution("inter").sum((0, 2)), torch.ones(tokens))


@pytest.mark.parametrize("tokens", [1, 64, 65, 1024, 1025, 4096])
def test_triangle_row_blocks_tile_every_row_once(tokens):
    from cwviz.core.method.row_block_sizes import TRIANGLE_MAX_ROW_BLOCKS, triangle_row_blocks

    blocks = triangle_row_blocks(tokens)
    assert blocks[0][0] == 0 and blocks[-1][1] == tokens
    assert all(end == next_start for (_, end), (next_start, _) in zip(blocks, blocks[1:]))
    assert all(end > start for start, end in blocks)
    assert len(blocks) <= TRIANGLE_MAX_ROW_BLOCKS


@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 2), (9, 3), (4, 1)])
@pytest.mark.parametrize("rows", [7, 8])
def test_kv_heads_held_several_times_give_the_same_products_and_measures(heads, kv_heads, rows, monkeypatch):
    """A layer read in row blocks may hold each kv head several times (cwviz.core.method.row_blocks.for_row_blocks),
    its heads' rows then cut into runs, one a copy: α, α v and every measure equal the per-head computation for every
    number of copies, whether the rows divide into the runs (even rows) or not (odd rows with 2 copies of a 3-head
    group, which fall back to one copy of each kv head)."""
    from cwviz.core.method import row_blocks
    from cwviz.core.method.attention import causal_rows
    from cwviz.core.method.capture import LayerRecord
    from cwviz.core.method.measures import full_gram, grouped_matmul

    g = torch.Generator().manual_seed(heads + rows)
    tokens, d_head, d_model, start = 13, 4, 10, 5
    q = torch.randn(heads, tokens, d_head, generator=g)
    k, v = torch.randn(kv_heads, tokens, d_head, generator=g), torch.randn(kv_heads, tokens, d_head, generator=g)
    w_o = torch.randn(d_model, heads * d_head, generator=g)
    keys = start + rows  # what the rows start..start+rows-1 of a causal layer can see
    visible = torch.arange(keys)[None, :] <= torch.arange(start, keys)[:, None]
    expected_alpha = attention_probabilities(q[:, start:keys], expand_kv(k[:, :keys], heads), 0.5, visible, False)
    expected = layer_measures(expected_alpha, expand_kv(v[:, :keys], heads), head_weights(w_o, heads))
    for copies in range(1, heads // kv_heads + 1):
        monkeypatch.setattr(row_blocks, "kv_copies", lambda *_, copies=copies: copies)
        held = row_blocks.for_row_blocks(LayerRecord(q, k[:, :keys], v[:, :keys], None, 0.5, True, output=None))
        key, value = held.key, held.value
        assert (
            held.copies == copies
            and key.shape[0] == kv_heads * copies
            and key.is_contiguous()
            and value.is_contiguous()
        )
        alpha = causal_rows(q[:, start:keys], key, 0.5, start, copies)
        torch.testing.assert_close(alpha, expected_alpha, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            grouped_matmul(alpha, value, copies), alpha @ expand_kv(v[:, :keys], heads), rtol=1e-5, atol=1e-6
        )
        got = layer_measures(alpha, value, gram=full_gram(w_o), copies=copies)
        assert got.value.shape[0] == kv_heads  # one copy of each kv head, as the measures' other readers expect
        for name in MEASURES:
            torch.testing.assert_close(got.per_head(name), expected.per_head(name), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got.cosine("inter"), expected.cosine("inter"), rtol=1e-4, atol=1e-6)


def test_kv_copies_spread_a_blocks_batch_entries_evenly_over_the_cpu_threads():
    """The copies for_row_blocks makes: the fewest that spread the batch entries (kv heads x copies) most evenly over
    the threads, never more than a kv group's heads, and none off the CPU."""
    from cwviz.core.method.measures import kv_copies

    assert kv_copies(3, 9, "cpu", threads=2) == 2  # the embedded model: 6 entries for 2 threads, not 3 or 9
    assert kv_copies(2, 4, "cpu", threads=2) == 1  # already even
    assert kv_copies(3, 3, "cpu", threads=2) == 1  # one head a kv head: nothing to cut
    assert kv_copies(1, 8, "cpu", threads=4) == 4
    assert kv_copies(3, 9, "cpu", threads=1) == 1
    assert kv_copies(3, 9, "cpu", threads=16) == 3  # as many entries as there can be
    assert kv_copies(3, 9, "meta", threads=2) == kv_copies(8, 32, "cuda", threads=2) == 1
    for kv_heads in range(1, 9):
        for groups in range(1, 9):
            for threads in range(1, 9):
                copies = kv_copies(kv_heads, kv_heads * groups, "cpu", threads=threads)
                assert 1 <= copies <= groups
                if any((kv_heads * c) % threads == 0 for c in range(1, groups + 1)):
                    assert (kv_heads * copies) % threads == 0


def test_a_kind_is_checked_alike_wherever_it_is_given():
    """One check (:func:`cwviz.core.vocabulary.check_kind`): the measures, the tables' picker and a set of kinds
    refuse a kind that is neither 'inter' nor 'intra' with the same InputError."""
    from cwviz.analyses.schema import measure_name
    from cwviz.core.method.measures import check_kinds, full_gram
    from cwviz.core.util.errors import InputError

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 3, generator=g) for _ in range(3))
    m = layer_measures(
        attention_probabilities(q, k, 0.5, None, True), v, gram=full_gram(torch.randn(4, 6, generator=g))
    )
    for refuse in (m.contribution, m.dot, m.cosine, m.norm_ratio, lambda kind: measure_name("contribution", kind)):
        with pytest.raises(InputError, match="kind must be 'inter' or 'intra', not 'both'"):
            refuse("both")
    with pytest.raises(InputError, match="kind must be 'inter' or 'intra', not 'both'"):
        check_kinds(("inter", "both"))
