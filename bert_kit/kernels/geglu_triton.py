"""ModernBERT's gated activation as two Triton kernels, as `triton_op`s with their autograd.

Imported only by `geglu.py`, which `fast_path` imports only for a CUDA run in 16 bits.

- `geglu(z)`: z (M, 2I) = [input | gate] -> GELU(input) * gate (M, I);
- its backward: dh (M, I), z -> dz (M, 2I) = [dh * gate * GELU'(input) | dh * GELU(input)].

Each program reads a BLOCK_M x BLOCK_N tile of input and the matching tile of gate once, computes
in float32 and rounds once. GELU is the exact (erf) form, by the cheap Phi of
`fused_backward_triton`. Compiled, inductor wrote the backward as one kernel that also
concatenated the two halves; on an H200 it ran at about a third of the memory's speed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bert_kit.kernels.fused_backward_triton import _normal_cdf

# BLOCK_M rows x BLOCK_N columns of each half per program
FORWARD_SETTINGS = {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 4}
BACKWARD_SETTINGS = {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 4}


@triton.jit
def _geglu_kernel(z_ptr, h_ptr, M, I, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # z: (M, 2I) row-major, h: (M, I)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = (rows[:, None] < M) & (cols[None, :] < I)
    z_offs = rows.to(tl.int64)[:, None] * (2 * I) + cols[None, :]
    a = tl.load(z_ptr + z_offs, mask=inside, other=0.0).to(tl.float32)
    gate = tl.load(z_ptr + z_offs + I, mask=inside, other=0.0).to(tl.float32)
    h = a * _normal_cdf(a) * gate
    tl.store(h_ptr + rows.to(tl.int64)[:, None] * I + cols[None, :], h.to(h_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _geglu_grad_kernel(dh_ptr, z_ptr, dz_ptr, M, I, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # dh: (M, I); z, dz: (M, 2I), all row-major
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = (rows[:, None] < M) & (cols[None, :] < I)
    z_offs = rows.to(tl.int64)[:, None] * (2 * I) + cols[None, :]
    dh = tl.load(dh_ptr + rows.to(tl.int64)[:, None] * I + cols[None, :], mask=inside, other=0.0).to(tl.float32)
    a = tl.load(z_ptr + z_offs, mask=inside, other=0.0).to(tl.float32)
    gate = tl.load(z_ptr + z_offs + I, mask=inside, other=0.0).to(tl.float32)
    cdf = _normal_cdf(a)
    d_act = cdf + a * tl.exp(-0.5 * a * a) * 0.3989422804014327  # d GELU / da = Phi(a) + a * phi(a)
    tl.store(dz_ptr + z_offs, (dh * gate * d_act).to(dz_ptr.dtype.element_ty), mask=inside)
    tl.store(dz_ptr + z_offs + I, (dh * a * cdf).to(dz_ptr.dtype.element_ty), mask=inside)


def _grid(M: int, I: int, settings: dict) -> tuple[int, int]:
    return triton.cdiv(M, settings["BLOCK_M"]), triton.cdiv(I, settings["BLOCK_N"])


@torch.library.triton_op("bert_kit::geglu", mutates_args=())
def geglu(z: torch.Tensor) -> torch.Tensor:
    """z (M, 2I) contiguous, [input | gate] -> GELU(input) * gate (M, I), in z's dtype."""
    M, I = z.shape[0], z.shape[1] // 2
    h = z.new_empty(M, I)
    torch.library.wrap_triton(_geglu_kernel)[_grid(M, I, FORWARD_SETTINGS)](z, h, M, I, **FORWARD_SETTINGS)
    return h


@torch.library.triton_op("bert_kit::geglu_grad", mutates_args=())
def geglu_grad(dh: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """dh (M, I), z (M, 2I), both contiguous -> dz (M, 2I), geglu's input gradient."""
    M, I = dh.shape
    dz = torch.empty_like(z)
    torch.library.wrap_triton(_geglu_grad_kernel)[_grid(M, I, BACKWARD_SETTINGS)](dh, z, dz, M, I,
                                                                                   **BACKWARD_SETTINGS)
    return dz


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, dh):
    (z,) = ctx.saved_tensors
    return geglu_grad(dh.contiguous(), z)


geglu.register_autograd(_backward, setup_context=_setup_context)
