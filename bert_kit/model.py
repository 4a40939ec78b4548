"""The BERT encoder, readable top to bottom: the reference the fast path is held to.

Architecture (Devlin et al. 2018, as HF `BertModel`, so HF checkpoints load unchanged):
- embeddings: token + learned position (or fixed sinusoidal) + segment, then LayerNorm, dropout;
- post-norm blocks: x = LN(x + Attn(x)); x = LN(x + FFN(x)), with dropout on each sub-layer's output;
- LayerNorm eps 1e-12; exact (erf) GELU in the feed-forward (ReLU on request);
- bidirectional attention, Q, K and V from one fused (H -> 3H) projection; padding is hidden from
  the keys by the attention mask;
- pooler: dense + tanh on the [CLS] (first) position. The heads, with the MLM decoder tied to the
  word embeddings, live in `heads.py`.
- packed batches (`unpadded=True`, or a `Packed` layout from `bert_kit.kernels.packing`): the encoder
  runs on the real tokens only, each sequence attending to itself.
The family members that are BERT with other details are this model too (`BertConfig.model_type`):
RoBERTa / XLM-R number positions from pad_token_id + 1, skipping padding (`position_offset`);
DistilBERT has no segment embeddings (type_vocab_size 0); neither has a pooler (`pooler: false`).

Nothing here picks a kernel: attention is `F.scaled_dot_product_attention`. The kernels a device
and a job allow (CUDA's attention kernels, Triton kernels in compiled training) are put on a model
by one call, `bert_kit.kernels.fast_path.apply`, and the tests hold them to this code.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.config import BertConfig
from bert_kit.input_checks import check_inputs
from bert_kit.kernels.packing import Packed, pad, packed_attention, unpad


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension; BERT uses eps = 1e-12. Under autocast the statistics and
    the output are float32 (autocast's rule for layer_norm, as in HF)."""

    def __init__(self, hidden_size: int, eps: float = 1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


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
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
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
        if packed is not None:  # each packed sequence attends to itself
            N, H = x.shape
            q, k, v = self.qkv(x).view(N, 3, self.num_heads, self.head_dim).unbind(1)  # (N, nh, hd)
            return self.out(packed_attention(q, k, v, packed, p).reshape(N, H))
        B, T, H = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_dim)  # (B, T, 3, nh, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, nh, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, nh, T, hd)
        return self.out(y.transpose(1, 2).reshape(B, T, H))  # the heads side by side: (B, T, H)


class FeedForward(nn.Module):
    """Position-wise MLP: H -> intermediate -> H with GELU (or ReLU)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class TransformerEncoderBlock(nn.Module):
    """One post-norm encoder layer: attention -> add & norm -> feed-forward -> add & norm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = MultiHeadAttention(config)
        self.attention_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

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

        unpadded=True runs the encoder on the real tokens only (`kernels/packing.py`); the output is
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
        positions = self.embeddings.position_ids(input_ids).expand_as(input_ids)  # (B, T)
        ids, packed = unpad(input_ids, attention_mask, packed)  # (N,) real tokens and their layout
        types = None if token_type_ids is None else unpad(token_type_ids, attention_mask, packed)[0]  # (N,)
        x = self.embeddings(ids, types, unpad(positions, attention_mask, packed)[0])  # (N, H)
        return pad(self.encoder(x, packed=packed), packed)  # (N, H) -> (B, T, H)

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


def set_dropout(model: nn.Module, p: float) -> nn.Module:
    """Set every dropout of `model`'s encoder (embeddings, sub-layer outputs, attention probabilities)
    to `p`, leaving its config as it is: pretraining without dropout (as Cramming does) still saves
    the config's rates, which fine-tuning then uses. Heads' classifier dropout is left alone.
    (Any encoder whose attention keeps its rate in `attn_dropout`: ModernBERT's too.)"""
    p = float(p)  # the attention kernels take a float
    for module in (model.bert if hasattr(model, "bert") else model).modules():
        if isinstance(module, nn.Dropout):
            module.p = p
        elif hasattr(module, "attn_dropout"):
            module.attn_dropout = p
    return model


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
