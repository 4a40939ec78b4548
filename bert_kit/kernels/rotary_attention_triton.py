"""Triton kernels behind `bert_kit.kernels.rotary_attention`: ModernBERT's rotations, its attention
for sequences of up to 128 tokens with the rotations and the sliding window inside, and its sliding
window layers' attention with the rotations inside for sequences of any length.

Imported only by `rotary_attention.py`, which `fast_path` imports only for a CUDA run in 16 bits:
importing Triton loads torch._inductor, seconds that other commands should not pay.

Rotary embeddings turn the pair (x_j, x_{j + hd/2}) of each head by the angle of the token's position:
the two halves x1, x2 become (x1 c - x2 s, x2 c + x1 s), in float32, rounded to the input's dtype,
as `bert_kit.modernbert.apply_rotary` computes them. cos and sin come per token (N, hd) as the model
computes them (the two halves of a row are equal; the kernels read the first).

- `rotate_qk(qkv, cos, sin, nh)`: q and k turned in one pass over the QKV projection's (N, 3H)
  output, for flash attention (eager inference: the reference's rotation is ten elementwise passes).
- `attention_fwd` / `attention_bwd`: attention within each packed sequence of at most 128 tokens,
  as BERT's short attention (`short_attention_triton.py`, whose layout and settings these follow):
  all of a head's keys fit one tile, so the softmax needs no running maximum and the backward no
  atomics and no dot(dO, O) pre-pass. q and k are read from the QKV output and turned in registers,
  their turned halves joined back into whole heads, so that every dot spans a head's full width
  (scores are one dot over all of it; dots over the 32-wide halves read shared memory out of bounds
  on an H200). A query sees the keys of its own sequence within WINDOW positions (-1: all of
  them), and dq, dk, dv are written straight into the QKV projection's gradient, dq and dk split
  into halves and turned back (the transpose of the rotation). What this spares against flash
  varlen: the rotations' forward and backward passes over q and k, the assembly of the QKV
  gradient, flash's dot(dO, O) pre-pass and float32 dq accumulator.

The forward runs one program per (sequence, head, block of 64 queries), the backward one per
(sequence, head) in two passes over its query blocks (dv; then dq and dk), or one where the queries
are one block; sequences are the packed layout's (cu_seqlens), so padded rows packed by rows (a row's
tokens, then its padding) and sequences of any length up to 128 take the same kernels. Sizes, the
window and the scale are constexpr (inductor passes plain ints without divisibility hints and floats
as float64, 4-6x slower for BERT's kernels); the token count is not, so eager calls of new sizes
compile nothing.

- `window_fwd` / `window_bwd`: a sliding-window layer's attention over sequences of any length. A
  block of 64 queries sees at most 64 + 2 x window keys: 3 tiles of 64 at ModernBERT's window of 64,
  whatever the length (flash attention's windowed kernel took as long at 512 tokens as its global
  one). q and k are turned once (`rotate_qk`'s kernel) and kept for the backward; the forward keeps
  a running maximum over the tiles, as flash attention does. The backward is two kernels on the
  forward's grid: one per query block writes its dq, turned back, and its rows' dot(dO, O); one per
  key block its dk (turned back) and dv, computed keys-first as in Triton's fused-attention tutorial.
  No atomics: a run repeats bit for bit. A (sequence, head)'s blocks run on neighbouring programs of
  the grid's one axis: they share key tiles in L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_Q = 64  # queries per tile (fewer when the longest sequence is shorter)
WINDOW_BLOCK = 64  # queries (and keys) per tile of the window kernels: cdiv(64 + 2 x window, 64) key tiles each
WINDOW_WARPS = 4  # at head size 64 (128: 8); 8 warps took 1.4-1.6x as long on an H200
ROTATE_ROWS = 64  # tokens per program of `rotate_qk`


@triton.jit
def _turned(x_ptr, cos_ptr, sin_ptr, tok, ok, d, ROW: tl.constexpr, CS: tl.constexpr, HALF: tl.constexpr):
    """Rows `tok` (int64) of one head's vectors (x_ptr: its first column; ROW: the row stride), turned:
    (BLOCK, 2 * HALF) in x's dtype, the halves (x1 c - x2 s, x2 c + x1 s) side by side; rows not `ok`
    are 0."""
    m = ok[:, None]
    x1 = tl.load(x_ptr + tok[:, None] * ROW + d[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + tok[:, None] * ROW + HALF + d[None, :], mask=m, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + tok[:, None] * CS + d[None, :], mask=m, other=0.0)
    s = tl.load(sin_ptr + tok[:, None] * CS + d[None, :], mask=m, other=0.0)
    ty = x_ptr.dtype.element_ty
    halves = tl.join((x1 * c - x2 * s).to(ty), (x2 * c + x1 * s).to(ty))  # (BLOCK, HALF, 2)
    return tl.reshape(tl.permute(halves, (0, 2, 1)), (x1.shape[0], 2 * HALF))


@triton.jit
def _store_turned_back(out_ptr, g, cos_ptr, sin_ptr, tok, ok, d, ROW: tl.constexpr, CS: tl.constexpr,
                       HALF: tl.constexpr):
    """The gradient g (BLOCK, 2 * HALF), float32, of turned rows, turned back (the rotation's transpose:
    halves g1 c + g2 s, g2 c - g1 s), stored at rows `tok` of out_ptr (row stride ROW) where `ok`."""
    g1, g2 = tl.split(tl.permute(tl.reshape(g, (g.shape[0], 2, HALF)), (0, 2, 1)))  # g's column halves
    m = ok[:, None]
    c = tl.load(cos_ptr + tok[:, None] * CS + d[None, :], mask=m, other=0.0)
    s = tl.load(sin_ptr + tok[:, None] * CS + d[None, :], mask=m, other=0.0)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + tok[:, None] * ROW + d[None, :], (g1 * c + g2 * s).to(ty), mask=m)
    tl.store(out_ptr + tok[:, None] * ROW + HALF + d[None, :], (g2 * c - g1 * s).to(ty), mask=m)


@triton.jit
def _rotate_qk(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, N, H: tl.constexpr, CS: tl.constexpr,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    # qkv: (N, 3H), columns [q heads | k heads | v heads]; q, k: (N, H); grid (cdiv(N, BLOCK_N), nh)
    HALF: tl.constexpr = HEAD_DIM // 2
    h = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok, tok, d, e = rows < N, rows.to(tl.int64), tl.arange(0, HALF), tl.arange(0, HEAD_DIM)
    out = tok[:, None] * H + h * HEAD_DIM + e[None, :]
    tl.store(q_ptr + out, _turned(qkv_ptr + h * HEAD_DIM, cos_ptr, sin_ptr, tok, ok, d, 3 * H, CS, HALF),
             mask=ok[:, None])
    tl.store(k_ptr + out, _turned(qkv_ptr + H + h * HEAD_DIM, cos_ptr, sin_ptr, tok, ok, d, 3 * H, CS, HALF),
             mask=ok[:, None])


@triton.jit
def _visible(r, t, L, WINDOW: tl.constexpr):
    """(BLOCK_Q, BLOCK_T) bool: query r sees key t: both in the sequence, and within WINDOW (-1: all)."""
    ok = (r < L)[:, None] & (t < L)[None, :]
    if WINDOW >= 0:
        ok = ok & (tl.abs(r[:, None] - t[None, :]) <= WINDOW)
    return ok


@triton.jit
def _sequence(cu_ptr, seq):
    start = tl.load(cu_ptr + seq)
    return start, tl.load(cu_ptr + seq + 1) - start


@triton.jit
def _attention_fwd(qkv_ptr, cos_ptr, sin_ptr, cu_ptr, o_ptr, lse_ptr, scale: tl.constexpr, WINDOW: tl.constexpr,
                   nh: tl.constexpr, H: tl.constexpr, CS: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr):
    # qkv: (N, 3H); cos, sin: (N, CS) float32; cu: (S + 1,) int32; o: (N, H); lse: (N, nh) float32
    HALF: tl.constexpr = HEAD_DIM // 2
    pid = tl.program_id(0)
    sh, block = pid // (BLOCK_T // BLOCK_Q), pid % (BLOCK_T // BLOCK_Q)
    seq, h = sh // nh, sh % nh
    start, L = _sequence(cu_ptr, seq)
    if block * BLOCK_Q >= L:  # past the sequence's end (an empty sequence has no block)
        return
    t, d, e = tl.arange(0, BLOCK_T), tl.arange(0, HALF), tl.arange(0, HEAD_DIM)
    r = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    tk, tq = (start + t).to(tl.int64), (start + r).to(tl.int64)
    head = qkv_ptr + h * HEAD_DIM
    k = _turned(head + H, cos_ptr, sin_ptr, tk, t < L, d, 3 * H, CS, HALF)
    q = _turned(head, cos_ptr, sin_ptr, tq, r < L, d, 3 * H, CS, HALF)
    v = tl.load(head + 2 * H + tk[:, None] * (3 * H) + e[None, :], mask=(t < L)[:, None], other=0.0)
    s = tl.where(_visible(r, t, L, WINDOW), tl.dot(q, tl.trans(k)) * scale, float("-inf"))
    rows = r < L
    m = tl.where(rows, tl.max(s, 1), 0.0)  # a row past the end sees no key: kept finite, never stored
    p = tl.exp(s - m[:, None])
    total = tl.where(rows, tl.sum(p, 1), 1.0)
    o = tl.dot((p / total[:, None]).to(v.dtype), v)
    tl.store(o_ptr + tq[:, None] * H + h * HEAD_DIM + e[None, :], o.to(o_ptr.dtype.element_ty), mask=rows[:, None])
    tl.store(lse_ptr + tq * nh + h, m + tl.log(total), mask=rows)


@triton.jit
def _probs(q, k, lse_ptr, tq, r, t, L, h, scale: tl.constexpr, WINDOW: tl.constexpr, nh: tl.constexpr):
    """A query block's softmax probabilities (BLOCK_Q, BLOCK_T), float32, rebuilt from the forward's
    logsumexp; 0 where the query does not see the key."""
    lse = tl.load(lse_ptr + tq * nh + h, mask=r < L, other=0.0)
    return tl.where(_visible(r, t, L, WINDOW), tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None]), 0.0)


@triton.jit
def _dq_dk(p, do, v, k, q, scale: tl.constexpr):
    """A query block's dq (BLOCK_Q, HEAD_DIM) and its term of dk (BLOCK_T, HEAD_DIM), float32, with
    respect to the turned q and k: dS = P * (dP - rowsum(P * dP)), dP = dO V^T (every key of a query is
    in the tile, so rowsum(P * dP) is dot(dO, O))."""
    dp = tl.dot(do, tl.trans(v))
    ds = (p * (dp - tl.sum(p * dp, 1)[:, None]) * scale).to(q.dtype)
    return tl.dot(ds, k), tl.dot(tl.trans(ds), q)


@triton.jit
def _attention_bwd(qkv_ptr, cos_ptr, sin_ptr, cu_ptr, do_ptr, lse_ptr, dqkv_ptr, scale: tl.constexpr,
                   WINDOW: tl.constexpr, nh: tl.constexpr, H: tl.constexpr, CS: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr):
    # dqkv: (N, 3H) like qkv, every row written (a token is in one sequence); do: (N, H)
    HALF: tl.constexpr = HEAD_DIM // 2
    sh = tl.program_id(0)
    seq, h = sh // nh, sh % nh
    start, L = _sequence(cu_ptr, seq)
    if L <= 0:
        return
    t, d, e = tl.arange(0, BLOCK_T), tl.arange(0, HALF), tl.arange(0, HEAD_DIM)
    tk = (start + t).to(tl.int64)
    head = qkv_ptr + h * HEAD_DIM
    k = _turned(head + H, cos_ptr, sin_ptr, tk, t < L, d, 3 * H, CS, HALF)
    v = tl.load(head + 2 * H + tk[:, None] * (3 * H) + e[None, :], mask=(t < L)[:, None], other=0.0)
    dhead = dqkv_ptr + h * HEAD_DIM

    dv = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    dk = tl.zeros((BLOCK_T, HEAD_DIM), tl.float32)
    for block in tl.range(0, BLOCK_T // BLOCK_Q, num_stages=1):  # pass 1: dv = P^T dO
        r = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
        tq = (start + r).to(tl.int64)
        q = _turned(head, cos_ptr, sin_ptr, tq, r < L, d, 3 * H, CS, HALF)
        do = tl.load(do_ptr + tq[:, None] * H + h * HEAD_DIM + e[None, :], mask=(r < L)[:, None], other=0.0)
        p = _probs(q, k, lse_ptr, tq, r, t, L, h, scale, WINDOW, nh)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        if BLOCK_Q == BLOCK_T:  # a single block: pass 2 here too, without computing P again
            dq, dk_part = _dq_dk(p, do, v, k, q, scale)
            dk += dk_part
            _store_turned_back(dhead, dq, cos_ptr, sin_ptr, tq, r < L, d, 3 * H, CS, HALF)
    tl.store(dhead + 2 * H + tk[:, None] * (3 * H) + e[None, :], dv.to(dqkv_ptr.dtype.element_ty),
             mask=(t < L)[:, None])

    if BLOCK_Q < BLOCK_T:
        for block in tl.range(0, BLOCK_T // BLOCK_Q, num_stages=1):  # pass 2: dq and dk
            r = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
            tq = (start + r).to(tl.int64)
            q = _turned(head, cos_ptr, sin_ptr, tq, r < L, d, 3 * H, CS, HALF)
            do = tl.load(do_ptr + tq[:, None] * H + h * HEAD_DIM + e[None, :], mask=(r < L)[:, None], other=0.0)
            p = _probs(q, k, lse_ptr, tq, r, t, L, h, scale, WINDOW, nh)
            dq, dk_part = _dq_dk(p, do, v, k, q, scale)
            dk += dk_part
            _store_turned_back(dhead, dq, cos_ptr, sin_ptr, tq, r < L, d, 3 * H, CS, HALF)
    _store_turned_back(dhead + H, dk, cos_ptr, sin_ptr, tk, t < L, d, 3 * H, CS, HALF)


@triton.jit
def _block_of(cu_ptr, blocks, nh: tl.constexpr):
    """(head, block, the sequence's first token, its length) of this program: a (sequence, head)'s
    blocks on neighbouring programs, which share key tiles in L2."""
    pid = tl.program_id(0)
    sh = pid // blocks
    start, L = _sequence(cu_ptr, sh // nh)
    return sh % nh, pid % blocks, start, L


@triton.jit
def _window_tile(block, j, start, L, BLOCK: tl.constexpr, WINDOW: tl.constexpr):
    """The j-th tile of positions that a block's window reaches, from WINDOW before its first: the
    positions, whether each is in the sequence, and their token rows (int64). (A block's own rows
    need no lower bound: kept apart, they compile to fewer instructions.)"""
    pos = block * BLOCK - WINDOW + j * BLOCK + tl.arange(0, BLOCK)
    return pos, (pos >= 0) & (pos < L), (start + pos).to(tl.int64)


@triton.jit
def _within(a, a_ok, b, b_ok, WINDOW: tl.constexpr):
    """(len(a), len(b)) bool: positions a and b both in the sequence and at most WINDOW apart."""
    return a_ok[:, None] & b_ok[None, :] & (tl.abs(a[:, None] - b[None, :]) <= WINDOW)


@triton.jit
def _rows_of(ptr, tok, ok, e, ROW: tl.constexpr):
    """Rows `tok` of one head's vectors (ptr: its first column; ROW: the row stride), 0 where not `ok`."""
    return tl.load(ptr + tok[:, None] * ROW + e[None, :], mask=ok[:, None], other=0.0)


@triton.jit
def _window_fwd(q_ptr, k_ptr, qkv_ptr, cu_ptr, o_ptr, lse_ptr, blocks, scale: tl.constexpr, WINDOW: tl.constexpr,
                nh: tl.constexpr, H: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    # q, k: (N, H) turned; v in qkv (N, 3H); grid (S * nh * blocks,), `blocks` query blocks of the
    # longest sequence; a block's keys in SPAN tiles from WINDOW before its first query, with a running
    # maximum and sum over them (flash attention's)
    SPAN: tl.constexpr = (2 * BLOCK + 2 * WINDOW - 1) // BLOCK
    h, block, start, L = _block_of(cu_ptr, blocks, nh)
    if block * BLOCK >= L:
        return
    e = tl.arange(0, HEAD_DIM)
    r = block * BLOCK + tl.arange(0, BLOCK)
    rows, tq = r < L, (start + r).to(tl.int64)
    q = _rows_of(q_ptr + h * HEAD_DIM, tq, rows, e, H)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK,), tl.float32)
    acc = tl.zeros((BLOCK, HEAD_DIM), tl.float32)
    for j in tl.static_range(SPAN):
        t, keys, tk = _window_tile(block, j, start, L, BLOCK, WINDOW)
        k = _rows_of(k_ptr + h * HEAD_DIM, tk, keys, e, H)
        v = _rows_of(qkv_ptr + 2 * H + h * HEAD_DIM, tk, keys, e, 3 * H)
        seen = _within(r, rows, t, keys, WINDOW)
        s = tl.where(seen, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        new = tl.maximum(m, tl.max(s, 1))
        base = tl.where(new == float("-inf"), 0.0, new)  # a row that has seen no key yet
        p = tl.exp(s - base[:, None])
        fade = tl.exp(m - base)
        total = total * fade + tl.sum(p, 1)
        acc = acc * fade[:, None] + tl.dot(p.to(v.dtype), v)
        m = new
    total = tl.where(rows, total, 1.0)  # every real query sees itself
    tl.store(o_ptr + tq[:, None] * H + h * HEAD_DIM + e[None, :], (acc / total[:, None]).to(o_ptr.dtype.element_ty),
             mask=rows[:, None])
    tl.store(lse_ptr + tq * nh + h, m + tl.log(total), mask=rows)


@triton.jit
def _window_bwd_dq(q_ptr, k_ptr, qkv_ptr, cos_ptr, sin_ptr, cu_ptr, o_ptr, do_ptr, lse_ptr, delta_ptr, dqkv_ptr,
                   blocks, scale: tl.constexpr, WINDOW: tl.constexpr, nh: tl.constexpr, H: tl.constexpr,
                   CS: tl.constexpr, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    # the forward's grid over query blocks: a block's dq over the SPAN key tiles it sees, turned back
    # into dqkv's q part; and its rows' delta = rowsum(dO * O) (N, nh) float32, for `_window_bwd_dkdv`
    HALF: tl.constexpr = HEAD_DIM // 2
    SPAN: tl.constexpr = (2 * BLOCK + 2 * WINDOW - 1) // BLOCK
    h, block, start, L = _block_of(cu_ptr, blocks, nh)
    if block * BLOCK >= L:
        return
    d, e = tl.arange(0, HALF), tl.arange(0, HEAD_DIM)
    r = block * BLOCK + tl.arange(0, BLOCK)
    rows, tq = r < L, (start + r).to(tl.int64)
    q = _rows_of(q_ptr + h * HEAD_DIM, tq, rows, e, H)
    do = _rows_of(do_ptr + h * HEAD_DIM, tq, rows, e, H)
    delta = tl.sum(do.to(tl.float32) * _rows_of(o_ptr + h * HEAD_DIM, tq, rows, e, H).to(tl.float32), 1)
    tl.store(delta_ptr + tq * nh + h, delta, mask=rows)
    lse = tl.load(lse_ptr + tq * nh + h, mask=rows, other=0.0)
    dq = tl.zeros((BLOCK, HEAD_DIM), tl.float32)
    for j in tl.static_range(SPAN):
        t, keys, tk = _window_tile(block, j, start, L, BLOCK, WINDOW)
        k = _rows_of(k_ptr + h * HEAD_DIM, tk, keys, e, H)
        v = _rows_of(qkv_ptr + 2 * H + h * HEAD_DIM, tk, keys, e, 3 * H)
        seen = _within(r, rows, t, keys, WINDOW)
        p = tl.where(seen, tl.exp(tl.dot(q, tl.trans(k)) * scale - lse[:, None]), 0.0)  # (queries, keys)
        ds = (p * (tl.dot(do, tl.trans(v)) - delta[:, None]) * scale).to(q.dtype)
        dq += tl.dot(ds, k)
    _store_turned_back(dqkv_ptr + h * HEAD_DIM, dq, cos_ptr, sin_ptr, tq, rows, d, 3 * H, CS, HALF)


@triton.jit
def _window_bwd_dkdv(q_ptr, k_ptr, qkv_ptr, cos_ptr, sin_ptr, cu_ptr, do_ptr, lse_ptr, delta_ptr, dqkv_ptr, blocks,
                     scale: tl.constexpr, WINDOW: tl.constexpr, nh: tl.constexpr, H: tl.constexpr, CS: tl.constexpr,
                     BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    # the same grid over key blocks: a block's dk and dv over the SPAN query tiles that see it, written
    # into dqkv's k part (turned back) and v part. Computed keys-first (P^T = K Q^T), as Triton's
    # fused-attention tutorial does, so that P^T and dS^T feed their dots without transposes
    HALF: tl.constexpr = HEAD_DIM // 2
    SPAN: tl.constexpr = (2 * BLOCK + 2 * WINDOW - 1) // BLOCK
    h, block, start, L = _block_of(cu_ptr, blocks, nh)
    if block * BLOCK >= L:
        return
    d, e = tl.arange(0, HALF), tl.arange(0, HEAD_DIM)
    t = block * BLOCK + tl.arange(0, BLOCK)
    keys, tk = t < L, (start + t).to(tl.int64)
    k = _rows_of(k_ptr + h * HEAD_DIM, tk, keys, e, H)
    v = _rows_of(qkv_ptr + 2 * H + h * HEAD_DIM, tk, keys, e, 3 * H)
    dk = tl.zeros((BLOCK, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK, HEAD_DIM), tl.float32)
    for j in tl.static_range(SPAN):
        r, rows, tq = _window_tile(block, j, start, L, BLOCK, WINDOW)
        qT = tl.load(q_ptr + h * HEAD_DIM + tq[None, :] * H + e[:, None], mask=rows[None, :], other=0.0)
        do = _rows_of(do_ptr + h * HEAD_DIM, tq, rows, e, H)
        lse = tl.load(lse_ptr + tq * nh + h, mask=rows, other=0.0)
        delta = tl.load(delta_ptr + tq * nh + h, mask=rows, other=0.0)
        seen = _within(t, keys, r, rows, WINDOW)
        pT = tl.where(seen, tl.exp(tl.dot(k, qT) * scale - lse[None, :]), 0.0)  # (keys, queries)
        dv += tl.dot(pT.to(do.dtype), do)
        dsT = (pT * (tl.dot(v, tl.trans(do)) - delta[None, :]) * scale).to(k.dtype)
        dk += tl.dot(dsT, tl.trans(qT))
    dhead = dqkv_ptr + h * HEAD_DIM
    tl.store(dhead + 2 * H + tk[:, None] * (3 * H) + e[None, :], dv.to(dqkv_ptr.dtype.element_ty), mask=keys[:, None])
    _store_turned_back(dhead + H, dk, cos_ptr, sin_ptr, tk, keys, d, 3 * H, CS, HALF)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """cos or sin, (N, hd) or (N, 1, hd), as (N, hd) with unit column stride."""
    t = t.reshape(t.shape[0], -1)
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.triton_op("bert_kit::rotate_qk", mutates_args=())
def rotate_qk(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, nh: int) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv (N, 3H) contiguous, cos and sin (N, hd) float32 -> q, k turned, (N, nh, hd) each, in qkv's dtype."""
    return _turn_qk(qkv, cos, sin, nh)


def _turn_qk(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, nh: int) -> tuple[torch.Tensor, torch.Tensor]:
    N, H = qkv.shape[0], qkv.shape[1] // 3
    cos, sin = _rows(cos), _rows(sin)
    q, k = qkv.new_empty(N, nh, H // nh), qkv.new_empty(N, nh, H // nh)
    if N:
        torch.library.wrap_triton(_rotate_qk)[(triton.cdiv(N, ROTATE_ROWS), nh)](
            qkv, cos, sin, q, k, N, H=H, CS=cos.stride(0), BLOCK_N=ROTATE_ROWS, HEAD_DIM=H // nh, num_warps=4)
    return q, k


def _meta(qkv: torch.Tensor, cos: torch.Tensor, max_seqlen: int, nh: int, window: int, backward: bool = False) -> dict:
    H = qkv.shape[1] // 3
    hd = H // nh
    block = max(16, triton.next_power_of_2(max_seqlen))
    meta = dict(scale=hd ** -0.5, WINDOW=window, nh=nh, H=H, CS=cos.stride(0), BLOCK_T=block,
                BLOCK_Q=min(BLOCK_Q, block), HEAD_DIM=hd, num_warps=4)
    if backward and hd > 64:  # (T, 128) accumulators spill at 4 warps: one block of 8 warps (as BERT's)
        meta.update(BLOCK_Q=block, num_warps=8)
    return meta


@torch.library.triton_op("bert_kit::rotary_attention_fwd", mutates_args=())
def attention_fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                  nh: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv (N, 3H) contiguous, cos and sin (N, hd) float32, cu_seqlens (S + 1,) int32 of sequences of at
    most max_seqlen <= 128 tokens, window (-1: none) -> o (N, H) in qkv's dtype, lse (N, nh) float32."""
    cos, sin = _rows(cos), _rows(sin)
    meta = _meta(qkv, cos, max_seqlen, nh, window)
    N = qkv.shape[0]
    o = qkv.new_empty(N, meta["H"])
    lse = qkv.new_empty(N, nh, dtype=torch.float32)
    S = cu_seqlens.shape[0] - 1
    if N and S:
        grid = (S * nh * (meta["BLOCK_T"] // meta["BLOCK_Q"]),)
        torch.library.wrap_triton(_attention_fwd)[grid](qkv, cos, sin, cu_seqlens, o, lse, **meta)
    return o, lse


@torch.library.triton_op("bert_kit::rotary_attention_bwd", mutates_args=())
def attention_bwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: torch.Tensor, do: torch.Tensor,
                  lse: torch.Tensor, max_seqlen: int, nh: int, window: int) -> torch.Tensor:
    """The forward's inputs, its lse, do (N, H) contiguous -> dqkv (N, 3H): the gradient with respect
    to qkv (dq and dk through the rotation)."""
    cos, sin = _rows(cos), _rows(sin)
    meta = _meta(qkv, cos, max_seqlen, nh, window, backward=True)
    dqkv = torch.empty_like(qkv)
    S = cu_seqlens.shape[0] - 1
    if qkv.shape[0] and S:
        torch.library.wrap_triton(_attention_bwd)[(S * nh,)](qkv, cos, sin, cu_seqlens, do, lse, dqkv, **meta)
    return dqkv


def _window_meta(qkv: torch.Tensor, max_seqlen: int, nh: int, window: int) -> tuple[int, dict]:
    """The grid (one program per query or key block of each sequence and head) and the constants."""
    H = qkv.shape[1] // 3
    hd = H // nh
    blocks = triton.cdiv(max_seqlen, WINDOW_BLOCK)
    return blocks, dict(scale=hd ** -0.5, WINDOW=window, nh=nh, H=H, BLOCK=WINDOW_BLOCK, HEAD_DIM=hd,
                        num_warps=WINDOW_WARPS if hd <= 64 else 8)


@torch.library.triton_op("bert_kit::window_attention_fwd", mutates_args=())
def window_fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
               nh: int, window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`attention_fwd` for sequences of any length in a sliding window of 0 <= window positions each
    side (at most `rotary_attention.MAX_WINDOW`: the key tiles are unrolled): qkv (N, 3H), cos and
    sin (N, hd) float32, cu_seqlens (S + 1,) int32 -> o (N, H) in qkv's dtype, lse (N, nh) float32,
    and q and k turned (N, nh, hd) (`rotate_qk`'s, kept for the backward)."""
    q, k = _turn_qk(qkv, cos, sin, nh)
    blocks, meta = _window_meta(qkv, max_seqlen, nh, window)
    N, S = qkv.shape[0], cu_seqlens.shape[0] - 1
    o = qkv.new_empty(N, meta["H"])
    lse = qkv.new_empty(N, nh, dtype=torch.float32)
    if N and S:
        torch.library.wrap_triton(_window_fwd)[(S * nh * blocks,)](q, k, qkv, cu_seqlens, o, lse, blocks, **meta)
    return o, lse, q, k


@torch.library.triton_op("bert_kit::window_attention_bwd", mutates_args=())
def window_bwd(qkv: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               cu_seqlens: torch.Tensor, o: torch.Tensor, do: torch.Tensor, lse: torch.Tensor, max_seqlen: int, nh: int,
               window: int) -> torch.Tensor:
    """The forward's inputs and outputs, do (N, H) contiguous -> dqkv (N, 3H), as `attention_bwd`'s:
    one kernel over query blocks writes dq (and each query's rowsum(dO * O)), one over key blocks
    dk and dv. Nothing is accumulated across programs: runs repeat bit for bit."""
    cos, sin = _rows(cos), _rows(sin)
    blocks, meta = _window_meta(qkv, max_seqlen, nh, window)
    N, S = qkv.shape[0], cu_seqlens.shape[0] - 1
    dqkv = torch.empty_like(qkv)
    delta = torch.empty(N, nh, device=qkv.device, dtype=torch.float32)
    if N and S:
        grid = (S * nh * blocks,)
        torch.library.wrap_triton(_window_bwd_dq)[grid](q, k, qkv, cos, sin, cu_seqlens, o, do, lse, delta, dqkv,
                                                        blocks, CS=cos.stride(0), **meta)
        torch.library.wrap_triton(_window_bwd_dkdv)[grid](q, k, qkv, cos, sin, cu_seqlens, do, lse, delta, dqkv,
                                                          blocks, CS=cos.stride(0), **meta)
    return dqkv
