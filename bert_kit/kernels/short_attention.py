"""Self-attention for sequences of up to 128 tokens, QKV projection included, as one autograd Function.

At T <= 128 a head's keys and values fit one tile. Two Triton kernels (`short_attention_triton.py`)
then replace cuDNN's attention forward and backward, the backward's dot(dO, O) pre-pass and dq
conversion, and the assembly of the QKV gradient with its bias gradient: in BERT-base pretraining
on an H100, +4% tokens/s (benchmarks/reports/2026-11-28-short-attention.md). The matmuls stay cuBLAS's:

    forward:  qkv = x @ W.T + b;  o, lse, keep = attention(qkv)                     (one kernel)
    backward: dqkv, its column sums = attention_bwd(qkv, do, lse, keep)             (one kernel)
              dx = dqkv @ W,  dW = dqkv.T @ x,  db = the column sums' total

Dropout on the attention probabilities keeps the elements of a mask drawn once per forward as
`bert_kit.kernels.dropout` draws it (one byte per score, read again by the backward).
`fast_path.apply` puts `ShortAttention` on a model where `fused_backward` applies (compiled CUDA
training, 16-bit stream); each call takes the kernels for padded batches of T <= 128 with a key
mask or none and head sizes 16-128, powers of two (`applies`), and otherwise runs
`FusedQKVAttention`'s attention. Importing this module imports Triton, as `fused_backward` does.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.kernels import fused_backward
from bert_kit.kernels.fused_backward import FusedQKVAttention
from bert_kit.kernels.packing import Packed

try:
    from bert_kit.kernels import short_attention_triton as triton_ops
except (ImportError, AttributeError):  # no Triton, or a torch without `triton_op`: never applied
    triton_ops = None


def applies(x: torch.Tensor, mask: torch.Tensor | None, qkv: nn.Linear, head_dim: int, p: float) -> bool:
    """Whether this call takes the Triton kernels: x (B, T, H) with T <= 128, a bool key mask
    (B, 1, 1, T) or None, a head size the kernels tile, and `fused_backward.applies` (compiled
    16-bit CUDA training)."""
    key_mask = mask is None or (mask.dtype == torch.bool and mask.shape == (x.shape[0], 1, 1, x.shape[1]))
    return (triton_ops is not None and x.dim() == 3 and 0 < x.shape[1] <= 128 and p < 1.0
            and 16 <= head_dim <= 128 and head_dim & (head_dim - 1) == 0 and key_mask
            and fused_backward.applies(x, qkv))


class _SelfAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, mask, seed, num_heads, p):
        B, T, H = x.shape
        x2 = x.reshape(B * T, H)
        qkv = F.linear(x2, w, b)
        o, lse, keep = triton_ops.attention_fwd(qkv, mask, seed, B, T, num_heads, p)
        ctx.save_for_backward(x2, w, qkv, mask, keep, lse)
        ctx.num_heads, ctx.p = num_heads, p
        return o.view(B, T, H)

    @staticmethod
    def backward(ctx, dy):
        x2, w, qkv, mask, keep, lse = ctx.saved_tensors
        B, T, H = dy.shape
        dqkv, partial = triton_ops.attention_bwd(qkv, mask, keep, dy.reshape(B * T, H).contiguous(), lse, B, T,
                                                 ctx.num_heads, ctx.p)
        return (dqkv @ w).view(B, T, H), dqkv.t() @ x2, partial.sum(0).to(w.dtype), None, None, None, None


def self_attention(x: torch.Tensor, qkv: nn.Linear, mask: torch.Tensor | None, num_heads: int,
                   p: float) -> torch.Tensor:
    """x (B, T, H), mask (B, 1, 1, T) bool (True = attend) or None -> the heads' outputs side by
    side (B, T, H), before the output projection, in x's dtype (the compute dtype, see `applies`)."""
    B, T, _ = x.shape
    key_mask = None if mask is None else mask.reshape(B, T).contiguous()
    seed = torch.randint(2**62, (1,), device=x.device)
    with torch.autocast("cuda", enabled=False):
        return _SelfAttention.apply(x.contiguous(), qkv.weight.to(x.dtype), qkv.bias.to(x.dtype), key_mask, seed,
                                    num_heads, p)


class ShortAttention(FusedQKVAttention):
    """`FusedQKVAttention` that takes `self_attention` (QKV projection and attention in two kernels
    a pass) where `applies`; same parameters."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, packed: Packed | None = None) -> torch.Tensor:
        p = self.attn_dropout if self.training else 0.0
        if packed is None and applies(x, mask, self.qkv, self.head_dim, p):  # same function, fewer kernels
            return self.out(self_attention(x, self.qkv, mask, self.num_heads, p))
        return super().forward(x, mask, packed)
