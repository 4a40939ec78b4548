"""ModernBERT's attention on packed batches without a (T, T) mask: memory grows linearly with length.

The reference (`bert_kit.modernbert.sdpa_attention`) pads each packed sequence and builds a boolean
mask with the window in it: (L, L) per sequence, quadratic in the length, and FLOPs on every key the
window hides. Two kernels compute the same function from the layout (`Packed`) and the window alone:

- `flash_window_attention`: the variable-length flash kernel with a sliding window (CUDA, 16-bit,
  head size <= 256): `torch.ops.aten._flash_attention_forward(..., window_size_left=w,
  window_size_right=w)`, a query at position i seeing keys i - w .. i + w of its own sequence, as
  HF's mask (|q - k| <= local_attention // 2); its backward is flash's too;
- `flex_window_attention`: FlexAttention with a block mask holding the documents (sequences) and
  the window, so only the blocks the window touches are computed, in a kernel the compiler makes
  (eager callers get `flex_attention` compiled alone). For CUDA runs where flash does not apply
  (float32, head size > 256); on a CPU it runs inference unfused (FlexAttention has no CPU
  backward), which tests it there against the reference.

Each falls back to the reference where its kernel cannot run. `PackedModernBertModel` runs padded
calls packed by rows (`Packed.of_rows`: static shapes, right-padded batches), so every layer reaches
these kernels, compiled, in CUDA graphs or eager. `fast_path.apply` puts them on a ModernBERT model.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from bert_kit.kernels.packing import Packed
from bert_kit.modernbert import ModernBertModel, rotary, sdpa_attention

HALF = (torch.float16, torch.bfloat16)

# torch's `varlen_attn` where it takes a window (a custom op with flash's backward, lighter to trace
# than the aten op); this module is imported only for a run that uses these kernels (it pulls in
# torch._dynamo, a second of start-up)
try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # PyTorch < 2.9
    varlen_attn = None
if varlen_attn is not None and "window_size" not in inspect.signature(varlen_attn).parameters:
    varlen_attn = None


def flash_applies(q: torch.Tensor) -> bool:
    """Whether the flash kernel takes these queries: CUDA, 16-bit, head size <= 256."""
    return q.is_cuda and q.dtype in HALF and q.shape[-1] <= 256


def flash_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                           packed: Packed | None, window: int | None, dropout_p: float = 0.0) -> torch.Tensor:
    """`sdpa_attention`'s function on the flash kernel: packed q, k, v (N, nh, hd) -> (N, nh, hd), each
    sequence of `packed` attending to itself, within `window` positions on each side (None: all).
    Padded calls and what flash does not take run the reference."""
    if packed is None or not flash_applies(q):
        return sdpa_attention(q, k, v, mask, packed, window, dropout_p)
    hd = q.shape[-1]
    cu, L = packed.cu_seqlens, packed.max_seqlen
    extra = -hd % 8  # the kernel takes head sizes in multiples of 8: zeros added to q, k, v change no score
    if extra:
        q, k, v = (F.pad(t, (0, extra)) for t in (q, k, v))
    if varlen_attn is not None and torch.compiler.is_compiling() and not dropout_p:
        sides = (-1, -1) if window is None else (window, window)
        y = varlen_attn(q, k, v, cu, cu, L, L, scale=hd ** -0.5, window_size=sides)
    else:
        sides = {} if window is None else {"window_size_left": window, "window_size_right": window}
        y = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, L, L, dropout_p, False, False,
                                                    scale=hd ** -0.5, **sides)[0]
    return y[..., :hd] if extra else y


def document_window_mask(packed: Packed, window: int | None, n: int, device: torch.device):
    """FlexAttention's block mask of a packed batch of `n` tokens: a query sees the keys of its own
    sequence, within `window` positions (None: all of them). Kept on `packed` per window: every
    layer of a forward shares its layout."""
    if window in packed.block_masks:
        return packed.block_masks[window]
    cu = packed.cu_seqlens.to(device=device, dtype=torch.long)
    doc = torch.searchsorted(cu[1:], torch.arange(n, device=device), right=True)  # (N,) the sequence of each token

    def visible(b, h, q, k):
        same = doc[q] == doc[k]
        return same if window is None else same & ((q - k).abs() <= window)

    # on a GPU outside a compiled region, compiled: the (N, N) mask is never held in memory
    eager_cuda = device.type == "cuda" and not torch.compiler.is_compiling()
    block_mask = create_block_mask(visible, None, None, n, n, device=device, _compile=eager_cuda)
    packed.block_masks[window] = block_mask
    return block_mask


def flex_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                          packed: Packed | None, window: int | None, dropout_p: float = 0.0) -> torch.Tensor:
    """`sdpa_attention`'s function on FlexAttention: packed q, k, v (N, nh, hd) -> (N, nh, hd) with a
    block mask of the sequences and the window. Padded calls, attention dropout and a backward on the
    CPU run the reference."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if packed is None or dropout_p or (needs_grad and not q.is_cuda):
        return sdpa_attention(q, k, v, mask, packed, window, dropout_p)
    block_mask = document_window_mask(packed, window, q.shape[0], q.device)
    # each (1, nh, N, hd), laid out so (inductor's CPU kernel refuses the strided views of distinct q, k, v)
    heads_first = [t.transpose(0, 1)[None].contiguous() for t in (q, k, v)]
    # FlexAttention's fused kernel is made by the compiler; eager code on a GPU compiles it alone
    attend = _compiled_flex() if q.is_cuda and not torch.compiler.is_compiling() else flex_attention
    y = attend(*heads_first, block_mask=block_mask, scale=q.shape[-1] ** -0.5)  # (1, nh, N, hd)
    return y[0].transpose(0, 1)


@functools.cache
def _compiled_flex():
    """`flex_attention` compiled once for eager callers (dynamic shapes: one kernel for every N)."""
    return torch.compile(flex_attention, dynamic=True)


@torch.library.custom_op("bert_kit::rotary_table", mutates_args=())
def rotary_table(positions: torch.Tensor, theta: float, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`bert_kit.modernbert.rotary` as an op of its own: (...,) int -> cos, sin (..., head_dim) float32.
    Compiled code calls it instead of inlining its arithmetic: inductor would fuse that into every
    kernel that turns q or k, forward and backward, computing sin and cos again for each element of
    every head (a fifth of ModernBERT-base's training step at seq 512 on an H200)."""
    return rotary(positions, theta, head_dim)


@rotary_table.register_fake
def _(positions: torch.Tensor, theta: float, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (*positions.shape, head_dim)
    return positions.new_empty(shape, dtype=torch.float32), positions.new_empty(shape, dtype=torch.float32)


class PackedModernBertModel(ModernBertModel):
    """`ModernBertModel` whose padded calls run packed, so each layer's attention is a packed kernel's
    (no (B, T, T) mask): every position, by rows (`Packed.of_rows`: each row's tokens, then its
    padding apart), with static shapes and no wait for the device, so compiled code and CUDA graphs
    take it too. Rows must be right-padded, as bert-kit's collators and HF's tokenizers pad them
    (checked without waiting for the device, outside compiled code). Callers that pass
    `unpadded=True` (bert-kit's jobs) skip the padding instead. Same parameters; the outputs at
    real tokens are the reference's."""

    rotary = staticmethod(rotary_table)  # in compiled code the rotations are read from memory

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, unpadded: bool | Packed = False) -> torch.Tensor:
        """(B, T) -> (B, T, H), as `ModernBertModel.forward`."""
        if unpadded is False and input_ids.shape[0] > 0:
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            elif not torch.compiler.is_compiling() and not (input_ids.is_cuda and
                                                            torch.cuda.is_current_stream_capturing()):
                right_padded = (attention_mask[:, 1:] <= attention_mask[:, :-1]).all()  # 1s, then 0s, in each row
                torch._assert_async(right_padded, "ModernBERT's packed kernels take right-padded rows (tokens first, "
                                                  "then padding); pass unpadded=True for any other mask")
            unpadded = Packed.of_rows(attention_mask)
        return super().forward(input_ids, attention_mask, token_type_ids, unpadded)
