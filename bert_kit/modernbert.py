"""ModernBERT (Warner et al. 2024), readable top to bottom, as HF `ModernBertModel`, so its
folders load unchanged (`from_pretrained`, `save_pretrained`; names in `bert_kit.hf_names`).

What differs from BERT (`model.py`):
- no position table: rotary embeddings turn queries and keys by their position, with theta
  160,000 in global layers and 10,000 in local ones (`rope_parameters`);
- pre-norm blocks, x = x + Attn(LN(x)); x = x + GeGLU(LN(x)), and a final LayerNorm; the first
  block has no attention norm (the embeddings' norm comes just before it);
- GeGLU feed-forward: Wi projects to 2 x intermediate, split into input and gate, Wo(act(input) * gate);
- every third layer (from the first) attends globally, the others within a sliding window: a
  token sees the keys at most local_attention // 2 = 64 positions away (HF's mask, exactly);
- no biases and LayerNorms without bias by default, eps 1e-5; no segment ids, no pooler;
- heads: dense -> act -> norm (`head`), then the decoder tied to the word embeddings (MLM) or a
  linear classifier; sequence classification pools the first token or the mean (classifier_pooling).

Attention runs through one function per layer, `ModernBertAttention.attend` (default
`sdpa_attention`): padded batches (B, nh, T, hd) with a boolean mask that holds the padding and
the window, or packed ones (N, nh, hd) with their `Packed` layout and the window as a number. A
fast path sets `attend` to a flash varlen or FlexAttention kernel; the model stays this one.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.heads import LabelledOutputs, select_masked
from bert_kit.input_checks import check_inputs
from bert_kit.kernels.packing import Packed, pad, to_sequences, unpad
from bert_kit.model import BertPreTrainedModel
from bert_kit.modernbert_config import ModernBertConfig


def activation(name: str) -> nn.Module:
    """HF's ACT2FN names: gelu is the exact erf form; gelu_new and gelu_pytorch_tanh the tanh one."""
    return {"gelu": nn.GELU(), "gelu_pytorch_tanh": nn.GELU("tanh"), "gelu_new": nn.GELU("tanh"), "relu": nn.ReLU(),
            "silu": nn.SiLU()}[name]


def layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


def rotary(positions: torch.Tensor, theta: float, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles position * theta^(-2j / head_dim): (...,) -> (..., head_dim) each,
    float32. The two halves of a head turn by the same angles (HF's rotate_half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=positions.device) / head_dim))
    angles = positions[..., None].float() * inv_freq  # (..., hd / 2)
    angles = torch.cat((angles, angles), dim=-1)  # (..., hd)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (x_j, x_{j + hd/2}) of every head by its angle, in float32. x: (B, nh, T, hd)
    with cos, sin (T, hd), or (N, nh, hd) with (N, 1, hd)."""
    x32 = x.float()
    half = x32.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def visible_keys(keep: torch.Tensor | None, seqlen: int, window: int | None) -> torch.Tensor | None:
    """Which keys each query sees: the real ones (keep (B, T), True = token), and with a window only
    those within `window` positions (|q - k| <= window). (B, 1, 1, T) or, with a window, (B, 1, T, T);
    None when every key is seen. A padded query that would see no key sees itself (its output is
    thrown away; a row of no keys would be NaN)."""
    if window is None:
        return None if keep is None else keep[:, None, None, :]
    device = keep.device if keep is not None else None
    pos = torch.arange(seqlen, device=device)
    distance = pos[:, None] - pos[None, :]  # (T, T)
    mask = distance.abs() <= window
    if keep is not None:
        mask = (mask & keep[:, None, None, :]) | (distance == 0)  # (B, 1, T, T)
    return mask


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   packed: Packed | None, window: int | None, dropout_p: float = 0.0) -> torch.Tensor:
    """The eager attention: `F.scaled_dot_product_attention`.

    Padded: q, k, v (B, nh, T, hd) with `mask` from `visible_keys` (the window is in it) ->
    (B, nh, T, hd). Packed: q, k, v (N, nh, hd) of the sequences `packed` lays end to end ->
    (N, nh, hd); each sequence is padded to the longest and masked here, within `window`
    (what flash varlen attention with window (w, w) computes without the padding)."""
    if packed is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    qkv, keep, index = to_sequences(torch.stack((q, k, v), dim=1), packed)  # (S, L, 3, nh, hd)
    qp, kp, vp = qkv.permute(2, 0, 3, 1, 4)  # each (S, nh, L, hd)
    y = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=visible_keys(keep, keep.shape[1], window),
                                       dropout_p=dropout_p)
    return y.transpose(1, 2).flatten(0, 1)[index]  # (N, nh, hd)


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout (positions come in the attention, by rotation)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = layer_norm(config)
        self.dropout = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) or packed (N,) -> (B, T, H) or (N, H)."""
        return self.dropout(self.norm(self.word_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    """Multi-head self-attention with rotary positions, global or within a sliding window."""

    def __init__(self, config: ModernBertConfig, layer_type: str):
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)  # [q; k; v]
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.window = config.sliding_window if layer_type == "sliding_attention" else None  # None: global
        self.attn_dropout = config.attention_dropout  # on the probabilities, and on the output below
        self.out_dropout = nn.Dropout(config.attention_dropout)
        self.attend = sdpa_attention  # the attention kernel: a fast path swaps it

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None,
                packed: Packed | None = None) -> torch.Tensor:
        """x: (B, T, H) with `mask` (see `visible_keys`), or packed (N, H) with `packed`. Same shape out."""
        p = self.attn_dropout if self.training else 0.0
        q, k, v = self.heads(self.qkv(x), cos, sin, packed)
        y = self.attend(q, k, v, mask, packed, self.window, p)
        y = y.reshape(x.shape) if packed is not None else y.transpose(1, 2).reshape(x.shape)
        return self.out_dropout(self.out(y))

    def heads(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              packed: Packed | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The projection's output split into heads, q and k turned by their positions: (B, T, 3H)
        -> q, k, v (B, nh, T, hd) each, or packed (N, 3H) -> (N, nh, hd) each."""
        if packed is None:
            B, T, _ = qkv.shape
            q, k, v = qkv.view(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, nh, T, hd)
        else:
            q, k, v = qkv.view(qkv.shape[0], 3, self.num_heads, self.head_dim).unbind(1)  # each (N, nh, hd)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


class GeGLU(nn.Module):
    """The gated feed-forward: H -> 2 x intermediate (input, gate) -> act(input) * gate -> H."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)  # [input; gate]
        self.act = activation(config.hidden_activation)
        self.dropout = nn.Dropout(config.mlp_dropout)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input, gate = self.up(x).chunk(2, dim=-1)  # each (..., intermediate)
        return self.down(self.dropout(self.act(input) * gate))


class ModernBertLayer(nn.Module):
    """One pre-norm block: x + Attn(LN(x)), then x + GeGLU(LN(x))."""

    def __init__(self, config: ModernBertConfig, index: int):
        super().__init__()
        self.attention_type = config.layer_types[index]  # "full_attention" or "sliding_attention"
        # the embeddings end in a LayerNorm: the first block does not normalise again
        self.attention_norm = layer_norm(config) if index else nn.Identity()
        self.attention = ModernBertAttention(config, self.attention_type)
        self.ffn_norm = layer_norm(config)
        self.ffn = GeGLU(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None,
                packed: Packed | None = None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask, packed)
        return x + self.ffn(self.ffn_norm(x))


class ModernBertPreTrainedModel(BertPreTrainedModel):
    """Shared by ModernBertModel and its heads: ModernBERT's init, and HF load/save (from BERT's)."""

    config: ModernBertConfig
    config_class = ModernBertConfig
    hf_architecture = "ModernBertModel"

    def _init_weights(self, module: nn.Module) -> None:
        """HF's init: normals cut at 2 std; std 0.02 into the residual stream, 0.02 / sqrt(2 L) out of
        it (attention and GeGLU outputs, the heads' dense), hidden_size^-0.5 for a classifier."""
        c = self.config
        std_in, std_out = c.initializer_range, c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)

        def normal(layer: nn.Module, std: float) -> None:
            nn.init.trunc_normal_(layer.weight, 0.0, std, -2 * std, 2 * std)
            if getattr(layer, "bias", None) is not None:
                nn.init.zeros_(layer.bias)

        if isinstance(module, ModernBertEmbeddings):
            normal(module.word_embeddings, std_in)
        elif isinstance(module, ModernBertAttention):
            normal(module.qkv, std_in), normal(module.out, std_out)
        elif isinstance(module, GeGLU):
            normal(module.up, std_in), normal(module.down, std_out)
        elif isinstance(module, ModernBertPredictionHead):
            normal(module.dense, std_out)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif module is getattr(self, "classifier", None):
            normal(module, c.hidden_size ** -0.5)
        elif module is getattr(self, "decoder", None) and module.bias is not None:
            nn.init.zeros_(module.bias)  # its weight is the word embeddings

    def init_module(self, name: str) -> None:
        """ModernBERT's init for the top-level module `name` and all within it (`hf.initialise`)."""
        self.get_submodule(name).apply(self._init_weights)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameter count (tied weights counted once)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= sum(p.numel() for m in self.modules() if isinstance(m, ModernBertEmbeddings) for p in m.parameters())
        return n


class ModernBertModel(ModernBertPreTrainedModel):
    """The ModernBERT encoder: `model(input_ids, attention_mask)` -> last hidden states (B, T, H)."""

    rotary = staticmethod(rotary)  # cos and sin of the positions (the fast path computes them in one op)

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = layer_norm(config)
        self.apply(self._init_weights)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, unpadded: bool | Packed = False) -> torch.Tensor:
        """input_ids, attention_mask (1 = token, 0 = pad): (B, T) -> (B, T, H). token_type_ids are
        ignored (ModernBERT has no segments; every bert-kit caller may pass them).

        unpadded=True (or a `Packed` layout of the mask) runs the layers on the real tokens only;
        the output is scattered back to (B, T, H), zeros at padding, equal to the padded result."""
        if not torch.compiler.is_compiling():
            check_inputs(self.config, input_ids, attention_mask, None)
        if isinstance(unpadded, Packed) or (unpadded and attention_mask is not None and input_ids.shape[0] > 0):
            packed = unpadded if isinstance(unpadded, Packed) else None
            ids, packed = unpad(input_ids, attention_mask, packed)  # (N,)
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
            return pad(self.encode(self.embeddings(ids), unpad(positions, attention_mask, packed)[0], packed=packed),
                       packed)
        T = input_ids.shape[1]
        keep = None if attention_mask is None else attention_mask.bool()
        masks = {kind: visible_keys(keep, T, self.config.sliding_window if kind == "sliding_attention" else None)
                 for kind in set(self.config.layer_types)}
        return self.encode(self.embeddings(input_ids), torch.arange(T, device=input_ids.device), masks)

    def forward_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                       position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Several sequences laid end to end: input_ids (N,), cu_seqlens (S + 1,) -> (N, H).
        Each sequence attends only to itself; positions restart at 0 for each unless given."""
        if position_ids is None:
            starts = torch.repeat_interleave(cu_seqlens[:-1], cu_seqlens[1:] - cu_seqlens[:-1])
            position_ids = torch.arange(input_ids.numel(), device=input_ids.device) - starts
        return self.encode(self.embeddings(input_ids), position_ids,
                           packed=Packed(cu_seqlens.to(torch.int32), int(max_seqlen)))

    def encode(self, x: torch.Tensor, positions: torch.Tensor, masks: dict | None = None,
               packed: Packed | None = None) -> torch.Tensor:
        """The layers and the final norm. x: (B, T, H) with positions (T,) and a mask per layer
        type, or packed (N, H) with positions (N,) and `packed`."""
        turns = {}
        for kind in set(self.config.layer_types):  # one rotation per theta, shared by its layers
            cos, sin = self.rotary(positions, self.config.rope_theta(kind), self.config.head_dim)  # (T | N, hd)
            turns[kind] = (cos, sin) if packed is None else (cos[:, None], sin[:, None])  # (N, 1, hd): per head
        for layer in self.layers:
            mask = None if masks is None else masks[layer.attention_type]
            x = layer(x, *turns[layer.attention_type], mask, packed)
        return self.final_norm(x)


# ---- heads ----------------------------------------------------------------------------------------

class ModernBertPredictionHead(nn.Module):
    """dense -> act -> norm, before the MLM decoder or a classifier: (..., H) -> (..., H)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = activation(config.classifier_activation)
        self.norm = layer_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """ModernBERT with the MLM head; the decoder's weight is the word embeddings."""

    hf_architecture = "ModernBertForMaskedLM"

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.bert = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.apply(self._init_weights)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                unpadded: bool | Packed = False, masked_index: torch.Tensor | None = None) -> torch.Tensor:
        """-> (B, T, V) logits, or (N, V) at the labelled positions when `labels` (B, T) or the
        flat `masked_index` (N,) is given (as BERTForMaskedLM)."""
        hidden = self.bert(input_ids, attention_mask, unpadded=unpadded)
        return self.decoder(self.head(select_masked(hidden, labels, masked_index)))


class _ModernBertClassifier(LabelledOutputs, ModernBertPreTrainedModel):
    """ModernBERT + head (dense, act, norm) + dropout + a linear layer to `num_labels` outputs."""

    def __init__(self, config: ModernBertConfig, num_labels: int = 2, classifier_dropout: float | None = None):
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.config, self.num_labels = config, num_labels
        self.bert = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.dropout = nn.Dropout(config.classifier_dropout if classifier_dropout is None else classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.apply(self._init_weights)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.head(x)))


class ModernBertForSequenceClassification(_ModernBertClassifier):
    """Pools the first token or the mean of the real ones (classifier_pooling), then the head."""

    hf_architecture = "ModernBertForSequenceClassification"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, unpadded: bool | Packed = False) -> torch.Tensor:
        """-> logits (B, num_labels)."""
        hidden = self.bert(input_ids, attention_mask, unpadded=unpadded)  # (B, T, H)
        if self.config.classifier_pooling == "cls":
            pooled = hidden[:, 0]
        else:
            keep = torch.ones_like(input_ids) if attention_mask is None else attention_mask
            keep = keep[..., None].to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * keep).sum(dim=1) / keep.sum(dim=1)
        return self.logits(pooled)


class ModernBertForTokenClassification(_ModernBertClassifier):
    """The head and a classifier on every token (NER)."""

    hf_architecture = "ModernBertForTokenClassification"

    def __init__(self, config: ModernBertConfig, num_labels: int = 9, classifier_dropout: float | None = None):
        super().__init__(config, num_labels, classifier_dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, unpadded: bool | Packed = False) -> torch.Tensor:
        """-> logits (B, T, num_labels)."""
        return self.logits(self.bert(input_ids, attention_mask, unpadded=unpadded))


class ModernBertForQuestionAnswering(_ModernBertClassifier):
    """Extractive QA: the head, then start and end logits for every token."""

    hf_architecture = "ModernBertForQuestionAnswering"

    def __init__(self, config: ModernBertConfig, classifier_dropout: float | None = None):
        super().__init__(config, 2, classifier_dropout)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                unpadded: bool | Packed = False) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (start_logits (B, T), end_logits (B, T))."""
        start, end = self.logits(self.bert(input_ids, attention_mask, unpadded=unpadded)).unbind(-1)
        return start, end


# HF architecture name -> our class (config.json "architectures"), as `bert_kit.heads.HEAD_CLASSES`
HEAD_CLASSES = {cls.hf_architecture: cls for cls in (
    ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification, ModernBertForTokenClassification,
    ModernBertForQuestionAnswering)}


# ---- FLOPs -----------------------------------------------------------------------------------------

def keys_seen(seq_len: int, window: int | None) -> float:
    """Keys a query sees on average in a sequence of `seq_len` tokens: all of them in a global layer,
    those within `window` positions on each side in a sliding-window layer (fewer near the ends)."""
    T = seq_len
    if window is None or window >= T - 1:
        return float(T)
    w = window
    beside = w * (w - 1) // 2 + (T - w) * w  # sum over positions i of min(i, w): keys on one side
    return (T + 2 * beside) / T


def flops_per_token(config: ModernBertConfig, seq_len: int, masked_fraction: float = 0.3,
                    training: bool = True) -> float:
    """Useful FLOPs per token of sequences of `seq_len` tokens (2 per multiply-add; training counts
    forward + backward, 3x the forward).

    Counts the layers' matmuls (Wqkv, Wo, GeGLU's Wi and Wo), attention's scores and weighted sums
    over the keys each layer's window really holds (`keys_seen`: a sliding layer at 8,192 tokens
    sees 129 keys, not 8,192), and in training the MLM head (dense, decoder) on the masked
    fraction only; embedding lookups, norms and rotations count nothing. Inference: the encoder.
    """
    H, I, V = config.hidden_size, config.intermediate_size, config.vocab_size
    matmuls = config.num_hidden_layers * (4 * H * H + 3 * H * I)  # multiply-adds per token
    attention = sum(2 * H * keys_seen(seq_len, config.sliding_window if kind == "sliding_attention" else None)
                    for kind in config.layer_types)
    if not training:
        return 2 * (matmuls + attention)
    return 6 * (matmuls + attention + masked_fraction * (H * H + H * V))


def estimate_mfu(config: ModernBertConfig, seq_len: int, tokens_per_s: float, peak_flops: float,
                 masked_fraction: float = 0.3, training: bool = True) -> float:
    """Model FLOPs utilisation: useful FLOP/s (`flops_per_token`) over the device's peak."""
    return flops_per_token(config, seq_len, masked_fraction, training) * tokens_per_s / peak_flops
