"""The Triton kernel behind `bert_kit.kernels.dropout`'s mask op, and its registration as a `triton_op`.

Imported only by `dropout.py` and `short_attention_triton.py`, which `fast_path` imports only for
compiled training on CUDA: importing Triton and registering the op loads torch._inductor, seconds
of start-up that other commands should not pay. The kernels live at module level because Triton
resolves the helpers a kernel calls in the module's globals.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # Philox calls per program; each program writes 8 * BLOCK mask bytes


@triton.jit
def _store_two_draws(mask_ptr, idx, bits, n, threshold, BLOCK: tl.constexpr):
    """Two 16-bit draws from 32 random bits: elements idx and idx + BLOCK."""
    tl.store(mask_ptr + idx, (bits & 0xFFFF).to(tl.int32) >= threshold, mask=idx < n)
    tl.store(mask_ptr + idx + BLOCK, (bits >> 16).to(tl.int32) >= threshold, mask=idx + BLOCK < n)


@triton.jit
def _dropout_mask_kernel(seed_ptr, mask_ptr, n, threshold, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    r0, r1, r2, r3 = tl.randint4x(tl.load(seed_ptr), pid * BLOCK + lanes)  # counters unique per call
    base = pid * (8 * BLOCK) + lanes  # coalesced: draw j of every lane fills one BLOCK-long run
    _store_two_draws(mask_ptr, base, r0, n, threshold, BLOCK)
    _store_two_draws(mask_ptr, base + 2 * BLOCK, r1, n, threshold, BLOCK)
    _store_two_draws(mask_ptr, base + 4 * BLOCK, r2, n, threshold, BLOCK)
    _store_two_draws(mask_ptr, base + 6 * BLOCK, r3, n, threshold, BLOCK)


@torch.library.triton_op("bert_kit::dropout_mask", mutates_args=())
def dropout_mask(seed: torch.Tensor, shape: list[int], p: float) -> torch.Tensor:
    """Keep mask (bool, `shape`) with P(keep) = 1 - round(p * 65536) / 65536; seed: (1,) int64 on the GPU."""
    return fill_mask(torch.empty(shape, dtype=torch.bool, device=seed.device), seed, p)


def fill_mask(mask: torch.Tensor, seed: torch.Tensor, p: float) -> torch.Tensor:
    """Write `dropout_mask`'s keep mask into `mask` (contiguous bool) and return it; for other triton_ops."""
    n = mask.numel()
    grid = (triton.cdiv(n, 8 * BLOCK),)
    torch.library.wrap_triton(_dropout_mask_kernel)[grid](seed, mask, n, round(p * 65536), BLOCK=BLOCK)
    return mask
