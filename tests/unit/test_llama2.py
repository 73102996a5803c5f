"""Llama 2: the published sizes from the shapes alone, and the model's own behaviour."""

import pytest
import torch

from helpers.models import llama2 as L


@pytest.mark.parametrize("name", ["7B", "13B", "70B"])
def test_param_count_matches_published_size(name):
    assert L.param_count(L.CONFIGS[name]) == L.PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("name", ["tiny", "7B"])
def test_built_model_has_the_counted_parameters(name):
    with torch.device("meta"):  # 7B on the meta device: shapes only, no memory
        model = L.Transformer(L.CONFIGS[name])
    assert sum(p.numel() for p in model.parameters()) == L.param_count(L.CONFIGS[name])


def test_published_ffn_widths_and_gqa():
    assert [L.CONFIGS[n].ffn_hidden for n in ("7B", "13B", "70B")] == [11008, 13824, 28672]
    assert L.CONFIGS["70B"].kv_heads == 8 and L.CONFIGS["7B"].kv_heads == 32


def test_flops_per_token_is_six_n_plus_attention():
    a = L.CONFIGS["7B"]
    n = L.param_count(a) - a.vocab_size * a.dim
    assert L.flops_per_token(a, 4096) == 6 * n + 12 * 32 * 4096 * 4096
    assert 6 * 6.60e9 < L.flops_per_token(a, 1) < 6 * 6.61e9  # output layer counts, lookup not


def test_forward_shape_and_causality():
    model = L.Transformer(L.CONFIGS["tiny"]).init_weights(seed=1)
    x = torch.randint(0, 256, (2, 12))
    y = model(x)
    assert y.shape == (2, 12, 256)
    x2 = x.clone()
    x2[:, 8:] = (x2[:, 8:] + 1) % 256  # changing later tokens must not change earlier logits
    torch.testing.assert_close(model(x2)[:, :8], y[:, :8])
    assert not torch.allclose(model(x2)[:, 8:], y[:, 8:])


def test_rotary_keeps_norms_and_encodes_relative_position():
    tables = L.rotary_tables(8, 16, 10000.0)
    q, k = torch.randn(1, 16, 1, 8), torch.randn(1, 1, 1, 8).expand(1, 16, 1, 8)
    rq = L.apply_rotary(q, tables)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    # the same q and k at positions (3, 1) and (7, 5) give the same score: only i - j matters
    qq = q[:, :1].expand(1, 16, 1, 8)
    rq, rk = L.apply_rotary(qq, tables), L.apply_rotary(k, tables)
    s31 = (rq[0, 3] * rk[0, 1]).sum()
    s75 = (rq[0, 7] * rk[0, 5]).sum()
    torch.testing.assert_close(s31, s75)


def test_gqa_equals_full_attention_with_repeated_kv_heads():
    args = L.config("tiny", n_kv_heads=2)
    gqa = L.Transformer(args).init_weights(seed=2)
    full = L.Transformer(L.config("tiny", n_kv_heads=None))
    state = gqa.state_dict()
    for i in range(args.n_layers):
        for w in ("wk", "wv"):  # repeat each kv head's rows for the 2 query heads it serves
            key = f"layers.{i}.attention.{w}.weight"
            state[key] = state[key].view(2, 1, 16, 64).expand(2, 2, 16, 64).reshape(64, 64)
    full.load_state_dict(state)
    x = torch.randint(0, 256, (2, 10))
    torch.testing.assert_close(gqa(x), full(x))


def test_bad_shapes_say_what_to_change():
    with pytest.raises(ValueError, match="multiple of n_heads"):
        L.ModelArgs(dim=100, n_heads=8)
    with pytest.raises(ValueError, match="n_kv_heads"):
        L.ModelArgs(dim=64, n_heads=4, n_kv_heads=3)
    with pytest.raises(KeyError, match="choose one of"):
        L.config("8B")
