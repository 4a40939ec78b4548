"""bert_kit.kernels.fused_backward: gradients written with their bias gradients equal the plain ones.

Run: .venv/bin/python -m pytest tests/kernels/test_fused_backward.py -q (the kernels need CUDA and Triton)
"""

import pytest
import torch
import torch.nn.functional as F

from bert_kit.config import BertConfig
from bert_kit.kernels import fused_backward
from bert_kit.kernels.fused_backward import FusedFeedForward, FusedQKVAttention
from bert_kit.model import FeedForward, MultiHeadAttention

cuda = pytest.mark.skipif(not torch.cuda.is_available() or fused_backward.triton_ops is None,
                          reason="needs CUDA and Triton")


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).norm() / ref.double().norm()).item()


def compiled_output_and_grads(module: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor, *args) -> list:
    """module(x, *args) compiled whole under bf16 autocast, then backward from dy: the output, x's
    gradient and every parameter's."""
    torch._dynamo.reset()
    for t in [x, *module.parameters()]:
        t.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = torch.compile(module, fullgraph=True)(x, *args)
    y.float().backward(dy)
    return [y.float(), x.grad, *(p.grad for p in module.parameters())]


def assert_equal_within_bf16(fast: list, plain: list) -> None:
    for a, b in zip(fast, plain, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert rel(a, b) < 2e-2


def test_plain_path_outside_compiled_cuda_training():
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=64, intermediate_size=128, num_attention_heads=1)
    ffn, attention = FeedForward(cfg), MultiHeadAttention(cfg).eval()  # eval: no attention dropout
    x = torch.randn(2, 5, 64)
    plain = attention(x)
    ffn.__class__, attention.__class__ = FusedFeedForward, FusedQKVAttention
    assert not fused_backward.applies(x, ffn.up, ffn.down) and not fused_backward.applies(x, attention.qkv)
    torch.testing.assert_close(ffn(x), ffn.down(F.gelu(ffn.up(x))), rtol=0, atol=0)
    torch.testing.assert_close(attention(x), plain, rtol=0, atol=0)


@cuda
@pytest.mark.parametrize("n", [1, 2049, 1_000_000])
def test_gelu_kernel_rounds_like_the_exact_gelu(n):
    ops = fused_backward.triton_ops
    g = torch.Generator(device="cuda").manual_seed(n)
    z = (3 * torch.randn(n, device="cuda", generator=g)).bfloat16()
    h, z = ops.gelu(z), z.double()
    exact = z * 0.5 * torch.special.erfc(-z / 2**0.5)  # 1 + erf(x) cancels to 0 in float64 below -6
    torch.testing.assert_close(h.double(), exact, rtol=2**-8, atol=1e-30)  # within one bf16 step
    if n > 1000:  # the rounding of the exact value nearly everywhere
        assert (h == exact.bfloat16()).double().mean() > 0.999


@cuda
@pytest.mark.parametrize("rows", [1, 513, 2000])
def test_gelu_grad_kernel_matches_float64(rows):
    ops = fused_backward.triton_ops
    g = torch.Generator(device="cuda").manual_seed(rows)
    dh, z = (torch.randn(rows, 384, device="cuda", generator=g).bfloat16() for _ in range(2))
    dz, partial = ops.gelu_grad(dh, z)
    zd = z.double().requires_grad_()
    ref = torch.autograd.grad(F.gelu(zd), zd, dh.double())[0]
    assert partial.shape == (-(-rows // ops.GELU_SETTINGS["ROWS"]), 384)
    assert rel(dz, ref) < 5e-3 and rel(partial.sum(0), ref.sum(0)) < 1e-5


@cuda
@pytest.mark.parametrize("contiguous", [False, True])
def test_qkv_grad_kernel_lays_the_three_gradients_side_by_side(contiguous):
    ops = fused_backward.triton_ops
    B, nh, T, hd = 5, 6, 150, 64
    qkv = torch.randn(B, T, 3, nh, hd, device="cuda").bfloat16()
    dq, dk, dv = qkv.permute(2, 0, 3, 1, 4)  # strided, as attention's inputs are
    if contiguous:
        dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()
    out, partial = ops.qkv_grad(dq, dk, dv)
    assert torch.equal(out, qkv.reshape(B * T, 3 * nh * hd))
    assert rel(partial.sum(0), out.double().sum(0)) < 1e-5


@cuda
@pytest.mark.parametrize("block", ["ffn", "ffn-packed", "attention"])
def test_compiled_training_takes_the_fused_path_with_the_plain_gradients(monkeypatch, block):
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=128, intermediate_size=512, num_attention_heads=2, attention_probs_dropout_prob=0.0)
    module = (MultiHeadAttention(cfg) if block == "attention" else FeedForward(cfg)).cuda()
    # packed batches: (tokens, H); attention over more than 128 tokens (kernels.short_attention takes the rest)
    shape = {"ffn": (4, 96, 128), "ffn-packed": (384, 128), "attention": (2, 160, 128)}[block]
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # a 16-bit stream
    dy = torch.randn(shape, device="cuda")
    calls = []
    for name in ("feed_forward", "qkv_projection"):
        fn = getattr(fused_backward, name)
        monkeypatch.setattr(fused_backward, name, lambda *a, fn=fn: calls.append(1) or fn(*a))

    plain = compiled_output_and_grads(module, x, dy)  # the reference module
    assert not calls
    module.__class__ = FusedQKVAttention if block == "attention" else FusedFeedForward  # as `fast_path.apply` does
    fast = compiled_output_and_grads(module, x, dy)
    assert calls
    assert_equal_within_bf16(fast, plain)
