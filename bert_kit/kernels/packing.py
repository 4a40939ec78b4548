"""Packed ("unpadded") batches: variable-length sequences laid end to end, no padding in between.

A padded batch (B, T) with a 0/1 attention mask holds N = mask.sum() real tokens. Every layer of
BERT but attention works token by token, so the encoder can run on the (N, H) real tokens alone
and spend no FLOPs on padding; attention then needs the layout (`Packed`) to keep each sequence
to itself. `BERTModel(..., unpadded=True)` does this:

    ids, packed = unpad(input_ids, attention_mask)       # (B, T) -> (N,), the layout
    hidden = encoder(embeddings(ids), packed=packed)    # (N, H)
    out = pad(hidden, packed)                           # (B, T, H), zeros at the padding

`packed_attention` is attention within each sequence written with padding and a mask: the
reference that `bert_kit.kernels.attention.varlen_attention` (flash attention on CUDA) is held to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass
class Packed:
    """Layout of a packed batch of variable-length sequences laid end to end.

    cu_seqlens: (S + 1,) int32 offsets; sequence s holds tokens cu_seqlens[s]:cu_seqlens[s + 1].
    max_seqlen: length of the longest sequence (a Python int, needed by the flash kernel).
    indices: (N,) positions of the real tokens in the flattened (B * T) padded batch, when the
        pack came from `unpad`; used to scatter results back with `pad`. None with a padded shape:
        every position is in the pack (`of_rows`).
    batch, seqlen: the padded shape (B, T) that `indices` refers to.
    block_masks: FlexAttention's block masks of this layout, by window (`kernels.window_attention`),
        made by the first layer that needs one and shared by the others.
    """

    cu_seqlens: torch.Tensor
    max_seqlen: int
    indices: torch.Tensor | None = None
    batch: int = 0
    seqlen: int = 0
    block_masks: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> "Packed":
        """The layout of a (B, T) mask, computed where the mask lives: built on the host from a
        CPU mask, it spares the device the synchronisation `unpad` needs to learn max_seqlen."""
        B, T = attention_mask.shape
        lengths = attention_mask.sum(dim=1, dtype=torch.int32)  # (B,)
        cu = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))  # (B + 1,)
        return cls(cu, int(lengths.max()) if B else 0, attention_mask.flatten().nonzero().squeeze(1), B, T)

    @classmethod
    def of_rows(cls, attention_mask: torch.Tensor) -> "Packed":
        """Every position of a right-padded (B, T) batch, as 2B sequences: each row's tokens, then
        its padding (which attends only to itself; a row without padding gives an empty one). The
        real tokens' results are the padded ones; the shapes are static and nothing waits for the
        device, so a CUDA graph can record it: flash attention where a mask would need another kernel."""
        B, T = attention_mask.shape
        lengths = attention_mask.sum(dim=1, dtype=torch.int32)  # (B,)
        starts = torch.arange(0, B * T, T, dtype=torch.int32, device=attention_mask.device)  # (B,)
        cu = torch.stack((starts, starts + lengths), dim=1).flatten()  # (2B,): row starts, padding starts
        return cls(torch.cat((cu, cu.new_full((1,), B * T))), T, None, B, T)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Packed":
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Packed(move(self.cu_seqlens), self.max_seqlen, move(self.indices), self.batch, self.seqlen)


def unpad(x: torch.Tensor, attention_mask: torch.Tensor, packed: Packed | None = None) -> tuple[torch.Tensor, Packed]:
    """Drop padding: x (B, T, ...) and attention_mask (B, T) -> (N, ...) real tokens plus their
    layout (`packed`, when the caller computed it already, e.g. on the host with `Packed.from_mask`)."""
    if packed is None:
        packed = Packed.from_mask(attention_mask)
        if torch.compiler.is_compiling():
            # BERT inputs hold at least [CLS] [SEP]; telling the compiler so keeps length-1
            # broadcasting cases, and with them a graph break, out of the traced attention
            torch._check(packed.max_seqlen > 1)
    x = x.flatten(0, 1)  # (B * T, ...)
    return (x if packed.indices is None else x[packed.indices]), packed


def pad(x: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Inverse of `unpad`: x (N, ...) -> (B, T, ...), zeros at the padding."""
    if packed.indices is None:  # every position was in the pack
        return x.view(packed.batch, packed.seqlen, *x.shape[1:])
    out = x.new_zeros(packed.batch * packed.seqlen, *x.shape[1:])
    out[packed.indices] = x
    return out.view(packed.batch, packed.seqlen, *x.shape[1:])


def to_sequences(x: torch.Tensor, packed: Packed) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (N, ...) packed tokens -> (S, L, ...) padded to the longest sequence L, the (S, L) keep
    mask (True = a token) and the (N,) slots of the tokens in the flattened (S * L)."""
    lengths = packed.cu_seqlens[1:] - packed.cu_seqlens[:-1]  # (S,)
    S, L = lengths.numel(), packed.max_seqlen
    keep = torch.arange(L, device=x.device)[None, :] < lengths[:, None]  # (S, L)
    index = keep.flatten().nonzero().squeeze(1)  # (N,)
    padded = x.new_zeros(S * L, *x.shape[1:])
    padded[index] = x
    return padded.view(S, L, *x.shape[1:]), keep, index


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         dropout_p: float = 0.0) -> torch.Tensor:
    """`F.scaled_dot_product_attention` of (B, nh, T, hd) with a bool key mask (True = attend) or None."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: Packed, dropout_p: float = 0.0,
                     attention: Callable[..., torch.Tensor] = sdpa) -> torch.Tensor:
    """Attention within each packed sequence: q, k, v (N, nh, hd) -> (N, nh, hd).

    The sequences are padded to (S, nh, L, hd) and `attention(q, k, v, mask, dropout_p)` runs
    with a (S, 1, 1, L) key mask: the same numbers as variable-length kernels, more FLOPs.
    """
    qkv, keep, index = to_sequences(torch.stack((q, k, v)).transpose(0, 1), packed)  # (S, L, 3, nh, hd)
    qp, kp, vp = qkv.permute(2, 0, 3, 1, 4)  # each (S, nh, L, hd)
    y = attention(qp, kp, vp, keep[:, None, None, :], dropout_p)  # (S, nh, L, hd)
    return y.transpose(1, 2).flatten(0, 1)[index]  # (N, nh, hd)
