"""Dropout whose random mask is cheap to draw on the GPU under torch.compile.

Inductor fuses dropout into the residual add and LayerNorm, but draws each element's random number
with its own Philox call (10 rounds for 128 random bits, of which it keeps 32). In BERT-base
pretraining that RNG makes the fused dropout + add + LayerNorm kernel three times slower than its
memory traffic, and hidden dropout costs 5% of the step. Here a Triton kernel
(`dropout_triton.py`) draws the keep/drop mask from all 128 bits of each Philox call, as eight
16-bit draws, and writes it as one byte per element; the fused kernel then only reads the mask.
The keep probability is quantised to 1/65536 (p = 0.1 keeps 0.900009 of the elements, not 0.9).

`fast_path.apply` makes the encoder's dropouts `MaskDropout` for compiled training on CUDA;
everywhere else (CPU, eager mode) a `MaskDropout` is `F.dropout`. Importing this module imports
Triton (and torch._inductor, seconds of start-up): only `fast_path` does, and only for such a run.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from bert_kit.kernels.dropout_triton import dropout_mask
except (ImportError, AttributeError):  # no Triton, or a torch without `triton_op`: F.dropout
    dropout_mask = None


class MaskDropout(nn.Dropout):
    """`nn.Dropout` (same `p`, same state dict: none) drawing its mask with the Triton kernel when
    compiled on CUDA."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if dropout_mask is not None and x.is_cuda and self.p < 1.0 and torch.compiler.is_compiling():
            seed = torch.randint(2**62, (1,), device=x.device)
            keep = dropout_mask(seed, list(x.shape), self.p)
            return x * keep * (1.0 / (1.0 - self.p))
        return F.dropout(x, self.p, training=True)
