"""bert_kit.kernels.short_attention: one-tile attention for T <= 128 equals SDPA's, gradients included.

Run: .venv/bin/python -m pytest tests/kernels/test_short_attention.py -q (the kernels need CUDA and Triton)
"""

import math

import pytest
import torch

from bert_kit.config import BertConfig
from bert_kit.kernels import fused_backward, short_attention
from bert_kit.kernels.fused_backward import FusedQKVAttention
from bert_kit.kernels.short_attention import ShortAttention
from bert_kit.model import MultiHeadAttention
from tests.kernels.test_fused_backward import assert_equal_within_bf16, compiled_output_and_grads, rel

cuda = pytest.mark.skipif(not torch.cuda.is_available() or short_attention.triton_ops is None
                          or fused_backward.triton_ops is None, reason="needs CUDA and Triton")


@pytest.mark.parametrize("T, head_dim, mask_shape, p, takes", [
    (128, 64, "keys", 0.1, True), (77, 32, None, 0.0, True), (129, 64, None, 0.1, False),
    (64, 48, None, 0.1, False), (64, 256, None, 0.1, False), (64, 64, "per-query", 0.1, False),
    (64, 64, "additive", 0.1, False), (64, 64, None, 1.0, False)])
def test_applies_only_where_the_kernels_tile(monkeypatch, T, head_dim, mask_shape, p, takes):
    monkeypatch.setattr(short_attention, "triton_ops", object())  # as if Triton were here
    monkeypatch.setattr(fused_backward, "applies", lambda x, *linears: True)  # as if compiled CUDA training
    B, H = 2, 4 * head_dim
    x = torch.randn(B, T, H)
    mask = {None: None, "keys": torch.ones(B, 1, 1, T, dtype=torch.bool),
            "per-query": torch.ones(B, 1, T, T, dtype=torch.bool), "additive": torch.zeros(B, 1, 1, T)}[mask_shape]
    assert short_attention.applies(x, mask, torch.nn.Linear(H, 3 * H), head_dim, p) is takes
    monkeypatch.setattr(short_attention, "triton_ops", None)
    assert not short_attention.applies(x, mask, torch.nn.Linear(H, 3 * H), head_dim, p)


def test_plain_path_outside_compiled_cuda_training():
    torch.manual_seed(0)
    attention = MultiHeadAttention(BertConfig(hidden_size=64, num_attention_heads=2)).eval()
    x = torch.randn(2, 5, 64)
    plain = attention(x)
    attention.__class__ = ShortAttention
    assert not short_attention.applies(x, None, attention.qkv, attention.head_dim, 0.1)
    torch.testing.assert_close(attention(x), plain, rtol=0, atol=0)


def reference(qkv, mask, keep, B, T, nh, p, do):
    """float64 attention over (B * T, 3H) and its gradient with respect to qkv."""
    H = qkv.shape[1] // 3
    x = qkv.double().detach().requires_grad_()
    q, k, v = x.view(B, T, 3, nh, H // nh).permute(2, 0, 3, 1, 4)
    s = q @ k.transpose(-1, -2) / math.sqrt(H // nh)
    if mask is not None:
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    probs = s.softmax(-1)
    if p > 0:
        probs = probs * keep.view(B, nh, T, T).double() / (1 - p)
    o = (probs @ v).transpose(1, 2).reshape(B * T, H)
    o.backward(do.double())
    return o, x.grad


@cuda
@pytest.mark.parametrize("B, T, nh, hd, p, masked", [
    (8, 128, 12, 64, 0.0, False), (8, 128, 12, 64, 0.1, True), (5, 77, 4, 32, 0.1, True), (3, 16, 2, 16, 0.1, False),
    (4, 128, 6, 128, 0.0, True)])
def test_kernels_match_float64(B, T, nh, hd, p, masked):
    ops = short_attention.triton_ops
    g = torch.Generator(device="cuda").manual_seed(T + hd)
    H = nh * hd
    qkv = torch.randn(B * T, 3 * H, device="cuda", generator=g).bfloat16()
    do = torch.randn(B * T, H, device="cuda", generator=g).bfloat16()
    mask = None
    if masked:  # every sequence keeps at least half of its tokens
        lengths = torch.randint(T // 2, T + 1, (B,), device="cuda", generator=g)
        mask = torch.arange(T, device="cuda")[None] < lengths[:, None]
        qkv[:, H:] *= 1 + 29 * ~mask.view(B * T, 1)  # masked keys' k and v, large, change nothing
    seed = torch.tensor([2**61 + 7], device="cuda")
    o, lse, keep = ops.attention_fwd(qkv, mask, seed, B, T, nh, p)
    dqkv, partial = ops.attention_bwd(qkv, mask, keep, do, lse, B, T, nh, p)
    if p > 0:
        assert abs(keep.float().mean().item() - (1 - p)) < 0.01
    o_ref, grad_ref = reference(qkv, mask, keep, B, T, nh, p, do)
    assert rel(o, o_ref) < 5e-3 and rel(dqkv, grad_ref) < 5e-3
    assert partial.shape == (B, 3 * H) and rel(partial.sum(0), grad_ref.sum(0)) < 5e-3


@cuda
@pytest.mark.parametrize("masked", [False, True])
def test_compiled_training_takes_the_kernels_with_sdpas_gradients(monkeypatch, masked):
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=128, num_attention_heads=2, attention_probs_dropout_prob=0.0)
    module = MultiHeadAttention(cfg).cuda()
    B, T = 4, 96
    x = torch.randn(B, T, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # a 16-bit stream
    dy = torch.randn(B, T, 128, device="cuda")
    mask = (torch.arange(T, device="cuda")[None] < torch.tensor([96, 50, 70, 1], device="cuda")[:, None]
            )[:, None, None, :] if masked else None
    calls = []
    fn = short_attention.self_attention
    monkeypatch.setattr(short_attention, "self_attention", lambda *a: calls.append(1) or fn(*a))

    module.__class__ = FusedQKVAttention  # SDPA's attention (`fast_path.apply(..., short_attention=False)`)
    plain = compiled_output_and_grads(module, x, dy, mask)
    assert not calls
    module.__class__ = ShortAttention
    fast = compiled_output_and_grads(module, x, dy, mask)
    assert calls
    assert_equal_within_bf16(fast, plain)
