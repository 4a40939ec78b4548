"""Self-attention for sequences of up to 128 tokens, QKV projection included, as one autograd Function.

At T <= 128 a head's keys and values fit one tile. Two Triton kernels (`short_attention_triton.py`)
then replace cuDNN's attention forward and backward, the backward's dot(dO, O) pre-pass and dq
conversion, and the assembly of the QKV gradient with its bias gradient: in BERT-base pretraining
on an H100, +4% tokens/s (benchmarks/RESULTS.md). The matmuls stay cuBLAS's:

    forward:  qkv = x @ W.T + b;  o, lse, keep = attention(qkv)                     (one kernel)
    backward: dqkv, its column sums = attention_bwd(qkv, do, lse, keep)             (one kernel)
              dx = dqkv @ W,  dW = dqkv.T @ x,  db = the column sums' total

Dropout on the attention probabilities keeps the elements of a mask drawn once per forward as
`bert_kit.dropout` draws it (one byte per score, read again by the backward). Used where
`fused_backward` applies (compiled CUDA training, 16-bit stream) once `register_short_attention`
has run, for padded batches of T <= 128 with a key mask or none and head sizes 16-128, powers of
two; everywhere else the model's plain attention runs.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit import fused_backward

enabled = True  # switch for measuring against cuDNN's attention
_ops = None  # the Triton module, once `register_short_attention` has run


def register_short_attention() -> ModuleType | None:
    """Import the Triton ops (once) and return their module, or None without Triton. Call it
    before compiling a model that should use them (see `fused_backward.import_triton_ops`)."""
    global _ops
    _ops = _ops or fused_backward.import_triton_ops("short_attention_triton")
    return _ops


def applies(x: torch.Tensor, mask: torch.Tensor | None, qkv: nn.Linear, head_dim: int, p: float) -> bool:
    """Whether this call takes the Triton kernels: x (B, T, H) with T <= 128, a bool key mask
    (B, 1, 1, T) or None, a head size the kernels tile, and `fused_backward.applies` (compiled
    16-bit CUDA training)."""
    key_mask = mask is None or (mask.dtype == torch.bool and mask.shape == (x.shape[0], 1, 1, x.shape[1]))
    return (enabled and _ops is not None and x.dim() == 3 and 0 < x.shape[1] <= 128 and p < 1.0
            and 16 <= head_dim <= 128 and head_dim & (head_dim - 1) == 0 and key_mask
            and fused_backward.applies(x, qkv))


class _SelfAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, mask, seed, num_heads, p):
        B, T, H = x.shape
        x2 = x.reshape(B * T, H)
        qkv = F.linear(x2, w, b)
        o, lse, keep = _ops.attention_fwd(qkv, mask, seed, B, T, num_heads, p)
        ctx.save_for_backward(x2, w, qkv, mask, keep, lse)
        ctx.num_heads, ctx.p = num_heads, p
        return o.view(B, T, H)

    @staticmethod
    def backward(ctx, dy):
        x2, w, qkv, mask, keep, lse = ctx.saved_tensors
        B, T, H = dy.shape
        dqkv, partial = _ops.attention_bwd(qkv, mask, keep, dy.reshape(B * T, H).contiguous(), lse, B, T,
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
