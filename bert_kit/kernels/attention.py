"""Attention on CUDA: SDPA with a padding mask on kernels that behave, and variable-length flash
attention for packed batches. `CudaAttention` is `MultiHeadAttention` running them (same
parameters, same function); `fast_path.apply` puts it on every attention layer of a model on CUDA.

A padding mask on CUDA. At inference cuDNN's kernel is left out: torch (2.11) tries it first, and
it builds an execution plan for every new (batch, length) shape, ~0.3 s on an H100, which padded
batches of varying length (evaluation, predict, embed, serve) pay again and again. The
memory-efficient kernel takes the mask with no per-shape set-up.
In training both fused masked kernels have backward bugs that give NaN gradients from finite
inputs: the memory-efficient one with a mask and dropout (random-init fine-tuning on an H100,
torch 2.11; pytorch/pytorch#178251), and cuDNN's in dQ when the length is 64 mod 128 and a
query row's logsumexp is below -88.7 (pytorch/pytorch#196678). A pretrained model's large query
and key biases reach that (a bert-small after 6 minutes of pretraining: -179), and its fine-tuning
then skipped every step whose batch was padded to 64. So training takes cuDNN's kernel (H100 and
later, 16-bit) or the math one, and a 64 mod 128 length is padded up to a multiple of 128.

Packed batches (`bert_kit.kernels.packing`) in half precision take the variable-length flash
kernel, so no FLOPs go to padding; elsewhere they are padded per sequence for SDPA
(`packing.packed_attention`, the same numbers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bert_kit.kernels.packing import Packed, packed_attention
from bert_kit.model import MultiHeadAttention

_MASKED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
_MASKED_TRAINING_BACKENDS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     dropout_p: float = 0.0) -> torch.Tensor:
    """`F.scaled_dot_product_attention` of (B, nh, T, hd) with a bool key mask (B, 1, 1, T)
    (True = attend) or None, on a kernel whose backward is sound (see above). Compiled code keeps
    inductor's kernel choice; the padding of a 64 mod 128 length applies there too."""
    if mask is None or not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if training and q.shape[-2] % 128 == 64:
        return padded_to_128(masked_attention, q, k, v, mask, dropout_p)
    if torch.compiler.is_compiling():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    with sdpa_kernel(_MASKED_TRAINING_BACKENDS if training else _MASKED_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def padded_to_128(attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                  dropout_p: float = 0.0) -> torch.Tensor:
    """`attention` over (B, nh, T, hd) with the length padded to a multiple of 128: the new keys are
    masked out, the new queries' rows dropped, so the result is the unpadded one."""
    T = q.shape[-2]
    extra = -T % 128
    q, k, v = (F.pad(t, (0, 0, 0, extra)) for t in (q, k, v))
    mask = F.pad(mask, (0, extra), value=False)
    if mask.shape[-2] > 1:  # a per-query mask: the new queries see what the first one sees
        mask = torch.cat([mask, mask[..., :1, :].expand(*mask.shape[:-2], extra, mask.shape[-1])], dim=-2)
    return attention(q, k, v, mask, dropout_p)[..., :T, :]


def _varlen_attn():
    """torch's variable-length flash attention (PyTorch >= 2.9, CUDA), or None. Imported on first
    use: the module pulls in torch._dynamo, a second of start-up no CPU run needs."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # older PyTorch: the padded SDPA fallback
        return None
    return varlen_attn


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: Packed,
                     dropout_p: float = 0.0) -> torch.Tensor:
    """Attention within each packed sequence. q, k, v: (N, nh, hd) -> (N, nh, hd).

    CUDA half precision uses the variable-length flash kernel (with attention dropout through
    aten's flash op, which `varlen_attn` does not expose); otherwise the sequences are padded to
    (S, nh, L, hd) for SDPA with a key-padding mask (same numbers, more FLOPs).
    """
    hd = q.shape[-1]
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and hd <= 256:
        cu, L = packed.cu_seqlens, packed.max_seqlen
        extra = -hd % 8  # the kernel takes head sizes in multiples of 8: zeros added to q, k, v change no score
        if extra:
            q, k, v = (F.pad(t, (0, extra)) for t in (q, k, v))
        if dropout_p > 0.0 or extra or not torch.compiler.is_compiling():  # (varlen_attn's import: a second)
            y = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, L, L, dropout_p, False, False,
                                                        scale=hd ** -0.5)[0]
            return y[..., :hd] if extra else y
        varlen_attn = _varlen_attn()
        if varlen_attn is not None:
            return varlen_attn(q, k, v, cu, cu, L, L)
    return packed_attention(q, k, v, packed, dropout_p, attention=masked_attention)


class CudaAttention(MultiHeadAttention):
    """`MultiHeadAttention` on the kernels above: `masked_attention` for padded batches,
    `varlen_attention` for packed ones. Same parameters and state dict; off CUDA both fall back
    to the reference's SDPA, so the numbers are the reference's everywhere."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, packed: Packed | None = None) -> torch.Tensor:
        """x: (B, T, H) with mask (B, 1, 1, T) bool (True = attend), or packed (N, H). Same shape out."""
        p = self.attn_dropout if self.training else 0.0
        if packed is not None:
            N, H = x.shape
            q, k, v = self.qkv(x).view(N, 3, self.num_heads, self.head_dim).unbind(1)  # (N, nh, hd)
            return self.out(varlen_attention(q, k, v, packed, dropout_p=p).reshape(N, H))
        B, T, H = x.shape
        q, k, v = self.project(x)  # (B, nh, T, hd) each
        y = masked_attention(q, k, v, mask, p)  # (B, nh, T, hd)
        return self.out(y.transpose(1, 2).reshape(B, T, H))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, H) -> q, k, v (B, nh, T, hd), views of the fused projection's output."""
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, nh, T, hd)
        return q, k, v
