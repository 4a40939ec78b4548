"""Dropout whose random mask is cheap to draw on the GPU under torch.compile.

Inductor fuses dropout into the residual add and LayerNorm, but draws each element's random number
with its own Philox call (10 rounds for 128 random bits, of which it keeps 32). In BERT-base
pretraining that RNG makes the fused dropout + add + LayerNorm kernel three times slower than its
memory traffic, and hidden dropout costs 5% of the step. Here a Triton kernel draws the keep/drop
mask from all 128 bits of each Philox call, as eight 16-bit draws, and writes it as one byte per
element; the fused kernel then only reads the mask. The keep probability is quantised to 1/65536
(p = 0.1 keeps 0.900009 of the elements, not 0.9).

Everywhere else (CPU, eager mode, no Triton, `register_mask_op` not called) it is `F.dropout`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.fused_backward import import_triton_ops

triton_mask_enabled = True  # switch for measuring against inductor's own dropout
dropout_mask = None  # the custom op, once `register_mask_op` has run


def register_mask_op():
    """Register the Triton mask op (once) and return it, or None without Triton. Call it before
    compiling a model that trains with dropout: importing Triton and registering a `triton_op`
    loads torch._inductor (seconds of start-up), which only compiled runs should pay."""
    global dropout_mask
    if dropout_mask is None:
        ops = import_triton_ops("dropout_triton")
        dropout_mask = ops.dropout_mask if ops is not None else None
    return dropout_mask


class Dropout(nn.Module):
    """`nn.Dropout` (same `p`, same state dict: none) with a cheaper mask when compiled on CUDA."""

    def __init__(self, p: float = 0.1):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if (triton_mask_enabled and dropout_mask is not None and x.is_cuda and self.p < 1.0
                and torch.compiler.is_compiling()):
            seed = torch.randint(2**62, (1,), device=x.device)
            keep = dropout_mask(seed, list(x.shape), self.p)
            return x * keep * (1.0 / (1.0 - self.p))
        return F.dropout(x, self.p, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p}"
