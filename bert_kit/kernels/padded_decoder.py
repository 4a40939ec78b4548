"""The MLM decoder on a vocabulary padded to a multiple of 64, where the head runs compiled on CUDA.

BERT's 30522-word vocabulary puts every row of the logits and of their gradient at an offset that
is not a multiple of 16 bytes: cuBLAS then runs slower kernels for the decoder's three matmuls and
inductor adds a copy: 1.7 ms of BERT-base pretraining's 45 ms step on an H200, 1.25 ms padded.
The zero rows never reach the output. `fast_path.apply` makes a model's MLM head
`PaddedDecoderMLMHead` when the head runs compiled on CUDA.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.heads import MLMHead


def padded_linear(x: torch.Tensor, linear: nn.Linear, multiple: int = 64) -> torch.Tensor:
    """linear(x) (..., out) computed with out padded to a multiple of `multiple` (zero rows), then cut."""
    pad = -linear.out_features % multiple
    if not pad:
        return linear(x)
    bias = None if linear.bias is None else F.pad(linear.bias, (0, pad))
    return F.linear(x, F.pad(linear.weight, (0, 0, 0, pad)), bias)[..., :linear.out_features]


class PaddedDecoderMLMHead(MLMHead):
    """`MLMHead` whose decoder runs on the padded vocabulary when compiled on CUDA; same parameters."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V)."""
        x = self.norm(self.act(self.dense(hidden)))
        if torch.compiler.is_compiling() and x.is_cuda:
            return padded_linear(x, self.decoder)
        return self.decoder(x)
