"""Triton kernels behind `bert_kit.kernels.short_attention`: whole-sequence attention for T <= 128.

Imported only by `short_attention.py`, which `fast_path` imports only for compiled training on CUDA:
importing Triton loads torch._inductor, seconds that other commands should not pay.

All of a head's keys and values fit one tile, so the softmax needs no running maximum and the
backward needs no atomics: q, k and v are read straight from the fused QKV projection's (tokens x 3H)
output, and dq, dk, dv are written straight into its gradient with their column sums per sequence
(the bias gradient, summed later). A query block's rows hold every key, so the backward's
rowsum(dO * O) is rowsum(P * dP) from the tile itself, and O is not read again.

The forward runs one program per (sequence, head, block of 64 queries); the backward one per
(sequence, head), in two passes over its query blocks (dv, then dq and dk), so that one (T, head
size) float32 accumulator is live at a time, or in one pass where the queries are one block. Both
with 4 warps, which with these tiles lets two programs share an SM: on an H200 (BERT-base layer,
B 256, T 128) 0.084 ms for the forward and 0.230 for the backward, against 0.094 and 0.273 with
one program of 8 warps per (sequence, head) (benchmarks/reports/2026-11-28-short-attention-blocks-of-64.md).
Heads of 128 take the backward's query blocks as one, with 8 warps.

Sizes are constexpr: compiled by inductor, plain int and float arguments lose Triton's divisibility
hints and come as float64, which made both kernels 4-6x slower.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bert_kit.kernels.dropout_triton import fill_mask

BLOCK_Q = 64  # queries per tile (fewer when T is shorter)


@triton.jit
def _key_ok(mask_ptr, b, t, T: tl.constexpr, HAS_MASK: tl.constexpr):
    """(BLOCK_T,) bool: key t exists and is not masked out."""
    ok = t < T
    if HAS_MASK:
        ok = ok & (tl.load(mask_ptr + b * T + t, mask=t < T, other=0) != 0)
    return ok


@triton.jit
def _probs(qkv_ptr, lse_ptr, bh, q_offs, rows, r, k, scale: tl.constexpr, BLOCK_T: tl.constexpr):
    """A query block's q (BLOCK_Q, HEAD_DIM) and its softmax probabilities (BLOCK_Q, BLOCK_T),
    float32, rebuilt from the forward's logsumexp. Exact for the keys the forward attended to, where
    s - lse <= 0; the others' k rows are 0 (see `_attention_bwd`), so capping at 0 keeps their
    values finite without a mask in the loop."""
    q = tl.load(qkv_ptr + q_offs, mask=rows, other=0.0)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * BLOCK_T + r)
    return q, tl.exp(tl.minimum(tl.dot(q, tl.trans(k)) * scale - lse[:, None], 0.0))


@triton.jit
def _keep(keep_ptr, bh, r, t, T: tl.constexpr):
    """Rows r of (sequence, head) bh's (T, T) dropout keep mask, (BLOCK_Q, BLOCK_T), False where padded."""
    inside = (r < T)[:, None] & (t < T)[None, :]
    return tl.load(keep_ptr + bh.to(tl.int64) * T * T + r[:, None] * T + t[None, :], mask=inside, other=0) != 0


@triton.jit
def _dq_dk(q, p, do, k, v, keep_ptr, bh, r, t, T: tl.constexpr, scale: tl.constexpr, keep_scale: tl.constexpr,
           DROPOUT: tl.constexpr):
    """A query block's dq (BLOCK_Q, HEAD_DIM) and its term of dk (BLOCK_T, HEAD_DIM), float32, from
    dS = P * (dP - rowsum(P * dP)), dP = dO V^T with dropout applied."""
    dp = tl.dot(do, tl.trans(v))
    if DROPOUT:
        dp = tl.where(_keep(keep_ptr, bh, r, t, T), dp * keep_scale, 0.0)
    ds = (p * (dp - tl.sum(p * dp, 1)[:, None]) * scale).to(q.dtype)
    return tl.dot(ds, k), tl.dot(tl.trans(ds), q)


@triton.jit
def _attention_fwd(qkv_ptr, mask_ptr, keep_ptr, o_ptr, lse_ptr, scale: tl.constexpr, keep_scale: tl.constexpr,
                   T: tl.constexpr, nh: tl.constexpr, H: tl.constexpr, HAS_MASK: tl.constexpr,
                   DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr):
    # qkv: (B * T, 3H), columns [q heads | k heads | v heads]; o: (B * T, H); lse: (B * nh, BLOCK_T)
    pid = tl.program_id(0)
    bh, block = pid // (BLOCK_T // BLOCK_Q), pid % (BLOCK_T // BLOCK_Q)
    b, h = bh // nh, bh % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    r = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rows = (r < T)[:, None]
    base = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM
    kv_offs = base + t[:, None] * (3 * H) + d[None, :]
    k = tl.load(qkv_ptr + kv_offs + H, mask=(t < T)[:, None], other=0.0)
    v = tl.load(qkv_ptr + kv_offs + 2 * H, mask=(t < T)[:, None], other=0.0)
    q = tl.load(qkv_ptr + base + r[:, None] * (3 * H) + d[None, :], mask=rows, other=0.0)
    s = tl.where(_key_ok(mask_ptr, b, t, T, HAS_MASK)[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))
    m = tl.max(s, 1)
    p = tl.exp(s - m[:, None])
    total = tl.sum(p, 1)
    p = p / total[:, None]
    if DROPOUT:
        p = tl.where(_keep(keep_ptr, bh, r, t, T), p * keep_scale, 0.0)
    o = tl.dot(p.to(v.dtype), v)
    o_offs = b.to(tl.int64) * T * H + h * HEAD_DIM + r[:, None] * H + d[None, :]
    tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty), mask=rows)
    tl.store(lse_ptr + bh.to(tl.int64) * BLOCK_T + r, m + tl.log(total))


@triton.jit
def _attention_bwd(qkv_ptr, mask_ptr, keep_ptr, do_ptr, lse_ptr, dqkv_ptr, partial_ptr,
                   scale: tl.constexpr, keep_scale: tl.constexpr, T: tl.constexpr, nh: tl.constexpr,
                   H: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr):
    # dqkv: (B * T, 3H) like qkv; partial: (B, 3H) float32, column sums over each sequence's tokens.
    # Keys that are padded or masked out are loaded as zero k and v rows: their scores are 0 and their
    # dP is 0, so they add nothing to rowsum(P * dP) or to dq, and their dk and dv rows, meaningless,
    # are zeroed once at the end. A key mask applied to every tile instead cost registers and time
    # (backward 0.287 against 0.230 ms without a mask, H200). Padded query rows load do = 0.
    bh = tl.program_id(0)
    b, h = bh // nh, bh % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    base = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM
    do_base = b.to(tl.int64) * T * H + h * HEAD_DIM
    kv_offs = base + t[:, None] * (3 * H) + d[None, :]
    keys = _key_ok(mask_ptr, b, t, T, HAS_MASK)[:, None]
    k = tl.load(qkv_ptr + kv_offs + H, mask=keys, other=0.0)
    v = tl.load(qkv_ptr + kv_offs + 2 * H, mask=keys, other=0.0)
    ty = dqkv_ptr.dtype.element_ty
    sums = partial_ptr + b.to(tl.int64) * 3 * H + h * HEAD_DIM + d

    dv = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    dk = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    dq_sum = tl.zeros((HEAD_DIM,), tl.float32)
    for block in tl.range(0, BLOCK_T // BLOCK_Q, num_stages=1):  # pass 1: dv = P'^T dO, P' = P with dropout
        r = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rows = (r < T)[:, None]
        q_offs = base + r[:, None] * (3 * H) + d[None, :]
        do = tl.load(do_ptr + do_base + r[:, None] * H + d[None, :], mask=rows, other=0.0)
        q, p = _probs(qkv_ptr, lse_ptr, bh, q_offs, rows, r, k, scale, BLOCK_T)
        if DROPOUT:
            dv += tl.dot(tl.trans(tl.where(_keep(keep_ptr, bh, r, t, T), p * keep_scale, 0.0).to(do.dtype)), do)
        else:
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        if BLOCK_Q == BLOCK_T:  # a single block: pass 2 here too, without computing P again
            dq, dk_part = _dq_dk(q, p, do, k, v, keep_ptr, bh, r, t, T, scale, keep_scale, DROPOUT)
            dk += dk_part
            tl.store(dqkv_ptr + q_offs, dq.to(ty), mask=rows)
            dq_sum += tl.sum(dq, 0)
    dv = tl.where(_key_ok(mask_ptr, b, t, T, HAS_MASK)[:, None], dv, 0.0)  # the mask read again: fewer registers
    tl.store(dqkv_ptr + kv_offs + 2 * H, dv.to(ty), mask=(t < T)[:, None])
    tl.store(sums + 2 * H, tl.sum(dv, 0))

    if BLOCK_Q < BLOCK_T:
        for block in tl.range(0, BLOCK_T // BLOCK_Q, num_stages=1):  # pass 2: dq and dk
            r = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
            rows = (r < T)[:, None]
            q_offs = base + r[:, None] * (3 * H) + d[None, :]
            do = tl.load(do_ptr + do_base + r[:, None] * H + d[None, :], mask=rows, other=0.0)
            q, p = _probs(qkv_ptr, lse_ptr, bh, q_offs, rows, r, k, scale, BLOCK_T)
            dq, dk_part = _dq_dk(q, p, do, k, v, keep_ptr, bh, r, t, T, scale, keep_scale, DROPOUT)
            dk += dk_part
            tl.store(dqkv_ptr + q_offs, dq.to(ty), mask=rows)
            dq_sum += tl.sum(dq, 0)
    dk = tl.where(_key_ok(mask_ptr, b, t, T, HAS_MASK)[:, None], dk, 0.0)
    tl.store(dqkv_ptr + kv_offs + H, dk.to(ty), mask=(t < T)[:, None])
    tl.store(sums, dq_sum)
    tl.store(sums + H, tl.sum(dk, 0))


def _meta(qkv: torch.Tensor, mask: torch.Tensor | None, T: int, nh: int, p: float, backward: bool = False) -> dict:
    H = qkv.shape[1] // 3
    block = max(16, triton.next_power_of_2(T))
    meta = dict(scale=(H // nh) ** -0.5, keep_scale=1.0 / (1.0 - p), T=T, nh=nh, H=H, HAS_MASK=mask is not None,
                DROPOUT=p > 0.0, BLOCK_T=block, BLOCK_Q=min(BLOCK_Q, block), HEAD_DIM=H // nh, num_warps=4)
    if backward and H // nh > 64:  # (T, 128) accumulators spill at 4 warps: one block of 8 warps is fastest
        meta.update(BLOCK_Q=block, num_warps=8)
    return meta


@torch.library.triton_op("bert_kit::short_attention_fwd", mutates_args=())
def attention_fwd(qkv: torch.Tensor, mask: torch.Tensor | None, seed: torch.Tensor, B: int, T: int, nh: int,
                  p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (B * T, 3H), mask (B, T) bool (True = attend) or None, dropout p < 1 from `seed` ->
    o (B * T, H), lse (B * nh, BLOCK_T) float32, keep (B * nh * T * T) bool (empty without dropout)."""
    meta = _meta(qkv, mask, T, nh, p)
    o = qkv.new_empty(B * T, meta["H"])
    lse = qkv.new_empty(B * nh, meta["BLOCK_T"], dtype=torch.float32)
    keep = qkv.new_empty(B * nh * T * T if p > 0.0 else 0, dtype=torch.bool)
    if p > 0.0:  # drawn as `bert_kit.kernels.dropout` draws hidden dropout's
        fill_mask(keep, seed, p)
    blocks = meta["BLOCK_T"] // meta["BLOCK_Q"]
    torch.library.wrap_triton(_attention_fwd)[(B * nh * blocks,)](
        qkv, qkv if mask is None else mask, keep if p > 0.0 else qkv, o, lse, **meta)
    return o, lse, keep


@torch.library.triton_op("bert_kit::short_attention_bwd", mutates_args=())
def attention_bwd(qkv: torch.Tensor, mask: torch.Tensor | None, keep: torch.Tensor, do: torch.Tensor,
                  lse: torch.Tensor, B: int, T: int, nh: int, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's inputs, its lse and keep, do (B * T, H) -> dqkv (B * T, 3H) and its column sums
    per sequence (B, 3H) float32, whose sum over sequences is the QKV bias gradient."""
    meta = _meta(qkv, mask, T, nh, p, backward=True)
    dqkv = torch.empty_like(qkv)
    partial = qkv.new_empty(B, 3 * meta["H"], dtype=torch.float32)
    torch.library.wrap_triton(_attention_bwd)[(B * nh,)](
        qkv, qkv if mask is None else mask, keep if p > 0.0 else qkv, do, lse, dqkv, partial, **meta)
    return dqkv, partial
