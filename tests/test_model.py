from __future__ import annotations

import pytest
import torch

from seqae_core.model import ReducingAttention, ReducingAutoencoder, attention, init_scaling, length_schedule
from tests.oracles import reference_attention

VOCAB = 101


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"model.block": "paper"}, id="paper"),
        pytest.param({"model.block": "transformer"}, id="transformer"),
        pytest.param({"model.block": "transformer", "model.layers": 3}, id="transformer-3-gradual"),
        pytest.param({"model.block": "paper", "model.layers": 2, "model.reduction": "once"}, id="paper-2-once"),
        pytest.param({"model.pos_encoding": "sinusoidal"}, id="sinusoidal"),
        pytest.param({"model.pos_encoding": "none", "model.latent_fraction": 0.25}, id="no-pos-quarter"),
        pytest.param(
            {
                "model.block": "paper",
                "model.residual": True,
                "model.norm": True,
                "model.heads": 2,
                "model.w_s_init": "random",
            },
            id="paper-with-every-option",
        ),
        pytest.param({"model.block": "transformer", "model.latent_dim": 8}, id="narrow-latent-tokens"),
    ],
)
def test_shapes_and_scaling_matrices(tiny_config, overrides):
    config = tiny_config(**overrides)
    model = ReducingAutoencoder(config, VOCAB)
    t, s = config.data.input_len, config.latent_len
    tokens = torch.randint(0, VOCAB, (3, t))
    latent = model.encode(tokens)
    assert latent.shape == (3, s, config.model.latent_dim or config.model.d_model)
    assert model.decode(latent).shape == (3, t, config.model.d_model)
    assert model(tokens).shape == (3, t, VOCAB)
    # W_S of each encoder block maps n_in -> n_out tokens: (n_out, n_in); the decoder mirrors it.
    lengths = length_schedule(t, s, config.model.layers, config.model.reduction)
    enc = [tuple(b.attn.w_s.shape) for b in model.encoder]
    dec = [tuple(b.attn.w_s.shape) for b in model.decoder]
    assert enc == [(n_out, n_in) for n_in, n_out in zip(lengths, lengths[1:])]
    assert dec == [(n_in, n_out) for n_in, n_out in reversed(list(zip(lengths, lengths[1:])))]
    assert enc[-1][0] == s and dec[-1][0] == t


@pytest.mark.parametrize("norm", [False, True])
def test_paper_block_residual_adds_the_resampled_input(tiny_config, norm):
    """``model.residual``: the block's output is ``W_S X + attention(X)``, with the attention's own W_S."""
    torch.manual_seed(0)
    plain = ReducingAutoencoder(tiny_config(**{"model.block": "paper", "model.norm": norm}), VOCAB)
    with_residual = ReducingAutoencoder(
        tiny_config(**{"model.block": "paper", "model.norm": norm, "model.residual": True}), VOCAB
    )
    with_residual.load_state_dict(plain.state_dict())
    x = torch.randn(3, 16, 32)
    block, twin = plain.encoder[0], with_residual.encoder[0]
    torch.testing.assert_close(twin(x), block(x) + torch.einsum("st,btd->bsd", block.attn.w_s, x))


def test_length_schedule_shrinks_step_by_step():
    assert length_schedule(64, 16, 3, "gradual") == [64, 48, 32, 16]
    assert length_schedule(64, 16, 3, "once") == [64, 16, 16, 16]
    assert length_schedule(32, 16, 1, "gradual") == [32, 16]


def test_sdpa_matches_the_plain_formula():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 11, 8), torch.randn(2, 4, 11, 8)
    torch.testing.assert_close(attention(q, k, v), reference_attention(q, k, v))


@pytest.mark.parametrize("heads", [1, 4])
def test_reducing_attention_is_the_papers_formula(heads):
    """softmax(Q K^T / sqrt(d)) V with Q = W_S (X W_Q), computed literally, per head."""
    torch.manual_seed(0)
    n_in, n_out, d, a = 12, 5, 16, 32
    layer = ReducingAttention(n_in, n_out, d, a, heads, dropout=0.0)
    torch.nn.init.normal_(layer.w_s)  # not the interpolation start: any W_S must work
    x = torch.randn(3, n_in, d)
    q = layer.w_s @ (x @ layer.w_q.weight.T)  # (b, s, a): W_S (X W_Q), in the paper's order
    k, v = x @ layer.w_k.weight.T, x @ layer.w_v.weight.T  # (b, t, a)
    split = lambda m: m.view(3, -1, heads, a // heads).transpose(1, 2)  # noqa: E731  (b, h, n, e)
    expected = reference_attention(split(q), split(k), split(v)).transpose(1, 2).reshape(3, n_out, a)
    torch.testing.assert_close(layer(x), expected @ layer.w_o.weight.T)


def test_scaling_matrix_starts_as_interpolation():
    w = init_scaling(4, 8)  # output token i averages the inputs around position 2i + 0.5
    torch.testing.assert_close(w.sum(dim=1), torch.ones(4))
    centers = (w * torch.arange(8.0)).sum(dim=1)
    torch.testing.assert_close(centers[1:3], torch.tensor([2.5, 4.5]))  # rows away from the edges
    torch.testing.assert_close(init_scaling(6, 6), torch.eye(6))
    up = init_scaling(8, 4)  # expanding: each output interpolates its two nearest inputs
    assert ((up > 0).sum(dim=1) <= 2).all()
