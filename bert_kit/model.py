"""The BERT encoder, readable top to bottom; the fast path lives in the same classes.

Architecture (as Devlin et al. 2018 and HF `BertModel`, so HF checkpoints load unchanged):
- embeddings: token + learned position (or fixed sinusoidal) + segment, then LayerNorm, dropout;
- post-norm blocks: x = LN(x + Attn(x)); x = LN(x + FFN(x)), exact erf GELU, LayerNorm eps 1e-12;
- bidirectional attention; padding is hidden from the keys by the attention mask;
- pooler: dense + tanh on the [CLS] (first) position. Heads live in `heads.py`.
The family members that are BERT with other details are this model too (`BertConfig.model_type`):
RoBERTa / XLM-R number positions from pad_token_id + 1, skipping padding (`position_offset`);
DistilBERT has no segment embeddings (type_vocab_size 0); neither has a pooler (`pooler: false`).

What the fast path does, in the same code:
- Q, K and V come from one fused (H -> 3H) matmul;
- attention runs through `F.scaled_dot_product_attention` (flash / memory-efficient kernels; with a
  padding mask on CUDA, `masked_attention` keeps clear of cuDNN's per-shape plans at inference and
  of two kernels' NaN gradients in training);
- packed ("unpadded") batches: pass `cu_seqlens` and the encoder works on (N, H) real tokens only,
  with variable-length flash attention on CUDA, so no FLOPs are spent on padding; packed sequences
  see only their own tokens (block-diagonal attention). On CPU the same call falls back to padded
  SDPA, which gives identical numbers;
- no data-dependent Python branches in the hot path, so `torch.compile` sees one graph;
- optionally a 16-bit residual stream under autocast (`set_low_precision_residual`, on in pretraining).
- hidden dropout draws its mask with a Triton kernel when compiled on CUDA (`dropout.py`): inductor's
  per-element random numbers made the fused dropout + residual + LayerNorm kernel compute-bound.
- compiled pretraining on CUDA writes the FFN's and the QKV projection's gradients together with
  their bias gradients (`fused_backward.py`), instead of reading the widest gradients twice, and
  at T <= 128 runs attention with its QKV gradient as two Triton kernels (`short_attention.py`);
  GELU's forward is a Triton kernel there too, and the MLM decoder runs on a vocabulary padded to
  a multiple of 64 (`heads.padded_linear`).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bert_kit import fused_backward, short_attention
from bert_kit.config import BertConfig
from bert_kit.dropout import Dropout



def _varlen_attn():
    """torch's variable-length flash attention (PyTorch >= 2.9, CUDA), or None. Imported on first
    use: the module pulls in torch._dynamo, a second of start-up no CPU run needs."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # older PyTorch: the padded SDPA fallback
        return None
    return varlen_attn


# A padding mask on CUDA. At inference cuDNN's kernel is left out: torch (2.11) tries it first, and
# it builds an execution plan for every new (batch, length) shape, ~0.3 s on an H100, which padded
# batches of varying length (evaluation, predict, embed, serve) pay again and again. The
# memory-efficient kernel takes the mask with no per-shape set-up.
# In training both fused masked kernels have backward bugs that give NaN gradients from finite
# inputs: the memory-efficient one with a mask and dropout (random-init fine-tuning on an H100,
# torch 2.11; pytorch/pytorch#178251), and cuDNN's in dQ when the length is 64 mod 128 and a
# query row's logsumexp is below -88.7 (pytorch/pytorch#196678). A pretrained model's large query
# and key biases reach that (a bert-small after 6 minutes of pretraining: -179), and its fine-tuning
# then skipped every step whose batch was padded to 64. So training takes cuDNN's kernel (H100 and
# later, 16-bit) or the math one, and a 64 mod 128 length is padded up to a multiple of 128.
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


@dataclass
class Packed:
    """Layout of a packed batch of variable-length sequences laid end to end.

    cu_seqlens: (S + 1,) int32 offsets; sequence s holds tokens cu_seqlens[s]:cu_seqlens[s + 1].
    max_seqlen: length of the longest sequence (a Python int, needed by the flash kernel).
    indices: (N,) positions of the real tokens in the flattened (B * T) padded batch, when the
        pack came from `unpad`; used to scatter results back with `pad`. None with a padded shape:
        every position is in the pack (`of_rows`).
    batch, seqlen: the padded shape (B, T) that `indices` refers to.
    """

    cu_seqlens: torch.Tensor
    max_seqlen: int
    indices: torch.Tensor | None = None
    batch: int = 0
    seqlen: int = 0

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> "Packed":
        """The layout of a (B, T) mask, computed where the mask lives: built on the host from a
        CPU mask, it spares the device the synchronisation `unpad` needs to learn max_seqlen."""
        B, T = attention_mask.shape
        lengths = attention_mask.sum(dim=1, dtype=torch.int32)  # (B,)
        cu = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
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
    """Drop padding: x (B, T, ...) and mask (B, T) -> (N, ...) real tokens plus their layout
    (`packed`, when the caller computed it already, e.g. on the host with `Packed.from_mask`)."""
    if packed is None:
        packed = Packed.from_mask(attention_mask)
        if torch.compiler.is_compiling():
            # BERT inputs hold at least [CLS] [SEP]; telling the compiler so keeps length-1
            # broadcasting cases, and with them a graph break, out of the traced attention
            torch._check(packed.max_seqlen > 1)
    x = x.flatten(0, 1)
    return (x if packed.indices is None else x[packed.indices]), packed


def pad(x: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Inverse of `unpad`: (N, ...) -> (B, T, ...), zeros at the padding."""
    if packed.indices is None:  # every position was in the pack
        return x.view(packed.batch, packed.seqlen, *x.shape[1:])
    out = x.new_zeros(packed.batch * packed.seqlen, *x.shape[1:])
    out[packed.indices] = x
    return out.view(packed.batch, packed.seqlen, *x.shape[1:])


def _packed_to_padded(x: torch.Tensor, packed: Packed) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, ...) packed tokens -> (S, L, ...) padded, the (S, L) keep-mask and the gather index."""
    lengths = packed.cu_seqlens[1:] - packed.cu_seqlens[:-1]  # (S,)
    S, L = lengths.numel(), packed.max_seqlen
    keep = torch.arange(L, device=x.device)[None, :] < lengths[:, None]  # (S, L)
    index = keep.flatten().nonzero().squeeze(1)  # (N,) slots of real tokens in (S * L)
    padded = x.new_zeros(S * L, *x.shape[1:])
    padded[index] = x
    return padded.view(S, L, *x.shape[1:]), keep, index


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
    qp, keep, index = _packed_to_padded(torch.stack((q, k, v)).transpose(0, 1), packed)  # (S, L, 3, nh, hd)
    qp, kp, vp = qp.permute(2, 0, 3, 1, 4)  # each (S, nh, L, hd)
    y = masked_attention(qp, kp, vp, keep[:, None, None, :], dropout_p)
    return y.transpose(1, 2).flatten(0, 1)[index]  # (N, nh, hd)


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension; BERT uses eps = 1e-12.

    Under autocast the statistics are always float32 (autocast's rule for layer_norm). The output
    is float32 too, as in HF, unless `autocast_output` is set (see `set_low_precision_residual`).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps
        self.autocast_output = False  # return the autocast dtype instead of float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
        if self.autocast_output and torch.is_autocast_enabled(y.device.type):
            y = y.to(torch.get_autocast_dtype(y.device.type))
        return y


def set_low_precision_residual(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Under autocast, make every LayerNorm of `model` return the autocast dtype (bf16 / fp16).

    With float32 LayerNorm outputs the whole residual stream is float32, so every residual add,
    dropout and norm, forward and backward, moves twice the bytes. Rounding the output keeps the
    stream 16-bit (as Megatron-LM does by default): +3.4% tokens/s pretraining BERT-base, with
    loss curves within 0.008 of the float32 stream over 300 steps (benchmarks/RESULTS.md).
    Pretraining turns it on; fine-tuning keeps HF's float32 outputs.
    """
    for module in model.modules():
        if isinstance(module, LayerNorm):
            module.autocast_output = enabled
    return model


def set_dropout(model: nn.Module, p: float) -> nn.Module:
    """Set every dropout of `model` (embeddings, sub-layer outputs, attention probabilities) to `p`,
    leaving its config as it is: pretraining without dropout (as Cramming does) still saves the
    config's rates, which fine-tuning then uses. Heads' classifier dropout is left alone."""
    p = float(p)  # the attention kernels take a float
    for module in model.modules():
        if isinstance(module, Dropout):
            module.p = p
        elif isinstance(module, MultiHeadAttention):
            module.attn_dropout = p
    return model


class GELU(nn.Module):
    """Exact GELU, x * Phi(x) with the erf form (not the tanh approximation), as in BERT."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def activation(name: str) -> nn.Module:
    return GELU() if name == "gelu" else nn.ReLU()


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """Fixed sin/cos position table of Vaswani et al.: (num_positions, dim)."""
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table.float()


class BertEmbeddings(nn.Module):
    """Token + position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        if config.position_embedding_type == "learned":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        else:  # a buffer: fixed, not trained, and not saved (it is recomputed from the config)
            table = sinusoidal_table(config.max_position_embeddings, config.hidden_size)
            self.register_buffer("position_table", table, persistent=False)
        if config.type_vocab_size:  # DistilBERT has none: its token_type_ids are ignored
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.position_offset, self.pad_token_id = config.position_offset, config.pad_token_id

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> positions (T,), or (B, T) for RoBERTa: as HF's create_position_ids_from_input_ids,
        each real token counts the real tokens up to it, from pad_token_id + 1; padding sits at pad_token_id."""
        if not self.position_offset:
            return torch.arange(input_ids.shape[-1], device=input_ids.device)
        real = (input_ids != self.pad_token_id).long()
        return torch.cumsum(real, dim=-1) * real + (self.position_offset - 1)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, token_type_ids, position_ids: (B, T) or packed (N,) -> (B, T, H) or (N, H)."""
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        if hasattr(self, "position_embeddings"):
            positions = self.position_embeddings(position_ids)
        else:
            positions = self.position_table[position_ids]
        x = self.word_embeddings(input_ids) + positions
        if hasattr(self, "token_type_embeddings"):  # no ids: all sentence A, row 0 of the segment table
            x = x + (self.token_type_embeddings.weight[0] if token_type_ids is None
                     else self.token_type_embeddings(token_type_ids))
        return self.dropout(self.norm(x))


class MultiHeadAttention(nn.Module):
    """Bidirectional multi-head self-attention with a fused QKV projection."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)  # rows: [query; key; value]
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.attn_dropout = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, packed: Packed | None = None) -> torch.Tensor:
        """x: (B, T, H) with mask (B, 1, 1, T) bool (True = attend), or packed (N, H). Same shape out."""
        p = self.attn_dropout if self.training else 0.0
        if packed is None:
            B, T, H = x.shape
            if short_attention.applies(x, mask, self.qkv, self.head_dim, p):  # same function, fewer kernels
                return self.out(short_attention.self_attention(x, self.qkv, mask, self.num_heads, p))
            if fused_backward.applies(x, self.qkv):  # same function, fewer passes backward
                q, k, v = fused_backward.qkv_projection(x, self.qkv, self.num_heads)
            else:
                qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim)
                q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, nh, T, hd)
            y = masked_attention(q, k, v, mask, p)  # (B, nh, T, hd)
            y = y.transpose(1, 2).reshape(B, T, H)
        else:
            N, H = x.shape
            q, k, v = self.qkv(x).view(N, 3, self.num_heads, self.head_dim).unbind(1)  # (N, nh, hd)
            y = varlen_attention(q, k, v, packed, dropout_p=p).reshape(N, H)
        return self.out(y)


class FeedForward(nn.Module):
    """Position-wise MLP: H -> intermediate -> H with GELU (or ReLU)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.act, GELU) and fused_backward.applies(x, self.up, self.down):
            return fused_backward.feed_forward(x, self.up, self.down)  # same function, fewer passes backward
        return self.down(self.act(self.up(x)))


class TransformerEncoderBlock(nn.Module):
    """One post-norm encoder layer: attention -> add & norm -> feed-forward -> add & norm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = MultiHeadAttention(config)
        self.attention_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, packed: Packed | None = None) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, mask, packed)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class BertEncoder(nn.Module):
    """A stack of `num_hidden_layers` encoder blocks."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerEncoderBlock(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, packed: Packed | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask, packed)
        return x


class BertPooler(nn.Module):
    """Dense + tanh on the [CLS] position: (B, T, H) -> (B, H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


_inputs_checked_by_caller = False


@contextmanager
def unchecked_inputs() -> Iterator[None]:
    """Within this block forward passes skip `check_inputs`'s value range check: for callers that
    built their batches from a tokenizer the model was checked against (the training loop). On a
    GPU the check reads a value back from the device, a synchronisation in every step."""
    global _inputs_checked_by_caller
    previous, _inputs_checked_by_caller = _inputs_checked_by_caller, True
    try:
        yield
    finally:
        _inputs_checked_by_caller = previous


def check_inputs(config: BertConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None) -> None:
    """Clear errors for bad ids, masks and shapes, before they become an index error, a CUDA
    assert or a silently wrong output. Costs one host-device sync (all value checks at once)."""
    for name, t in (("input_ids", input_ids), ("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape (batch, seq_len), got {type(t).__name__}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be an integer tensor (torch.long), got {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    if T == 0 and B > 0:
        raise ValueError(f"input_ids has no tokens (shape {tuple(input_ids.shape)}): a sequence holds at least "
                         "[CLS] and [SEP]")
    if T > config.max_length:
        past = f" past position_offset {config.position_offset}" if getattr(config, "position_offset", 0) else ""
        raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                         f"({config.max_position_embeddings}){past}; truncate the input")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} does not match input_ids {tuple(input_ids.shape)}")
    if token_type_ids is not None and token_type_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"token_type_ids must be an integer tensor (torch.long), got {token_type_ids.dtype}")
    if attention_mask is not None and attention_mask.is_complex():
        raise TypeError(f"attention_mask must hold 0/1 (integers, bools or floats), got {attention_mask.dtype}")
    if not input_ids.numel() or _inputs_checked_by_caller:
        return  # an empty batch gives an empty output; a trusted caller checked the values itself
    # one device sync for all value checks (each .item() on a GPU tensor waits for the GPU)
    stats = [input_ids.min(), input_ids.max()]
    if token_type_ids is not None:
        stats += [token_type_ids.min(), token_type_ids.max()]
    if attention_mask is not None:
        nonzero = attention_mask != 0
        stats += [(nonzero & (attention_mask != 1)).any(), nonzero.sum(dim=1).min()]  # not 0/1; emptiest row
    values = torch.stack([s.long() for s in stats]).tolist()
    lo, hi = values[0], values[1]
    if lo < 0 or hi >= config.vocab_size:
        raise ValueError(f"token id {lo if lo < 0 else hi} out of range for vocab_size {config.vocab_size}")
    if token_type_ids is not None and (values[2] < 0 or values[3] >= config.type_vocab_size):
        bad = values[2] if values[2] < 0 else values[3]
        raise ValueError(f"token_type id {bad} out of range for type_vocab_size {config.type_vocab_size}")
    if attention_mask is not None and values[-2]:
        odd = attention_mask[(attention_mask != 0) & (attention_mask != 1)][:3].tolist()
        raise ValueError(f"attention_mask must hold only 0 (padding) and 1 (token), found {odd}")
    if attention_mask is not None and values[-1] == 0:
        row = int((attention_mask != 0).sum(dim=1).argmin())
        raise ValueError(f"attention_mask row {row} is all zeros: every sequence needs at least one token")


class BertPreTrainedModel(nn.Module):
    """Shared by BERTModel and every head: BERT's weight init and HF-compatible load/save."""

    config: BertConfig
    hf_architecture = "BertModel"  # the class name `transformers` loads a saved folder with

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's init: N(0, 0.02) weights, zero biases, zero padding embedding, unit LayerNorm."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()

    @classmethod
    def from_pretrained(cls, folder, **head_args):
        """Load an HF BERT folder or a bert-kit one (config.json + model.safetensors)."""
        from bert_kit.hf import from_pretrained

        return from_pretrained(cls, folder, **head_args)

    def save_pretrained(self, folder) -> None:
        """Write config.json + model.safetensors that `transformers` loads with identical outputs."""
        from bert_kit.hf import save_pretrained

        save_pretrained(self, folder)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameter count (tied weights counted once)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= sum(p.numel() for m in self.modules() if isinstance(m, BertEmbeddings) for p in m.parameters())
        return n


class BERTModel(BertPreTrainedModel):
    """The BERT encoder with its pooler.

    `model(input_ids, attention_mask, token_type_ids)` -> last hidden states (B, T, H);
    `model.pool(hidden)` -> pooled [CLS] output (B, H).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if config.pooler else None  # RoBERTa's and DistilBERT's heads use none
        self.apply(self._init_weights)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, unpadded: bool | Packed = False) -> torch.Tensor:
        """input_ids, attention_mask (1 = token, 0 = pad), token_type_ids: (B, T) -> (B, T, H).

        unpadded=True runs the encoder on the real tokens only (see `Packed`); the output is
        scattered back to (B, T, H) with zeros at padding, and equals the padded result there.
        A `Packed` layout of the mask (`Packed.from_mask`, on the device) does the same without
        computing it here, which on a GPU would wait for the device.
        """
        if not self.config.type_vocab_size:  # DistilBERT: no segments
            token_type_ids = None
        if not torch.compiler.is_compiling():
            check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        if isinstance(unpadded, Packed) or (unpadded and attention_mask is not None and input_ids.shape[0] > 0):
            return self._forward_unpadded(input_ids, attention_mask, token_type_ids,
                                          unpadded if isinstance(unpadded, Packed) else None)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        return self.encoder(x, mask)

    def _forward_unpadded(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          token_type_ids: torch.Tensor | None, packed: Packed | None = None) -> torch.Tensor:
        positions = self.embeddings.position_ids(input_ids).expand_as(input_ids)
        ids, packed = unpad(input_ids, attention_mask, packed)  # (N,)
        types = None if token_type_ids is None else unpad(token_type_ids, attention_mask, packed)[0]
        x = self.embeddings(ids, types, unpad(positions, attention_mask, packed)[0])  # (N, H)
        return pad(self.encoder(x, packed=packed), packed)

    def forward_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Several sequences laid end to end: input_ids (N,), cu_seqlens (S + 1,) -> (N, H).

        Each sequence attends only to itself; positions restart at 0 for each unless given.
        """
        if position_ids is None:
            starts = torch.repeat_interleave(cu_seqlens[:-1], cu_seqlens[1:] - cu_seqlens[:-1])
            position_ids = torch.arange(input_ids.numel(), device=input_ids.device) - starts
            position_ids = position_ids + self.config.position_offset  # RoBERTa's start past the padding index
        if not self.config.type_vocab_size:
            token_type_ids = None
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        return self.encoder(x, packed=Packed(cu_seqlens.to(torch.int32), int(max_seqlen)))

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pooled output: tanh(W h_[CLS] + b), (B, T, H) -> (B, H)."""
        if self.pooler is None:
            raise ValueError(f"a {self.config.model_type} encoder has no pooler (pooler: false): pool the hidden states "
                             "(mean or first token) instead")
        return self.pooler(hidden)


def flops_per_token(config: BertConfig, seq_len: int, masked_fraction: float = 0.15) -> float:
    """Useful training FLOPs per token (forward + backward = 6 x matmul multiply-adds).

    Counts the encoder's matmuls, attention scores and weighted sums (12 * L * T * H), and the
    MLM head on the masked fraction of tokens only; embeddings lookups count nothing.
    """
    H, L, V, I = config.hidden_size, config.num_hidden_layers, config.vocab_size, config.intermediate_size
    encoder = L * (4 * H * H + 2 * H * I)  # QKV + output projection + FFN, per token
    attention = 12 * L * seq_len * H
    mlm = masked_fraction * (H * V + H * H)
    return 6 * encoder + attention + 6 * mlm


def estimate_mfu(config: BertConfig, seq_len: int, tokens_per_s: float, peak_flops: float = 790e12,
                 masked_fraction: float = 0.15) -> float:
    """Model FLOPs utilisation: achieved useful FLOP/s over the peak (H100 bf16 dense, measured)."""
    return flops_per_token(config, seq_len, masked_fraction) * tokens_per_s / peak_flops
