"""Diagnostic: variants of the short-attention kernels, each checked against float64 and timed.

One BERT-base attention layer (B 256, T 128, 12 heads of 64, dropout 0.1) with and without a key
mask. "shipped" is the checkout named by SRC, whose `_attention_fwd` and `_attention_bwd` must be
the kernels of one program per (sequence, head) that read O, as bert-kit had them up to 9164ad1.
The variants that replaced them are the rows "fwd split64 w4" and "bwd 2pass64 w4 st1" (the key
mask applied per block; bert_kit/kernels/short_attention_triton.py now applies it to k and v once).
SRC's layout is that commit's (the kernels at the package root, as imported below). Needs CUDA and
Triton:

    git worktree add /tmp/before 9164ad1
    MASKED_ONLY=1 SRC=/tmp/before python benchmarks/short_attention_variants.py   # the table of reports/2026-11-28-short-attention-blocks-of-64.md
    SRC=/tmp/before python benchmarks/short_attention_variants.py                 # every variant, no mask

Prints each variant's time (median, triton's do_bench), relative error, registers and spills.
"""
import json
import os
import sys

sys.path.insert(0, os.environ.get("SRC", os.getcwd()))

import torch
import triton
import triton.language as tl
import triton.testing
from bert_kit import short_attention_triton as sat
from bert_kit.dropout_triton import fill_mask


@triton.jit
def _qblock(i, qkv_ptr, keep_ptr, o_ptr, do_ptr, lse_ptr, dqkv_ptr, k, v, key_ok, dk, dv, dq_sum, pid, base, obase, t, d,
            scale: tl.constexpr, keep_scale: tl.constexpr, T: tl.constexpr, H: tl.constexpr, DROPOUT: tl.constexpr,
            BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, READ_O: tl.constexpr):
    r = i * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rows = (r < T)[:, None]
    qo = base + r[:, None] * (3 * H) + d[None, :]
    oo = obase + r[:, None] * H + d[None, :]
    q = tl.load(qkv_ptr + qo, mask=rows, other=0.0)
    do = tl.load(do_ptr + oo, mask=rows, other=0.0)
    lse = tl.load(lse_ptr + pid.to(tl.int64) * BLOCK_T + r)
    s = tl.dot(q, tl.trans(k)) * scale
    s = tl.where(key_ok[None, :], s, float("-inf"))
    p = tl.exp(s - lse[:, None])
    dp = tl.dot(do, tl.trans(v))
    if DROPOUT:
        keep = tl.load(keep_ptr + pid.to(tl.int64) * T * T + r[:, None] * T + t[None, :],
                       mask=rows & (t < T)[None, :], other=0) != 0
        dv += tl.dot(tl.trans(tl.where(keep, p * keep_scale, 0.0).to(do.dtype)), do)
        dp = tl.where(keep, dp * keep_scale, 0.0)
    else:
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
    if READ_O:
        o = tl.load(o_ptr + oo, mask=rows, other=0.0)
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    else:
        delta = tl.sum(p * dp, 1)
    ds = (p * (dp - delta[:, None]) * scale).to(q.dtype)
    dq = tl.dot(ds, k)
    dk += tl.dot(tl.trans(ds), q)
    tl.store(dqkv_ptr + qo, dq.to(dqkv_ptr.dtype.element_ty), mask=rows)
    dq_sum += tl.sum(dq, 0)
    return dk, dv, dq_sum


@triton.jit
def _bwd_q(qkv_ptr, mask_ptr, keep_ptr, o_ptr, do_ptr, lse_ptr, dqkv_ptr, partial_ptr,
           scale: tl.constexpr, keep_scale: tl.constexpr, T: tl.constexpr, nh: tl.constexpr,
           H: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr,
           HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, READ_O: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    b, h = pid // nh, pid % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    base = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM
    obase = b.to(tl.int64) * T * H + h * HEAD_DIM
    kv = base + t[:, None] * (3 * H) + d[None, :]
    k = tl.load(qkv_ptr + kv + H, mask=(t < T)[:, None], other=0.0)
    v = tl.load(qkv_ptr + kv + 2 * H, mask=(t < T)[:, None], other=0.0)
    key_ok = t < T
    if HAS_MASK:
        key_ok = key_ok & (tl.load(mask_ptr + b * T + t, mask=t < T, other=0) != 0)
    dk = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    dq_sum = tl.zeros((HEAD_DIM,), tl.float32)
    if UNROLL:
        for i in tl.static_range(0, BLOCK_T // BLOCK_Q):
            dk, dv, dq_sum = _qblock(i, qkv_ptr, keep_ptr, o_ptr, do_ptr, lse_ptr, dqkv_ptr, k, v, key_ok, dk, dv, dq_sum, pid, base, obase, t, d, scale, keep_scale, T, H, DROPOUT, BLOCK_T, BLOCK_Q, READ_O)
    else:
        for i in tl.range(0, BLOCK_T // BLOCK_Q):
            dk, dv, dq_sum = _qblock(i, qkv_ptr, keep_ptr, o_ptr, do_ptr, lse_ptr, dqkv_ptr, k, v, key_ok, dk, dv, dq_sum, pid, base, obase, t, d, scale, keep_scale, T, H, DROPOUT, BLOCK_T, BLOCK_Q, READ_O)
    ty = dqkv_ptr.dtype.element_ty
    tl.store(dqkv_ptr + kv + H, dk.to(ty), mask=(t < T)[:, None])
    tl.store(dqkv_ptr + kv + 2 * H, dv.to(ty), mask=(t < T)[:, None])
    sums = partial_ptr + b.to(tl.int64) * 3 * H + h * HEAD_DIM + d
    tl.store(sums, dq_sum)
    tl.store(sums + H, tl.sum(dk, 0))
    tl.store(sums + 2 * H, tl.sum(dv, 0))


@triton.jit
def _bwd_noo(qkv_ptr, mask_ptr, keep_ptr, o_ptr, do_ptr, lse_ptr, dqkv_ptr, partial_ptr,
             scale: tl.constexpr, keep_scale: tl.constexpr, T: tl.constexpr, nh: tl.constexpr,
             H: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr,
             HEAD_DIM: tl.constexpr):
    # the shipped kernel with delta = rowsum(P * dP') instead of rowsum(dO * O)
    pid = tl.program_id(0)
    b, h = pid // nh, pid % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    rows = (t < T)[:, None]
    offs = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM + t[:, None] * (3 * H) + d[None, :]
    o_offs = b.to(tl.int64) * T * H + h * HEAD_DIM + t[:, None] * H + d[None, :]
    q = tl.load(qkv_ptr + offs, mask=rows, other=0.0)
    k = tl.load(qkv_ptr + offs + H, mask=rows, other=0.0)
    v = tl.load(qkv_ptr + offs + 2 * H, mask=rows, other=0.0)
    do = tl.load(do_ptr + o_offs, mask=rows, other=0.0)
    lse = tl.load(lse_ptr + pid.to(tl.int64) * BLOCK_T + t)
    p = tl.exp(sat._scores(q, k, mask_ptr, b, t, scale, T, HAS_MASK) - lse[:, None])
    dp = tl.dot(do, tl.trans(v))
    if DROPOUT:
        keep = sat._keep(keep_ptr, pid, t, T)
        dv = tl.dot(tl.trans(tl.where(keep, p * keep_scale, 0.0).to(do.dtype)), do)
        dp = tl.where(keep, dp * keep_scale, 0.0)
    else:
        dv = tl.dot(tl.trans(p.to(do.dtype)), do)
    delta = tl.sum(p * dp, 1)
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


@triton.jit
def _fwd_q(qkv_ptr, mask_ptr, keep_ptr, o_ptr, lse_ptr, scale: tl.constexpr, keep_scale: tl.constexpr,
           T: tl.constexpr, nh: tl.constexpr, H: tl.constexpr, HAS_MASK: tl.constexpr,
           DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr):
    pid = tl.program_id(0)
    b, h = pid // nh, pid % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    base = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM
    obase = b.to(tl.int64) * T * H + h * HEAD_DIM
    kv = base + t[:, None] * (3 * H) + d[None, :]
    k = tl.load(qkv_ptr + kv + H, mask=(t < T)[:, None], other=0.0)
    v = tl.load(qkv_ptr + kv + 2 * H, mask=(t < T)[:, None], other=0.0)
    key_ok = t < T
    if HAS_MASK:
        key_ok = key_ok & (tl.load(mask_ptr + b * T + t, mask=t < T, other=0) != 0)
    for i in tl.static_range(0, BLOCK_T // BLOCK_Q):
        r = i * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rows = (r < T)[:, None]
        q = tl.load(qkv_ptr + base + r[:, None] * (3 * H) + d[None, :], mask=rows, other=0.0)
        s = tl.where(key_ok[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        m = tl.max(s, 1)
        p = tl.exp(s - m[:, None])
        total = tl.sum(p, 1)
        p = p / total[:, None]
        if DROPOUT:
            keep = tl.load(keep_ptr + pid.to(tl.int64) * T * T + r[:, None] * T + t[None, :],
                           mask=rows & (t < T)[None, :], other=0) != 0
            p = tl.where(keep, p * keep_scale, 0.0)
        o = tl.dot(p.to(v.dtype), v)
        tl.store(o_ptr + obase + r[:, None] * H + d[None, :], o.to(o_ptr.dtype.element_ty), mask=rows)
        tl.store(lse_ptr + pid.to(tl.int64) * BLOCK_T + r, m + tl.log(total))


@triton.jit
def _bwd_split(qkv_ptr, mask_ptr, keep_ptr, o_ptr, do_ptr, lse_ptr, dqkv_ptr, partial_ptr,
               scale: tl.constexpr, keep_scale: tl.constexpr, T: tl.constexpr, nh: tl.constexpr,
               H: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    # partial: (NB, B, 3H); programs (seq, head, role): roles 0..NB-1 a query block's dq,
    # roles NB..2NB-1 a key block's dk and dv
    NB: tl.constexpr = BLOCK_T // BLOCK
    pid = tl.program_id(0)
    bh, role = pid // (2 * NB), pid % (2 * NB)
    b, h = bh // nh, bh % nh
    t, d, blk = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM), tl.arange(0, BLOCK)
    base = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM
    obase = b.to(tl.int64) * T * H + h * HEAD_DIM
    keep_base = keep_ptr + bh.to(tl.int64) * T * T
    all_rows = (t < T)[:, None]
    ty = dqkv_ptr.dtype.element_ty
    if role < NB:
        r = role * BLOCK + blk
        rows = (r < T)[:, None]
        q = tl.load(qkv_ptr + base + r[:, None] * (3 * H) + d[None, :], mask=rows, other=0.0)
        do = tl.load(do_ptr + obase + r[:, None] * H + d[None, :], mask=rows, other=0.0)
        k = tl.load(qkv_ptr + base + H + t[:, None] * (3 * H) + d[None, :], mask=all_rows, other=0.0)
        v = tl.load(qkv_ptr + base + 2 * H + t[:, None] * (3 * H) + d[None, :], mask=all_rows, other=0.0)
        lse = tl.load(lse_ptr + bh.to(tl.int64) * BLOCK_T + r)
        key_ok = t < T
        if HAS_MASK:
            key_ok = key_ok & (tl.load(mask_ptr + b * T + t, mask=t < T, other=0) != 0)
        s = tl.where(key_ok[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        p = tl.exp(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v))
        if DROPOUT:
            keep = tl.load(keep_base + r[:, None] * T + t[None, :], mask=rows & (t < T)[None, :], other=0) != 0
            dp = tl.where(keep, dp * keep_scale, 0.0)
        delta = tl.sum(p * dp, 1)
        ds = (p * (dp - delta[:, None]) * scale).to(q.dtype)
        dq = tl.dot(ds, k)
        tl.store(dqkv_ptr + base + r[:, None] * (3 * H) + d[None, :], dq.to(ty), mask=rows)
        nb = tl.num_programs(0) // (2 * NB * nh)
        tl.store(partial_ptr + (role.to(tl.int64) * nb + b) * 3 * H + h * HEAD_DIM + d, tl.sum(dq, 0))
    else:
        j = role - NB
        c = j * BLOCK + blk
        cols = (c < T)[:, None]
        kb = tl.load(qkv_ptr + base + H + c[:, None] * (3 * H) + d[None, :], mask=cols, other=0.0)
        vb = tl.load(qkv_ptr + base + 2 * H + c[:, None] * (3 * H) + d[None, :], mask=cols, other=0.0)
        q2 = tl.load(qkv_ptr + base + t[:, None] * (3 * H) + d[None, :], mask=all_rows, other=0.0)
        do2 = tl.load(do_ptr + obase + t[:, None] * H + d[None, :], mask=all_rows, other=0.0)
        o = tl.load(o_ptr + obase + t[:, None] * H + d[None, :], mask=all_rows, other=0.0)
        lse2 = tl.load(lse_ptr + bh.to(tl.int64) * BLOCK_T + t)
        key_ok2 = c < T
        if HAS_MASK:
            key_ok2 = key_ok2 & (tl.load(mask_ptr + b * T + c, mask=c < T, other=0) != 0)
        delta2 = tl.sum(do2.to(tl.float32) * o.to(tl.float32), 1)
        sT = tl.where(key_ok2[:, None], tl.dot(kb, tl.trans(q2)) * scale, float("-inf"))
        pT = tl.exp(sT - lse2[None, :])
        dpT = tl.dot(vb, tl.trans(do2))
        if DROPOUT:
            keepT = tl.load(keep_base + t[None, :] * T + c[:, None], mask=cols & (t < T)[None, :], other=0) != 0
            dv = tl.dot(tl.where(keepT, pT * keep_scale, 0.0).to(do2.dtype), do2)
            dpT = tl.where(keepT, dpT * keep_scale, 0.0)
        else:
            dv = tl.dot(pT.to(do2.dtype), do2)
        dsT = (pT * (dpT - delta2[None, :]) * scale).to(q2.dtype)
        dk = tl.dot(dsT, q2)
        tl.store(dqkv_ptr + base + H + c[:, None] * (3 * H) + d[None, :], dk.to(ty), mask=cols)
        tl.store(dqkv_ptr + base + 2 * H + c[:, None] * (3 * H) + d[None, :], dv.to(ty), mask=cols)
        nb2 = tl.num_programs(0) // (2 * NB * nh)
        sums = partial_ptr + (j.to(tl.int64) * nb2 + b) * 3 * H + h * HEAD_DIM + d
        tl.store(sums + H, tl.sum(dk, 0))
        tl.store(sums + 2 * H, tl.sum(dv, 0))


@triton.jit
def _fwd_split(qkv_ptr, mask_ptr, keep_ptr, o_ptr, lse_ptr, scale: tl.constexpr, keep_scale: tl.constexpr,
               T: tl.constexpr, nh: tl.constexpr, H: tl.constexpr, HAS_MASK: tl.constexpr,
               DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    NB: tl.constexpr = BLOCK_T // BLOCK
    pid = tl.program_id(0)
    bh, j = pid // NB, pid % NB
    b, h = bh // nh, bh % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    base = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM
    obase = b.to(tl.int64) * T * H + h * HEAD_DIM
    kv = base + t[:, None] * (3 * H) + d[None, :]
    k = tl.load(qkv_ptr + kv + H, mask=(t < T)[:, None], other=0.0)
    v = tl.load(qkv_ptr + kv + 2 * H, mask=(t < T)[:, None], other=0.0)
    key_ok = t < T
    if HAS_MASK:
        key_ok = key_ok & (tl.load(mask_ptr + b * T + t, mask=t < T, other=0) != 0)
    r = j * BLOCK + tl.arange(0, BLOCK)
    rows = (r < T)[:, None]
    q = tl.load(qkv_ptr + base + r[:, None] * (3 * H) + d[None, :], mask=rows, other=0.0)
    s = tl.where(key_ok[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))
    m = tl.max(s, 1)
    p = tl.exp(s - m[:, None])
    total = tl.sum(p, 1)
    p = p / total[:, None]
    if DROPOUT:
        keep = tl.load(keep_ptr + bh.to(tl.int64) * T * T + r[:, None] * T + t[None, :],
                       mask=rows & (t < T)[None, :], other=0) != 0
        p = tl.where(keep, p * keep_scale, 0.0)
    o = tl.dot(p.to(v.dtype), v)
    tl.store(o_ptr + obase + r[:, None] * H + d[None, :], o.to(o_ptr.dtype.element_ty), mask=rows)
    tl.store(lse_ptr + bh.to(tl.int64) * BLOCK_T + r, m + tl.log(total))


@triton.jit
def _bwd_2pass(qkv_ptr, mask_ptr, keep_ptr, o_ptr, do_ptr, lse_ptr, dqkv_ptr, partial_ptr,
               scale: tl.constexpr, keep_scale: tl.constexpr, T: tl.constexpr, nh: tl.constexpr,
               H: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, STAGES: tl.constexpr):
    # pass 1: dv over query blocks; pass 2: dq and dk. One (T, head_dim) accumulator live at a time.
    pid = tl.program_id(0)
    b, h = pid // nh, pid % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    base = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM
    obase = b.to(tl.int64) * T * H + h * HEAD_DIM
    kv = base + t[:, None] * (3 * H) + d[None, :]
    k = tl.load(qkv_ptr + kv + H, mask=(t < T)[:, None], other=0.0)
    v = tl.load(qkv_ptr + kv + 2 * H, mask=(t < T)[:, None], other=0.0)
    key_ok = t < T
    if HAS_MASK:
        key_ok = key_ok & (tl.load(mask_ptr + b * T + t, mask=t < T, other=0) != 0)
    keep_base = keep_ptr + pid.to(tl.int64) * T * T
    ty = dqkv_ptr.dtype.element_ty
    dv = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    for i in tl.range(0, BLOCK_T // BLOCK_Q, num_stages=STAGES):
        r = i * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rows = (r < T)[:, None]
        q = tl.load(qkv_ptr + base + r[:, None] * (3 * H) + d[None, :], mask=rows, other=0.0)
        do = tl.load(do_ptr + obase + r[:, None] * H + d[None, :], mask=rows, other=0.0)
        lse = tl.load(lse_ptr + pid.to(tl.int64) * BLOCK_T + r)
        p = tl.exp(tl.where(key_ok[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf")) - lse[:, None])
        if DROPOUT:
            keep = tl.load(keep_base + r[:, None] * T + t[None, :], mask=rows & (t < T)[None, :], other=0) != 0
            p = tl.where(keep, p * keep_scale, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
    tl.store(dqkv_ptr + kv + 2 * H, dv.to(ty), mask=(t < T)[:, None])
    sums = partial_ptr + b.to(tl.int64) * 3 * H + h * HEAD_DIM + d
    tl.store(sums + 2 * H, tl.sum(dv, 0))
    dk = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    dq_sum = tl.zeros((HEAD_DIM,), tl.float32)
    for i in tl.range(0, BLOCK_T // BLOCK_Q, num_stages=STAGES):
        r = i * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rows = (r < T)[:, None]
        qo = base + r[:, None] * (3 * H) + d[None, :]
        q = tl.load(qkv_ptr + qo, mask=rows, other=0.0)
        do = tl.load(do_ptr + obase + r[:, None] * H + d[None, :], mask=rows, other=0.0)
        lse = tl.load(lse_ptr + pid.to(tl.int64) * BLOCK_T + r)
        p = tl.exp(tl.where(key_ok[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf")) - lse[:, None])
        dp = tl.dot(do, tl.trans(v))
        if DROPOUT:
            keep = tl.load(keep_base + r[:, None] * T + t[None, :], mask=rows & (t < T)[None, :], other=0) != 0
            dp = tl.where(keep, dp * keep_scale, 0.0)
        delta = tl.sum(p * dp, 1)
        ds = (p * (dp - delta[:, None]) * scale).to(q.dtype)
        dq = tl.dot(ds, k)
        dk += tl.dot(tl.trans(ds), q)
        tl.store(dqkv_ptr + qo, dq.to(ty), mask=rows)
        dq_sum += tl.sum(dq, 0)
    tl.store(dqkv_ptr + kv + H, dk.to(ty), mask=(t < T)[:, None])
    tl.store(sums, dq_sum)
    tl.store(sums + H, tl.sum(dk, 0))


@triton.jit
def _bwd_2pass_r(qkv_ptr, mask_ptr, keep_ptr, o_ptr, do_ptr, lse_ptr, dqkv_ptr, partial_ptr,
               scale: tl.constexpr, keep_scale: tl.constexpr, T: tl.constexpr, nh: tl.constexpr,
               H: tl.constexpr, HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_T: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, STAGES: tl.constexpr):
    # pass 1: dv over query blocks; pass 2: dq and dk. One (T, head_dim) accumulator live at a time.
    pid = tl.program_id(0)
    b, h = pid // nh, pid % nh
    t, d = tl.arange(0, BLOCK_T), tl.arange(0, HEAD_DIM)
    base = b.to(tl.int64) * T * 3 * H + h * HEAD_DIM
    obase = b.to(tl.int64) * T * H + h * HEAD_DIM
    kv = base + t[:, None] * (3 * H) + d[None, :]
    k = tl.load(qkv_ptr + kv + H, mask=(t < T)[:, None], other=0.0)
    v = tl.load(qkv_ptr + kv + 2 * H, mask=(t < T)[:, None], other=0.0)
    keep_base = keep_ptr + pid.to(tl.int64) * T * T
    ty = dqkv_ptr.dtype.element_ty
    dv = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    for i in tl.range(0, BLOCK_T // BLOCK_Q, num_stages=STAGES):
        r = i * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rows = (r < T)[:, None]
        key_ok = t < T
        if HAS_MASK:
            key_ok = key_ok & (tl.load(mask_ptr + b * T + t, mask=t < T, other=0) != 0)
        q = tl.load(qkv_ptr + base + r[:, None] * (3 * H) + d[None, :], mask=rows, other=0.0)
        do = tl.load(do_ptr + obase + r[:, None] * H + d[None, :], mask=rows, other=0.0)
        lse = tl.load(lse_ptr + pid.to(tl.int64) * BLOCK_T + r)
        p = tl.exp(tl.where(key_ok[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf")) - lse[:, None])
        if DROPOUT:
            keep = tl.load(keep_base + r[:, None] * T + t[None, :], mask=rows & (t < T)[None, :], other=0) != 0
            p = tl.where(keep, p * keep_scale, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
    tl.store(dqkv_ptr + kv + 2 * H, dv.to(ty), mask=(t < T)[:, None])
    sums = partial_ptr + b.to(tl.int64) * 3 * H + h * HEAD_DIM + d
    tl.store(sums + 2 * H, tl.sum(dv, 0))
    dk = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    dq_sum = tl.zeros((HEAD_DIM,), tl.float32)
    for i in tl.range(0, BLOCK_T // BLOCK_Q, num_stages=STAGES):
        r = i * BLOCK_Q + tl.arange(0, BLOCK_Q)
        rows = (r < T)[:, None]
        key_ok = t < T
        if HAS_MASK:
            key_ok = key_ok & (tl.load(mask_ptr + b * T + t, mask=t < T, other=0) != 0)
        qo = base + r[:, None] * (3 * H) + d[None, :]
        q = tl.load(qkv_ptr + qo, mask=rows, other=0.0)
        do = tl.load(do_ptr + obase + r[:, None] * H + d[None, :], mask=rows, other=0.0)
        lse = tl.load(lse_ptr + pid.to(tl.int64) * BLOCK_T + r)
        p = tl.exp(tl.where(key_ok[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf")) - lse[:, None])
        dp = tl.dot(do, tl.trans(v))
        if DROPOUT:
            keep = tl.load(keep_base + r[:, None] * T + t[None, :], mask=rows & (t < T)[None, :], other=0) != 0
            dp = tl.where(keep, dp * keep_scale, 0.0)
        delta = tl.sum(p * dp, 1)
        ds = (p * (dp - delta[:, None]) * scale).to(q.dtype)
        dq = tl.dot(ds, k)
        dk += tl.dot(tl.trans(ds), q)
        tl.store(dqkv_ptr + qo, dq.to(ty), mask=rows)
        dq_sum += tl.sum(dq, 0)
    tl.store(dqkv_ptr + kv + H, dk.to(ty), mask=(t < T)[:, None])
    tl.store(sums, dq_sum)
    tl.store(sums + H, tl.sum(dk, 0))


def reference(qkv, mask, keep, do, B, T, nh, p):
    H = qkv.shape[1] // 3
    hd = H // nh
    x = qkv.double().detach().requires_grad_()
    q, k, v = x.view(B, T, 3, nh, hd).permute(2, 0, 3, 1, 4)
    s = q @ k.transpose(-1, -2) * hd ** -0.5
    if mask is not None:
        s = s.masked_fill(~mask.view(B, 1, 1, T), float("-inf"))
    pr = s.softmax(-1)
    if p > 0:
        pr = pr * keep.view(B, nh, T, T) / (1 - p)
    o = (pr @ v).transpose(1, 2).reshape(B * T, H)
    (dqkv,) = torch.autograd.grad(o, x, do.double())
    return o, dqkv, dqkv.view(B, T, 3 * H).sum(1)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def run_case(B, T, nh, hd, drop, with_mask, timing, rows_out):
    H = nh * hd
    torch.manual_seed(T * 7 + B)
    qkv = torch.randn(B * T, 3 * H, device="cuda").bfloat16()
    do = torch.randn(B * T, H, device="cuda").bfloat16()
    mask = None
    if with_mask:
        lengths = torch.randint(T // 3, T + 1, (B,), device="cuda")
        mask = torch.arange(T, device="cuda")[None, :] < lengths[:, None]
    seed = torch.tensor([1234], device="cuda")
    meta = sat._meta(qkv, mask, T, nh, drop)
    BT = meta["BLOCK_T"]
    o, lse, keep = sat.attention_fwd(qkv, mask, seed, B, T, nh, drop)
    ro, rd, rp = reference(qkv, mask, keep, do, B, T, nh, drop)
    case = f"B{B} T{T} nh{nh} hd{hd} p{drop} mask{int(with_mask)}"
    mptr = qkv if mask is None else mask
    kptr = keep if drop > 0 else qkv

    def launch_fwd(kern, extra, warps):
        o2 = torch.full_like(o, float("nan"))
        lse2 = torch.full_like(lse, float("nan"))
        def go():
            return kern[(B * nh,)](qkv, mptr, kptr, o2, lse2, **meta | extra | {"num_warps": warps})
        return go, o2, lse2

    def launch_bwd(kern, extra, warps):
        d2 = torch.full_like(qkv, float("nan"))
        p2 = torch.full((B, 3 * H), float("nan"), device="cuda")
        def go():
            return kern[(B * nh,)](qkv, mptr, kptr, o, do, lse, d2, p2, **meta | extra | {"num_warps": warps})
        return go, d2, p2

    variants = [("fwd", "fwd shipped", sat._attention_fwd, {}, 8)]
    if os.environ.get("MASKED_ONLY"):
        variants += [("fwds", "fwd split64 w4", _fwd_split, {"BLOCK": 64}, 4), ("bwd", "bwd shipped", sat._attention_bwd, {}, 8),
                     ("bwd", "bwd 2pass64 w4 st1", _bwd_2pass, {"BLOCK_Q": 64, "STAGES": 1}, 4),
                     ("bwd", "bwd 2pass_r64 w4 st1", _bwd_2pass_r, {"BLOCK_Q": 64, "STAGES": 1}, 4),
                     ("bwd", "bwd no-o w8", _bwd_noo, {}, 8)] * 2
    for w in (4, 8):
        for bl in (32, 64):
            variants.append(("fwds", f"fwd split{bl} w{w}", _fwd_split, {"BLOCK": bl}, w))
    variants.append(("bwd", "bwd shipped", sat._attention_bwd, {}, 8))
    for w in (4, 8):
        for bq in (32, 64):
            for st in (1, 2):
                variants.append(("bwd", f"bwd 2pass{bq} w{w} st{st}", _bwd_2pass, {"BLOCK_Q": bq, "STAGES": st}, w))
    variants.append(("bwd", "bwd qloop32 w4 readO0 unroll0 st1", _bwd_q, {"BLOCK_Q": 32, "READ_O": False, "UNROLL": False, "num_stages": 1}, 4))
    variants.append(("bwd", "bwd no-o w8", _bwd_noo, {}, 8))
    variants.append(("bwd", "bwd no-o w4", _bwd_noo, {}, 4))
    variants.append(("bwd", "bwd qloop32 w4 readO0 unroll0", _bwd_q, {"BLOCK_Q": 32, "READ_O": False, "UNROLL": False}, 4))
    def launch_fwds(kern, extra, warps):
        o2 = torch.full_like(o, float("nan"))
        lse2 = torch.full_like(lse, float("nan"))
        nb = BT // extra["BLOCK"]
        def go():
            return kern[(B * nh * nb,)](qkv, mptr, kptr, o2, lse2, **meta | extra | {"num_warps": warps})
        return go, o2, lse2

    def launch_bwds(kern, extra, warps):
        d2 = torch.full_like(qkv, float("nan"))
        nb = BT // extra["BLOCK"]
        p2 = torch.full((nb, B, 3 * H), float("nan"), device="cuda")
        def go():
            return kern[(B * nh * 2 * nb,)](qkv, mptr, kptr, o, do, lse, d2, p2, **meta | extra | {"num_warps": warps})
        return go, d2, p2

    for kind, name, kern, extra, warps in variants:
        if extra.get("BLOCK_Q", 0) > BT or extra.get("BLOCK", 0) > BT:
            continue
        try:
            if kind.startswith("fwd"):
                go, o2, lse2 = (launch_fwd if kind == "fwd" else launch_fwds)(kern, extra, warps)
                ck = go()
                torch.cuda.synchronize()
                valid = torch.arange(BT, device="cuda") < T
                err = max(rel(o2, ro), rel(lse2[:, valid], lse[:, valid]) if True else 0)
                nan = bool(torch.isnan(o2).any() or torch.isnan(lse2[:, valid]).any())
            else:
                go, d2, p2 = (launch_bwd if kind == "bwd" else launch_bwds)(kern, extra, warps)
                ck = go()
                torch.cuda.synchronize()
                p2s = p2.sum(0) if kind == "bwd" else p2.sum((0, 1))
                err = max(rel(d2, rd), rel(p2s, rp.sum(0)))
                nan = bool(torch.isnan(d2).any() or torch.isnan(p2).any())
            ms = bench(go) if timing else float("nan")
            regs, spills = getattr(ck, "n_regs", -1), getattr(ck, "n_spills", -1)
            row = dict(case=case, variant=name, err=err, nan=nan, ms=ms, regs=regs, spills=spills)
        except Exception as e:  # noqa: BLE001
            row = dict(case=case, variant=name, error=repr(e)[-700:])
        rows_out.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), triton.__version__, torch.__version__, flush=True)
    rows = []
    if os.environ.get("MASKED_ONLY"):
        run_case(256, 128, 12, 64, 0.1, True, True, rows)
        run_case(256, 128, 12, 64, 0.1, False, True, rows)
        for r in rows:
            print(f"{r['case']} {r['variant']:40s} {r.get('ms', float('nan')):.4f} ms err {r.get('err', -1):.2e} {r.get('error', '')[:100]}")
        sys.exit()
    run_case(8, 100, 4, 64, 0.1, True, False, rows)
    run_case(8, 128, 4, 32, 0.0, True, False, rows)
    run_case(16, 64, 4, 64, 0.1, False, False, rows)
    run_case(256, 128, 12, 64, 0.1, False, True, rows)
    out = os.environ.get("OUT", ".")
    json.dump(rows, open(f"{out}/sweep.json", "w"), indent=1)
    print("\nSUMMARY (B256 T128):")
    for r in rows:
        if r["case"].startswith("B256"):
            print(f"{r['variant']:40s} {r.get('ms', float('nan')):.4f} ms err {r.get('err', -1):.2e} regs {r.get('regs')} spills {r.get('spills')} {r.get('error', '')}")
    bad = [r for r in rows if r.get("nan") or r.get("err", 0) > 2e-2 or "error" in r]
    print("BAD:", [(r["case"], r["variant"], r.get("err"), r.get("error", "")[:80]) for r in bad])
