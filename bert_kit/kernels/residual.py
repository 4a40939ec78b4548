"""A 16-bit residual stream: LayerNorm outputs in the autocast dtype instead of float32.

Under autocast, layer_norm computes its statistics in float32 and returns float32 (autocast's rule,
as in HF), so the whole residual stream is float32 and every residual add, dropout and norm,
forward and backward, moves twice the bytes. Rounding the output keeps the stream 16-bit (as
Megatron-LM does by default): +3.4% tokens/s pretraining BERT-base, with loss curves within 0.008
of the float32 stream over 300 steps (benchmarks/reports/2026-11-26-pretrain-throughput.md and
2026-11-26-numerics-guard.md). Pretraining turns it on (`low_precision_residual`, through
`fast_path.apply`); fine-tuning keeps HF's float32 outputs.
ModernBERT's norms (`nn.LayerNorm`, without bias) take `LowPrecisionTorchLayerNorm`: its stream
starts at the embeddings' norm, so it is then 16-bit from end to end.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from bert_kit.model import LayerNorm


class LowPrecisionLayerNorm(LayerNorm):
    """`LayerNorm` whose output under autocast is the autocast dtype (bf16 / fp16); outside
    autocast it is `LayerNorm`. Same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if torch.is_autocast_enabled(y.device.type):
            y = y.to(torch.get_autocast_dtype(y.device.type))
        return y


class LowPrecisionTorchLayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` (ModernBERT's) whose output under autocast is the autocast dtype. Same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if torch.is_autocast_enabled(y.device.type):
            y = y.to(torch.get_autocast_dtype(y.device.type))
        return y


def set_low_precision_residual(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Under autocast, make every LayerNorm of `model` return the autocast dtype (enabled) or
    float32 again (not enabled); returns `model`."""
    old, new = (LayerNorm, LowPrecisionLayerNorm) if enabled else (LowPrecisionLayerNorm, LayerNorm)
    for module in model.modules():
        if type(module) is old:
            module.__class__ = new
    return model
