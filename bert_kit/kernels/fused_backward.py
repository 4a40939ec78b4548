"""Backward passes that write a gradient and its bias gradient in one pass over the gradient.

Compiled, inductor computes a bias gradient as a separate reduction that reads the gradient again,
and for the two widest it recomputes the gradient inside that reduction: GELU's backward over the
FFN's (tokens x 4H) activation, and the QKV projection's (tokens x 3H) gradient assembled from
attention's three. In BERT-base pretraining these second passes took 1.6 ms of a 50 ms step on an
H100. Here two Triton kernels (`fused_backward_triton.py`) write each gradient and its column sums
together (+2.6% tokens/s, benchmarks/reports/2026-11-28-fused-backward.md); the matmuls stay cuBLAS's:

    FFN   forward:  z = x @ W1.T + b1, h = GELU(z) (a Triton kernel too), y = h @ W2.T + b2
          backward: dz, db1 = (dy @ W2) * GELU'(z), its column sums      (one kernel)
                    dx = dz @ W1, dW1 = dz.T @ x, dW2 = dy.T @ h, db2 = sum(dy)
    QKV   forward:  q, k, v = views of x @ W.T + b, (B, nh, T, hd) each
          backward: dqkv, db = [dq | dk | dv] token-major, its column sums   (one kernel)
                    dx = dqkv @ W, dW = dqkv.T @ x

`fast_path.apply` puts `FusedFeedForward` and `FusedQKVAttention` on a model that trains compiled
on CUDA with a 16-bit residual stream (pretraining); each call still checks that it is such a
call (`applies`), and otherwise runs the plain code. Importing this module imports Triton (and
torch._inductor, seconds of start-up): only `fast_path` does, and only for such a run.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.kernels.attention import CudaAttention
from bert_kit.model import GELU, FeedForward

try:
    from bert_kit.kernels import fused_backward_triton as triton_ops
except (ImportError, AttributeError):  # no Triton, or a torch without `triton_op`: never applied
    triton_ops = None


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else x.dtype


def applies(x: torch.Tensor, *linears: nn.Linear) -> bool:
    """Whether the fused backward takes this call: Triton present, training compiled on CUDA with a
    16-bit stream (x already in the compute dtype, as `set_low_precision_residual` makes it),
    biases present, widths the kernels tile (multiples of 64)."""
    return (triton_ops is not None and x.is_cuda and torch.is_grad_enabled() and torch.compiler.is_compiling()
            and x.dtype in (torch.bfloat16, torch.float16) and _compute_dtype(x) == x.dtype
            and all(m.bias is not None and m.in_features % 64 == 0 and m.out_features % 64 == 0 for m in linears))


def _cast(dtype: torch.dtype, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(dtype).contiguous() for t in tensors]  # the parameters, as autocast would cast them


class _FeedForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2):
        x2 = x.reshape(-1, x.shape[-1])
        z = F.linear(x2, w1, b1)
        h = triton_ops.gelu(z)
        ctx.save_for_backward(x2, w1, w2, z, h)
        return F.linear(h, w2, b2).view(*x.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, w1, w2, z, h = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        dz, partial = triton_ops.gelu_grad(dy2 @ w2, z)
        dx = (dz @ w1).view(*dy.shape[:-1], w1.shape[1])
        return dx, dz.t() @ x2, partial.sum(0).to(w1.dtype), dy2.t() @ h, dy2.sum(0)


def feed_forward(x: torch.Tensor, up: nn.Linear, down: nn.Linear) -> torch.Tensor:
    """down(GELU(up(x))): x (..., H) -> (..., H), in x's dtype (the compute dtype, see `applies`)."""
    with torch.autocast("cuda", enabled=False):
        return _FeedForward.apply(x.contiguous(), *_cast(x.dtype, up.weight, up.bias, down.weight, down.bias))


class _QKVProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, num_heads):
        B, T, H = x.shape
        x2 = x.reshape(B * T, H)
        ctx.save_for_backward(x2, w)
        q, k, v = F.linear(x2, w, b).view(B, T, 3, num_heads, H // num_heads).permute(2, 0, 3, 1, 4)
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        x2, w = ctx.saved_tensors
        dqkv, partial = triton_ops.qkv_grad(dq, dk, dv)
        dx = (dqkv @ w).view(dq.shape[0], dq.shape[2], w.shape[1])
        return dx, dqkv.t() @ x2, partial.sum(0).to(w.dtype), None


def qkv_projection(x: torch.Tensor, qkv: nn.Linear, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (B, T, H) -> q, k, v (B, nh, T, hd), views of one fused projection, in x's dtype."""
    with torch.autocast("cuda", enabled=False):
        return _QKVProjection.apply(x.contiguous(), *_cast(x.dtype, qkv.weight, qkv.bias), num_heads)


class FusedFeedForward(FeedForward):
    """`FeedForward` (GELU) whose compiled 16-bit CUDA training takes `feed_forward`; same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.act, GELU) and applies(x, self.up, self.down):
            return feed_forward(x, self.up, self.down)  # same function, fewer passes backward
        return super().forward(x)


class FusedQKVAttention(CudaAttention):
    """`CudaAttention` whose compiled 16-bit CUDA training projects Q, K and V with `qkv_projection`."""

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if applies(x, self.qkv):
            return qkv_projection(x, self.qkv, self.num_heads)  # same function, fewer passes backward
        return super().project(x)
