"""Triton kernels behind `bert_kit.short_attention`: whole-sequence attention for T <= 128.

Imported only by `register_short_attention` (compiled training on CUDA): importing Triton loads
torch._inductor, seconds that other commands should not pay.

One program holds one (sequence, head). All of its keys and values fit one tile, so the softmax
needs no running maximum, the backward needs no atomics and no dot(dO, O) pre-pass, q, k and v are
read straight from the fused QKV projection's (tokens x 3H) output, and dq, dk, dv are written
straight into its gradient with their column sums per sequence (the bias gradient, summed later).

Sizes are constexpr: compiled by inductor, plain int and float arguments lose Triton's divisibility
hints and come as float64, which made both kernels 4-6x slower.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bert_kit.dropout_triton import fill_mask

NUM_WARPS = 8  # the fastest of 4, 8 and 16 on an H200 (benchmarks/RESULTS.md)


@triton.jit
def _scores(q, k, mask_ptr, b, t, scale: tl.constexpr, T: tl.constexpr, HAS_MASK: tl.constexpr):
    """Scaled scores (BLOCK_T, BLOCK_T), float32, -inf at padded or masked keys."""
    s = tl.dot(q, tl.trans(k)) * scale
    key_ok = t < T
    if HAS_MASK:
        key_ok = key_ok & (tl.load(mask_ptr + b * T + t, mask=t < T, other=0) != 0)
    return tl.where(key_ok[None, :], s, float("-inf"))


@triton.jit
def _keep(keep_ptr, pid, t, T: tl.constexpr):
    """Program `pid`'s (T, T) dropout keep mask, padded to (BLOCK_T, BLOCK_T) with False."""
    inside = (t < T)[:, None] & (t < T)[None, :]
    return tl.load(keep_ptr + pid.to(tl.int64) * T * T + t[:, None] * T + t[None, :], mask=inside, other=0) != 0


@triton.jit
def _attention_fwd(qkv_ptr, mask_ptr, keep_ptr, o_ptr, lse_ptr, scale: tl.constexpr, keep_scale: tl.constexpr,
                   T: tl.constexpr, nh: tl.constexpr, H: tl.constexpr, HAS_MASK: tl.constexpr,
                   DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr, HEAD_DIM: tl.constexpr):
    # qkv: (B * T, 3H), columns [q heads | k heads | v heads]; o: (B * T, H); lse: (B * nh, BLOCK_T)
    pid = tl.program_id(0)
    b, h = pid // nh, pid % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    rows = (t < T)[:, None]
    offs = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM + t[:, None] * (3 * H) + d[None, :]
    q = tl.load(qkv_ptr + offs, mask=rows, other=0.0)
    k = tl.load(qkv_ptr + offs + H, mask=rows, other=0.0)
    v = tl.load(qkv_ptr + offs + 2 * H, mask=rows, other=0.0)
    s = _scores(q, k, mask_ptr, b, t, scale, T, HAS_MASK)
    m = tl.max(s, 1)
    p = tl.exp(s - m[:, None])
    total = tl.sum(p, 1)
    p = p / total[:, None]
    if DROPOUT:
        p = tl.where(_keep(keep_ptr, pid, t, T), p * keep_scale, 0.0)
    o = tl.dot(p.to(v.dtype), v)
    o_offs = b.to(tl.int64) * T * H + h * HEAD_DIM + t[:, None] * H + d[None, :]
    tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty), mask=rows)
    tl.store(lse_ptr + pid.to(tl.int64) * BLOCK_T + t, m + tl.log(total))


@triton.jit
def _attention_bwd(qkv_ptr, mask_ptr, keep_ptr, o_ptr, do_ptr, lse_ptr, dqkv_ptr, partial_ptr,
                   scale: tl.constexpr, keep_scale: tl.constexpr, T: tl.constexpr, nh: tl.constexpr,
                   H: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr,
                   HEAD_DIM: tl.constexpr):
    # dqkv: (B * T, 3H) like qkv; partial: (B, 3H) float32, column sums over each sequence's tokens.
    # Padded query rows load do = 0 and padded keys get p = 0, so they add nothing to the sums.
    pid = tl.program_id(0)
    b, h = pid // nh, pid % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    rows = (t < T)[:, None]
    offs = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM + t[:, None] * (3 * H) + d[None, :]
    o_offs = b.to(tl.int64) * T * H + h * HEAD_DIM + t[:, None] * H + d[None, :]
    q = tl.load(qkv_ptr + offs, mask=rows, other=0.0)
    k = tl.load(qkv_ptr + offs + H, mask=rows, other=0.0)
    v = tl.load(qkv_ptr + offs + 2 * H, mask=rows, other=0.0)
    o = tl.load(o_ptr + o_offs, mask=rows, other=0.0)
    do = tl.load(do_ptr + o_offs, mask=rows, other=0.0)
    lse = tl.load(lse_ptr + pid.to(tl.int64) * BLOCK_T + t)
    p = tl.exp(_scores(q, k, mask_ptr, b, t, scale, T, HAS_MASK) - lse[:, None])
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)  # rowsum(dO * O) = rowsum(P * dP)
    dp = tl.dot(do, tl.trans(v))
    if DROPOUT:
        keep = _keep(keep_ptr, pid, t, T)
        dv = tl.dot(tl.trans(tl.where(keep, p * keep_scale, 0.0).to(do.dtype)), do)
        dp = tl.where(keep, dp * keep_scale, 0.0)
    else:
        dv = tl.dot(tl.trans(p.to(do.dtype)), do)
    ds = (p * (dp - delta[:, None]) * scale).to(q.dtype)
    dq = tl.dot(ds, k)
    dk = tl.dot(tl.trans(ds), q)
    ty = dqkv_ptr.dtype.element_ty
    tl.store(dqkv_ptr + offs, dq.to(ty), mask=rows)
    tl.store(dqkv_ptr + offs + H, dk.to(ty), mask=rows)
    tl.store(dqkv_ptr + offs + 2 * H, dv.to(ty), mask=rows)
    sums = partial_ptr + b.to(tl.int64) * 3 * H + h * HEAD_DIM + d
    tl.store(sums, tl.sum(dq, 0))
    tl.store(sums + H, tl.sum(dk, 0))
    tl.store(sums + 2 * H, tl.sum(dv, 0))


def _meta(qkv: torch.Tensor, mask: torch.Tensor | None, T: int, nh: int, p: float) -> dict:
    H = qkv.shape[1] // 3
    block = max(16, triton.next_power_of_2(T))
    return dict(scale=(H // nh) ** -0.5, keep_scale=1.0 / (1.0 - p), T=T, nh=nh, H=H, HAS_MASK=mask is not None,
                DROPOUT=p > 0.0, BLOCK_T=block, HEAD_DIM=H // nh, num_warps=NUM_WARPS)


@torch.library.triton_op("bert_kit::short_attention_fwd", mutates_args=())
def attention_fwd(qkv: torch.Tensor, mask: torch.Tensor | None, seed: torch.Tensor, B: int, T: int, nh: int,
                  p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (B * T, 3H), mask (B, T) bool (True = attend) or None, dropout p < 1 from `seed` ->
    o (B * T, H), lse (B * nh, BLOCK_T) float32, keep (B * nh * T * T) bool (empty without dropout)."""
    meta = _meta(qkv, mask, T, nh, p)
    o = qkv.new_empty(B * T, meta["H"])
    lse = qkv.new_empty(B * nh, meta["BLOCK_T"], dtype=torch.float32)
    keep = qkv.new_empty(B * nh * T * T if p > 0.0 else 0, dtype=torch.bool)
    if p > 0.0:  # drawn as `bert_kit.dropout` draws hidden dropout's
        fill_mask(keep, seed, p)
    torch.library.wrap_triton(_attention_fwd)[(B * nh,)](
        qkv, qkv if mask is None else mask, keep if p > 0.0 else qkv, o, lse, **meta)
    return o, lse, keep


@torch.library.triton_op("bert_kit::short_attention_bwd", mutates_args=())
def attention_bwd(qkv: torch.Tensor, mask: torch.Tensor | None, keep: torch.Tensor, o: torch.Tensor,
                  do: torch.Tensor, lse: torch.Tensor, B: int, T: int, nh: int,
                  p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's inputs and outputs, do (B * T, H) -> dqkv (B * T, 3H) and its column sums per
    sequence (B, 3H) float32, whose sum over sequences is the QKV bias gradient."""
    meta = _meta(qkv, mask, T, nh, p)
    dqkv = torch.empty_like(qkv)
    partial = qkv.new_empty(B, 3 * meta["H"], dtype=torch.float32)
    torch.library.wrap_triton(_attention_bwd)[(B * nh,)](
        qkv, qkv if mask is None else mask, keep if p > 0.0 else qkv, o, do, lse, dqkv, partial, **meta)
    return dqkv, partial
