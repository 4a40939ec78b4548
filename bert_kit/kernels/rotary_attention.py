"""ModernBERT's attention with the rotations in Triton kernels (`rotary_attention_triton.py`), on CUDA in 16 bits.

The reference (`ModernBertAttention`) projects, splits the heads, turns q and k by their positions in
float32 (`apply_rotary`: about ten elementwise passes over q and k in eager code; inductor fuses
them into one, and their backward into another, in compiled code) and calls its attention kernel.
`RotaryAttention` computes the same function with fewer passes over memory:

- packed batches whose sequences hold at most 128 tokens (training at seq 128, short texts): the
  rotations, the sliding window and attention in one kernel, and in the backward one kernel that
  writes the QKV projection's gradient, dq and dk turned back (BERT's short attention, with the
  rotations inside; `short_attention.py`). The projection stays cuBLAS's:

      forward:  qkv = x @ W.T;  o, lse = attention(turn(q), turn(k), v)             (one kernel)
      backward: dqkv = [turn^T(dq) | turn^T(dk) | dv] from qkv, do, lse             (one kernel)
                dx = dqkv @ W,  dW = dqkv.T @ x

- longer sequences in the sliding-window layers: the same, with the window's keys only (a block of
  64 queries sees 192 keys at ModernBERT's window of 64, at any length), in training and inference.

- longer sequences in the global layers, without gradients (eager inference: `embed`, `predict`,
  `serve`): q and k turned in one kernel from the projection's output, then flash attention.
  Compiled code and training keep the reference's rotation there: inductor fuses it.

`fast_path.apply` puts `RotaryAttention` on a ModernBERT that runs on CUDA in 16 bits with flash
attention; each call checks what only the call knows (`applies`: packed, 16-bit, the lengths, no
dropout on the probabilities) and otherwise runs the reference's code. Importing this module
imports Triton, as `short_attention` does: only `fast_path` imports it, for such a run.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from bert_kit.kernels.packing import Packed
from bert_kit.modernbert import ModernBertAttention

try:
    from bert_kit.kernels import rotary_attention_triton as triton_ops
except (ImportError, AttributeError):  # no Triton, or a torch without `triton_op`: never applied
    triton_ops = None

HALF = (torch.float16, torch.bfloat16)
MAX_SEQLEN = 128  # the longest sequence whose keys fit one tile
MAX_WINDOW = 128  # the widest sliding window of the window kernels (longer sequences)
HEAD_DIMS = (32, 64, 128)  # the kernels' tiles: halves of 16 or more, powers of two


def applies(x: torch.Tensor, packed: Packed | None, qkv: nn.Linear, head_dim: int) -> bool:
    """Whether the kernels take this call: packed (N, H) on CUDA, the projection's output 16-bit
    (autocast's dtype, else its weight's), a head size they tile, Triton present."""
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else qkv.weight.dtype
    return (triton_ops is not None and packed is not None and x.is_cuda and dtype in HALF
            and head_dim in HEAD_DIMS)


class _ShortAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, cu_seqlens, max_seqlen, num_heads, window):
        o, lse = triton_ops.attention_fwd(qkv, cos, sin, cu_seqlens, max_seqlen, num_heads, window)
        ctx.save_for_backward(qkv, cos, sin, cu_seqlens, lse)
        ctx.sizes = (max_seqlen, num_heads, window)
        return o

    @staticmethod
    def backward(ctx, do):
        qkv, cos, sin, cu_seqlens, lse = ctx.saved_tensors
        dqkv = triton_ops.attention_bwd(qkv, cos, sin, cu_seqlens, do.contiguous(), lse, *ctx.sizes)
        return dqkv, None, None, None, None, None, None


class _WindowAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, cu_seqlens, max_seqlen, num_heads, window):
        o, lse, q, k = triton_ops.window_fwd(qkv, cos, sin, cu_seqlens, max_seqlen, num_heads, window)
        ctx.save_for_backward(qkv, q, k, cos, sin, cu_seqlens, o, lse)
        ctx.sizes = (max_seqlen, num_heads, window)
        return o

    @staticmethod
    def backward(ctx, do):
        qkv, q, k, cos, sin, cu_seqlens, o, lse = ctx.saved_tensors
        dqkv = triton_ops.window_bwd(qkv, q, k, cos, sin, cu_seqlens, o, do.contiguous(), lse, *ctx.sizes)
        return dqkv, None, None, None, None, None, None


def window_rotary_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, packed: Packed,
                            num_heads: int, window: int) -> torch.Tensor:
    """`short_rotary_attention` of a sliding-window layer for sequences of any length (window <=
    `MAX_WINDOW`): qkv (N, 3H), cos and sin (N, 1, hd) float32 -> (N, H)."""
    return _WindowAttention.apply(qkv.contiguous(), cos, sin, packed.cu_seqlens, packed.max_seqlen, num_heads, window)


def short_rotary_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, packed: Packed,
                           num_heads: int, window: int | None) -> torch.Tensor:
    """Attention within each sequence of `packed` (at most 128 tokens each), q and k turned first:
    qkv (N, 3H) [q heads | k heads | v heads], cos and sin (N, 1, hd) float32 -> (N, H), the heads
    side by side; a query sees the keys within `window` positions (None: all of its sequence)."""
    return _ShortAttention.apply(qkv.contiguous(), cos, sin, packed.cu_seqlens, packed.max_seqlen, num_heads,
                                 -1 if window is None else window)


class RotaryAttention(ModernBertAttention):
    """`ModernBertAttention` whose packed 16-bit CUDA calls take the Triton kernels; same parameters."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None,
                packed: Packed | None = None) -> torch.Tensor:
        p = self.attn_dropout if self.training else 0.0
        if packed is not None and not p and applies(x, packed, self.qkv, self.head_dim):
            if packed.max_seqlen <= MAX_SEQLEN:
                y = short_rotary_attention(self.qkv(x), cos, sin, packed, self.num_heads, self.window)  # (N, H)
                return self.out_dropout(self.out(y))
            if self.window is not None and self.window <= MAX_WINDOW:
                y = window_rotary_attention(self.qkv(x), cos, sin, packed, self.num_heads, self.window)
                return self.out_dropout(self.out(y))
        return super().forward(x, cos, sin, mask, packed)

    def heads(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              packed: Packed | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As the reference's; q and k turned in one kernel where nothing needs their gradient outside
        compiled code (eager inference)."""
        eager_inference = not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and qkv.requires_grad)
        if eager_inference and qkv.dtype in HALF and applies(qkv, packed, self.qkv, self.head_dim):
            q, k = triton_ops.rotate_qk(qkv.contiguous(), cos, sin, self.num_heads)  # (N, nh, hd) each
            return q, k, qkv.view(qkv.shape[0], 3, self.num_heads, self.head_dim)[:, 2]
        return super().heads(qkv, cos, sin, packed)
