"""The BERT encoder and its heads in JAX, as Flax NNX modules that mirror `bert_kit/model.py` and
`bert_kit/heads.py` class for class and parameter name for parameter name: the one HF mapping of
`bert_kit/hf.py` serves both engines, and a folder saved by either loads in the other.

Architecture (as the torch model and HF `BertModel`):
- embeddings: token + learned position (or fixed sinusoidal) + segment, then LayerNorm, dropout;
- post-norm blocks: x = LN(x + Attn(x)); x = LN(x + FFN(x)), exact erf GELU, the config's
  LayerNorm eps (1e-12);
- bidirectional attention; padding is hidden from the keys by the attention mask;
- pooler: dense + tanh on [CLS]; heads return logits, losses are plain functions (`train.py`);
- the MLM decoder is tied to the word embeddings (only its bias is its own).

What differs from the torch file, and why:
- linear layers are `nnx.Linear`, whose kernel is (in, out), so x @ W needs no transpose; kernels
  are transposed once, where weights are loaded and saved (`weights.py`). They multiply the tokens
  as one (N, in) matrix (`tokens`: the weight's gradient is then one plain product);
- attention and each block's add & norm are spelled out (`attention`: scores, mask, softmax,
  dropout, values; `residual_norm`: dropout, residual, LayerNorm), the references the fused kernels
  of `bert_kit/jax/kernels/` are held to; `kernels.fast_path.apply(model)` puts them on a model (the
  engine does), nothing here picks one. Their dropout keeps each element by a hash of a seed and
  its position (`randomness.dropout_keep`), so a kernel draws the same mask;
- randomness is explicit: dropout runs only when a call passes `rngs` (an `nnx.Rngs` with a
  `dropout` stream, or any object whose `.dropout()` gives a new key: a jitted step passes
  `HostKeys` of the key it is given). Without it the model is in eval mode;
- precision: parameters live in float32. Cast them to bfloat16 (`train.cast`) and the forward runs
  in bfloat16, with LayerNorm statistics, softmax and losses in float32; the embedding tables stay
  float32, so their gradients add up in float32 (segments by a one-hot matmul);
- the MLM head predicts at fixed slots per row, `masked_positions` (B, P), as Google's BERT did
  (max_predictions_per_seq): shapes stay static under jit and the slots shard with the batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_kit.config import BertConfig
from bert_kit.jax.randomness import HostKeys, derive, dropout_keep, dropout_seed


class StaticConfig(BertConfig):
    """A `BertConfig` that can be hashed: NNX keeps a module's plain attributes in its graph
    definition, which `nnx.jit` hashes."""

    def __hash__(self) -> int:  # id2label, a dict, as its items
        return hash(tuple((k, tuple(v.items()) if isinstance(v, dict) else v) for k, v in asdict(self).items()))


def tokens(x: jax.Array) -> jax.Array:
    """(..., H) -> (N, H), the leading axes as one. A weight's gradient is then one (H, N) @ (N, H')
    product; over (B, T, H) it contracts two axes, and XLA's GPU compiler first copies x into
    (H, B, T) order."""
    return x.reshape(-1, x.shape[-1])


class Linear(nnx.Linear):
    """`nnx.Linear` over the last axis, the leading ones flattened (`tokens`): (..., in) -> (..., out)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return super().__call__(tokens(x)).reshape(*x.shape[:-1], -1)


def dense(n_in: int, n_out: int, config: BertConfig, rngs: nnx.Rngs) -> Linear:
    """A linear layer with BERT's init: N(0, initializer_range) kernel (in, out), zero bias."""
    return Linear(n_in, n_out, kernel_init=nnx.initializers.normal(config.initializer_range), rngs=rngs)


def dropout(module: nnx.Dropout, x: jax.Array, rngs: nnx.Rngs | None) -> jax.Array:
    """Dropout at `module`'s rate when the call trains (rngs given), the identity in eval: x (..., H)
    as (N, H) tokens, its mask drawn as a block's (`residual_dropout`), not by `jax.random`'s bits."""
    if rngs is None or module.rate == 0:
        return x
    return residual_dropout(tokens(x), module.rate, dropout_seed(rngs)).reshape(x.shape)


class LayerNorm(nnx.Module):
    """LayerNorm over the last dimension, statistics in float32 whatever the input dtype; the
    output keeps the input's dtype. Parameters named as torch's: weight, bias."""

    def __init__(self, hidden_size: int, eps: float = 1e-12):
        self.weight = nnx.Param(jnp.ones(hidden_size))
        self.bias = nnx.Param(jnp.zeros(hidden_size))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.weight[...] + self.bias[...]).astype(x.dtype)


def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU as torch writes it, x/2 (1 + erf(x/sqrt 2)), in float32. `jax.nn.gelu` computes
    erfc(-x/sqrt 2), whose float32 code evaluates both of its branches (one an exp) for every element."""
    x32 = x.astype(jnp.float32)
    return (0.5 * x32 * (1.0 + jax.lax.erf(x32 * (1.0 / math.sqrt(2.0))))).astype(x.dtype)


def activation(name: str, x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, as BERT, or ReLU."""
    return gelu(x) if name == "gelu" else jax.nn.relu(x)


@functools.lru_cache(maxsize=8)
def sinusoidal_table(num_positions: int, dim: int) -> np.ndarray:
    """Fixed sin/cos position table of Vaswani et al.: (num_positions, dim), float32, computed in
    float64 as the torch model does (a constant, not a parameter)."""
    position = np.arange(num_positions, dtype=np.float64)[:, None]
    freq = np.exp(np.arange(0, dim, 2, dtype=np.float64) * (-math.log(10000.0) / dim))
    table = np.zeros((num_positions, dim), dtype=np.float64)
    table[:, 0::2] = np.sin(position * freq)
    table[:, 1::2] = np.cos(position * freq[: dim // 2])
    return table.astype(np.float32)


class BertEmbeddings(nnx.Module):
    """Token + position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs):
        init = nnx.initializers.normal(config.initializer_range)
        H = config.hidden_size
        self.word_embeddings = nnx.Embed(config.vocab_size, H, embedding_init=init, rngs=rngs)
        # the padding row starts at zero and, as torch's padding_idx, takes no gradient from lookups
        table = self.word_embeddings.embedding
        table[...] = table[...].at[config.pad_token_id].set(0.0)
        self.pad_token_id = config.pad_token_id
        self.learned_positions = config.position_embedding_type == "learned"
        if self.learned_positions:
            self.position_embeddings = nnx.Embed(config.max_position_embeddings, H, embedding_init=init, rngs=rngs)
        self.max_positions = config.max_position_embeddings
        self.token_type_embeddings = nnx.Embed(config.type_vocab_size, H, embedding_init=init, rngs=rngs)
        self.norm = LayerNorm(H, config.layer_norm_eps)
        self.dropout = nnx.Dropout(config.hidden_dropout_prob)

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array | None = None,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        """input_ids, token_type_ids: (B, T) -> (B, T, H)."""
        T = input_ids.shape[-1]
        f32 = jnp.float32
        # the tables are float32 in any precision (`train.cast`): the backward adds each token's
        # gradient into its row (a scatter-add), which in 16 bits would lose precision and, on a GPU, run 10x slower
        table = self.word_embeddings.embedding[...]  # (V, H)
        words = jnp.take(table.astype(f32), input_ids, axis=0)  # (B, T, H)
        words = jnp.where((input_ids == self.pad_token_id)[..., None], jax.lax.stop_gradient(words), words)
        if self.learned_positions:
            positions = self.position_embeddings.embedding[:T].astype(f32)  # (T, H)
        else:
            positions = jnp.asarray(sinusoidal_table(self.max_positions, words.shape[-1])[:T])
        segment_table = self.token_type_embeddings.embedding[...].astype(f32)  # (type_vocab_size, H)
        if token_type_ids is None:  # all sentence A: row 0 of the segment table
            segments = segment_table[0]
        else:  # a one-hot matmul on the tokens: its backward is a matmul, not B * T scatter-adds into two rows
            one_hot = jax.nn.one_hot(token_type_ids.reshape(-1), segment_table.shape[0], dtype=f32)  # (N, types)
            segments = (one_hot @ segment_table).reshape(words.shape)  # exact
        # the sum in float32; the output in the compute dtype, that of the LayerNorm's weights; the
        # norm and dropout on the tokens, as in the blocks
        x = self.norm(tokens(words + positions + segments)).astype(self.norm.weight[...].dtype)
        return dropout(self.dropout, x, rngs).reshape(words.shape)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None, dropout_rate: float = 0.0,
              seed: jax.Array | None = None) -> jax.Array:
    """Softmax attention of (B, T, nh, hd) q, k, v -> (B, T, nh, hd): keys hidden where the (B, T)
    bool mask is False, and with a `seed`, dropout on the probabilities (`dropout_keep`),
    the kept ones scaled by 1 / (1 - rate). Scores and softmax in float32."""
    B, T, nh, hd = q.shape
    # 16-bit products into float32 scores; the preset keeps the backward's products 16-bit too (as
    # jax.nn.dot_product_attention does), where the float32 scores' gradient would make them float32
    def scores(preset: jax.lax.DotAlgorithmPreset | None) -> Callable:
        return lambda q, k: jnp.einsum("btnh,bsnh->bnts", q, k, precision=preset, preferred_element_type=jnp.float32)

    preset = {jnp.dtype(jnp.bfloat16): jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
              jnp.dtype(jnp.float16): jax.lax.DotAlgorithmPreset.F16_F16_F32}.get(q.dtype)
    if q.dtype == jnp.float16:  # XLA's CPU backend has no F16_F16_F32: the default algorithm there,
        # chosen for the devices the program is compiled for (a CPU run on a machine with GPUs too)
        logits = jax.lax.platform_dependent(q, k, cpu=scores(None), default=scores(preset))
    else:
        logits = scores(preset)(q, k)
    logits = logits / math.sqrt(hd)  # (B, nh, T, T)
    if mask is not None:
        logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    if dropout_rate > 0 and seed is not None:
        batch_head = (jnp.arange(B)[:, None] * nh + jnp.arange(nh))[:, :, None, None]  # (B, nh, 1, 1)
        keep = dropout_keep(seed, batch_head, jnp.arange(T)[:, None], jnp.arange(T), T, dropout_rate)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bnts,bsnh->btnh", probs.astype(v.dtype), v)


class MultiHeadAttention(nnx.Module):
    """Bidirectional multi-head self-attention with a fused QKV projection."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs):
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = dense(H, 3 * H, config, rngs)  # kernel columns: [query | key | value]
        self.out = dense(H, H, config, rngs)
        self.dropout_rate = config.attention_probs_dropout_prob
        # a fused kernel computing `attention`, put here by `bert_kit.jax.kernels.fast_path.apply`
        self.backend: Callable | None = None

    def __call__(self, x: jax.Array, mask: jax.Array | None = None, rngs: nnx.Rngs | None = None) -> jax.Array:
        """x: (B, T, H) with mask (B, T) bool (True = attend) -> (B, T, H)."""
        B, T, H = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each (B, T, nh, hd)
        rate = self.dropout_rate if rngs is not None else 0.0  # dropout only in training
        seed = dropout_seed(rngs) if rate > 0 else None
        y = (self.backend or attention)(q, k, v, mask, rate, seed)
        return self.out(y.reshape(B, T, H))


class FeedForward(nnx.Module):
    """Position-wise MLP: H -> intermediate -> H with GELU (or ReLU)."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs):
        self.up = dense(config.hidden_size, config.intermediate_size, config, rngs)
        self.act = config.hidden_act
        self.down = dense(config.intermediate_size, config.hidden_size, config, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(activation(self.act, self.up(x)))


def residual_keep(seed: jax.Array, N: int, H: int, rate: float) -> jax.Array:
    """(N, H) bool: the elements of a block's (N, H) residual branch that dropout keeps, y[n, c] by
    `dropout_keep(seed, 0, n, c, H, rate)`, so a fused kernel (`kernels/residual_norm.py`) draws the same mask."""
    return dropout_keep(seed, 0, jnp.arange(N)[:, None], jnp.arange(H), H, rate)


def residual_dropout(y: jax.Array, rate: float, seed: jax.Array) -> jax.Array:
    """(N, H) y with dropout: y / (1 - rate) where `residual_keep`, else 0, in y's dtype."""
    return jnp.where(residual_keep(seed, *y.shape, rate), y / (1.0 - rate), 0.0).astype(y.dtype)


def residual_norm(x: jax.Array, y: jax.Array, norm: LayerNorm, rate: float = 0.0,
                  seed: jax.Array | None = None) -> jax.Array:
    """norm(x + dropout(y)), a post-norm block's add & norm, of (N, H) tokens -> (N, H); dropout
    only with a `seed` (`residual_dropout`)."""
    if rate > 0 and seed is not None:
        y = residual_dropout(y, rate, seed)
    return norm(x + y)


class TransformerEncoderBlock(nnx.Module):
    """One post-norm encoder layer: attention -> add & norm -> feed-forward -> add & norm."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs):
        self.attention = MultiHeadAttention(config, rngs)
        self.attention_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.ffn = FeedForward(config, rngs)
        self.ffn_norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.dropout_rate = config.hidden_dropout_prob
        # a fused kernel computing `residual_norm`, put here by `bert_kit.jax.kernels.fast_path.apply`
        self.add_norm: Callable | None = None

    def __call__(self, x: jax.Array, mask: jax.Array | None = None, rngs: nnx.Rngs | None = None) -> jax.Array:
        """x: (B, T, H) -> (B, T, H); all but attention on the (B * T, H) tokens (`tokens`): the norms'
        and biases' gradients are then sums over one axis, which XLA's GPU compiler reduces in place,
        where over (B, T) it kept a transposed copy of the residual stream (5% of BERT-base's step)."""
        add_norm = self.add_norm or residual_norm
        rate = self.dropout_rate if rngs is not None else 0.0  # dropout only in training
        h = add_norm(tokens(x), tokens(self.attention(x, mask, rngs)), self.attention_norm, rate,
                     dropout_seed(rngs) if rate > 0 else None)
        h = add_norm(h, self.ffn(h), self.ffn_norm, rate, dropout_seed(rngs) if rate > 0 else None)
        return h.reshape(x.shape)


class BertEncoder(nnx.Module):
    """A stack of `num_hidden_layers` encoder blocks, called in turn.

    With `scan` set, the same blocks run as one `jax.lax.scan` over their stacked weights: a program
    holds one block, not L, so it traces and compiles in half the time, and each step runs slower
    (the engine scans short fine-tunes only). Outputs are the loop's; each block's dropout keys
    come from its own key of `rngs`, `derive(rngs.dropout(), jnp.arange(L))`."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs, scan: bool = False):
        self.layers = nnx.List([TransformerEncoderBlock(config, rngs) for _ in range(config.num_hidden_layers)])
        self.scan = scan

    def __call__(self, x: jax.Array, mask: jax.Array | None = None, rngs: nnx.Rngs | None = None) -> jax.Array:
        if self.scan and len(self.layers) > 1:
            return scan_blocks(list(self.layers), x, mask, rngs)
        for layer in self.layers:
            x = layer(x, mask, rngs)
        return x


def scan_blocks(layers: list[nnx.Module], x: jax.Array, mask: jax.Array | None, rngs: nnx.Rngs | None) -> jax.Array:
    """x (B, T, H) through `layers` (blocks of one structure) by `jax.lax.scan`: the blocks' weights
    stacked on a new first axis (L, ...), one block traced. Blocks that differ in structure (a
    kernel on some only) are called in turn."""
    graphdefs, states = zip(*(nnx.split(layer) for layer in layers))
    if any(g != graphdefs[0] for g in graphdefs[1:]):
        for layer in layers:
            x = layer(x, mask, rngs)
        return x
    stacked = jax.tree.map(lambda *w: jnp.stack(w), *states)  # each weight (L, ...)
    keys = None if rngs is None else derive(rngs.dropout(), jnp.arange(len(layers)))

    def block(x: jax.Array, weights_and_key: tuple) -> tuple[jax.Array, None]:
        state, key = weights_and_key
        return nnx.merge(graphdefs[0], state)(x, mask, None if key is None else HostKeys(key)), None

    return jax.lax.scan(block, x, (stacked, keys))[0]


class BertPooler(nnx.Module):
    """Dense + tanh on the [CLS] position: (B, T, H) -> (B, H)."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs):
        self.dense = dense(config.hidden_size, config.hidden_size, config, rngs)

    def __call__(self, hidden: jax.Array) -> jax.Array:
        return jnp.tanh(self.dense(hidden[:, 0]))


def check_inputs(config: BertConfig, input_ids: jax.Array, attention_mask: jax.Array | None,
                 token_type_ids: jax.Array | None) -> None:
    """Clear errors for bad ids, masks and shapes, with the messages of the torch model's
    `check_inputs`: out-of-vocabulary ids would give NaN logits, type ids past type_vocab_size
    silently wrong ones. Shapes and dtypes are static (free under jit); values are checked on the
    host when the arrays are concrete, outside jitted code (a traced step cannot stop on a value;
    the engine's batches come from bert-kit's tokenizers and collators)."""
    if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
        raise ValueError(f"input_ids must be integers of shape (batch, seq_len), got {input_ids.dtype} "
                         f"{tuple(input_ids.shape)}")
    B, T = input_ids.shape
    if T == 0 and B > 0:
        raise ValueError(f"input_ids has no tokens (shape {tuple(input_ids.shape)}): a sequence holds at least "
                         "[CLS] and [SEP]")
    if T > config.max_position_embeddings:
        raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                         f"({config.max_position_embeddings}); truncate the input")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} does not match input_ids {tuple(input_ids.shape)}")
    if token_type_ids is not None and not jnp.issubdtype(token_type_ids.dtype, jnp.integer):
        raise TypeError(f"token_type_ids must be integers, got {token_type_ids.dtype}")
    given = [t for t in (input_ids, attention_mask, token_type_ids) if t is not None]
    if not input_ids.size or any(isinstance(t, jax.core.Tracer) for t in given):
        return
    ids = np.asarray(input_ids)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= config.vocab_size:
        raise ValueError(f"token id {lo if lo < 0 else hi} out of range for vocab_size {config.vocab_size}")
    if token_type_ids is not None:
        types = np.asarray(token_type_ids)
        lo, hi = int(types.min()), int(types.max())
        if lo < 0 or hi >= config.type_vocab_size:
            raise ValueError(f"token_type id {lo if lo < 0 else hi} out of range for type_vocab_size "
                             f"{config.type_vocab_size}")
    if attention_mask is not None:
        mask = np.asarray(attention_mask)
        odd = mask[(mask != 0) & (mask != 1)]
        if odd.size:
            raise ValueError(f"attention_mask must hold only 0 (padding) and 1 (token), found {odd[:3].tolist()}")
        empty = np.flatnonzero((mask != 0).sum(axis=1) == 0)
        if empty.size:
            raise ValueError(f"attention_mask row {int(empty[0])} is all zeros: every sequence needs at least one "
                             "token")


class BertPreTrainedModel(nnx.Module):
    """Shared by BERTModel and every head: HF-compatible load and save (`weights.py`)."""

    config: BertConfig
    hf_architecture = "BertModel"  # the class name `transformers` loads a saved folder with

    @classmethod
    def from_pretrained(cls, folder: str | Path, strict: bool = False, seed: int = 0, **head_args):
        """Load an HF or bert-kit model folder (or the local copy of a hub name); new head weights
        are drawn from `seed`."""
        from bert_kit.jax.weights import from_pretrained

        return from_pretrained(cls, folder, strict=strict, seed=seed, **head_args)

    @classmethod
    def shapes(cls, config: BertConfig, seed: int = 0, **head_args) -> BertPreTrainedModel:
        """The model of `config` as shapes only (`nnx.eval_shape`), for weights loaded in after: no
        random weight is drawn, nor its key traced (`HostKeys`)."""
        return nnx.eval_shape(lambda: cls(config, rngs=HostKeys(jax.random.key(seed)), **head_args))

    def save_pretrained(self, folder: str | Path, tokenizer: str | Path | None = None) -> None:
        """Write config.json + model.safetensors that bert-kit's PyTorch side and `transformers`
        load unchanged, and the tokenizer files of `tokenizer` (a folder) beside them."""
        from bert_kit.jax.weights import save_pretrained

        save_pretrained(self, folder, tokenizer)

    def num_parameters(self) -> int:
        """Parameter count (the tied decoder counted once: it has no weight of its own)."""
        return sum(p.size for p in jax.tree.leaves(nnx.state(self, nnx.Param)))


class BERTModel(BertPreTrainedModel):
    """The BERT encoder with its pooler.

    `model(input_ids, attention_mask, token_type_ids)` -> last hidden states (B, T, H);
    `model.pool(hidden)` -> pooled [CLS] output (B, H).
    """

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = StaticConfig(**asdict(config))
        self.embeddings = BertEmbeddings(config, rngs)
        self.encoder = BertEncoder(config, rngs)
        self.pooler = BertPooler(config, rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        """input_ids, attention_mask (1 = token, 0 = pad), token_type_ids: (B, T) -> (B, T, H).
        rngs: an `nnx.Rngs` with a `dropout` stream to train with dropout; None is eval."""
        check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        mask = None if attention_mask is None else attention_mask.astype(bool)  # (B, T)
        x = self.embeddings(input_ids, token_type_ids, rngs)  # (B, T, H)
        return self.encoder(x, mask, rngs)

    def pool(self, hidden: jax.Array) -> jax.Array:
        """Pooled output: tanh(W h_[CLS] + b), (B, T, H) -> (B, H)."""
        return self.pooler(hidden)


# ---- heads (bert_kit/heads.py) ----------------------------------------------------------------

class TiedDecoder(nnx.Module):
    """The MLM output layer: its weight is the word-embedding table, only the bias is its own."""

    def __init__(self, vocab_size: int):
        self.bias = nnx.Param(jnp.zeros(vocab_size))

    def __call__(self, x: jax.Array, table: jax.Array) -> jax.Array:
        """x (..., H), table (V, H) -> logits (..., V)."""
        logits = tokens(x) @ table.astype(x.dtype).T + self.bias[...].astype(x.dtype)  # (N, V)
        return logits.reshape(*x.shape[:-1], -1)


class MLMHead(nnx.Module):
    """Transform (dense + GELU + LayerNorm), then the decoder tied to the word embeddings."""

    def __init__(self, config: BertConfig, rngs: nnx.Rngs):
        self.dense = dense(config.hidden_size, config.hidden_size, config, rngs)
        self.act = config.hidden_act
        self.norm = LayerNorm(config.hidden_size, config.layer_norm_eps)
        self.decoder = TiedDecoder(config.vocab_size)

    def __call__(self, hidden: jax.Array, table: jax.Array) -> jax.Array:
        """(..., H) and the word embeddings (V, H) -> (..., V), computed on the (N, H) tokens."""
        logits = self.decoder(self.norm(activation(self.act, self.dense(tokens(hidden)))), table)
        return logits.reshape(*hidden.shape[:-1], -1)


def select_masked(hidden: jax.Array, masked_positions: jax.Array | None) -> jax.Array:
    """(B, T, H) -> (B, P, H) at each row's P prediction slots; unchanged without slots."""
    if masked_positions is None:
        return hidden
    return jnp.take_along_axis(hidden, masked_positions[..., None], axis=1)


class _TiedMLM(BertPreTrainedModel):
    """BERT + the MLM head, whose decoder reads the word embeddings (one array, counted once)."""

    def mlm_logits(self, hidden: jax.Array, masked_positions: jax.Array | None) -> jax.Array:
        table = self.bert.embeddings.word_embeddings.embedding[...]
        return self.mlm(select_masked(hidden, masked_positions), table)


class BERTForMaskedLM(_TiedMLM):
    """BERT with the masked-language-model head."""

    hf_architecture = "BertForMaskedLM"

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = StaticConfig(**asdict(config))
        self.bert = BERTModel(config, rngs=rngs)
        self.mlm = MLMHead(config, rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, masked_positions: jax.Array | None = None, *,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        """-> (B, T, V) logits, or (B, P, V) at the (B, P) `masked_positions`."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, rngs=rngs)
        return self.mlm_logits(hidden, masked_positions)


class BERTForPreTraining(_TiedMLM):
    """BERT with the MLM head and the next-sentence-prediction head (pretraining)."""

    hf_architecture = "BertForPreTraining"

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = StaticConfig(**asdict(config))
        self.bert = BERTModel(config, rngs=rngs)
        self.mlm = MLMHead(config, rngs)
        self.nsp = dense(config.hidden_size, 2, config, rngs)  # 0 = B follows A, 1 = B is random (HF)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, masked_positions: jax.Array | None = None, *,
                 rngs: nnx.Rngs | None = None) -> tuple[jax.Array, jax.Array]:
        """-> (mlm_logits (B, T, V), or (B, P, V) at `masked_positions`, nsp_logits (B, 2))."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, rngs=rngs)
        return self.mlm_logits(hidden, masked_positions), self.nsp(self.bert.pool(hidden))


class _Classifier(BertPreTrainedModel):
    """BERT + dropout + a linear layer to `num_labels` outputs (shared by the two heads below)."""

    def __init__(self, config: BertConfig, num_labels: int = 2, classifier_dropout: float | None = None, *,
                 rngs: nnx.Rngs | None = None):
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = StaticConfig(**asdict(config))
        self.num_labels = num_labels
        self.bert = BERTModel(config, rngs=rngs)
        self.dropout = nnx.Dropout(config.hidden_dropout_prob if classifier_dropout is None else classifier_dropout)
        self.classifier = dense(config.hidden_size, num_labels, config, rngs)


class BERTForSequenceClassification(_Classifier):
    """Pooled [CLS] -> dropout -> linear. num_labels=1 makes it a regression head (e.g. STS-B)."""

    hf_architecture = "BertForSequenceClassification"

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        """-> logits (B, num_labels)."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, rngs=rngs)
        return self.classifier(dropout(self.dropout, self.bert.pool(hidden), rngs))


class BERTForTokenClassification(_Classifier):
    """Per-token linear classifier (NER, POS tagging)."""

    hf_architecture = "BertForTokenClassification"

    def __init__(self, config: BertConfig, num_labels: int = 9, classifier_dropout: float | None = None, *,
                 rngs: nnx.Rngs | None = None):
        super().__init__(config, num_labels, classifier_dropout, rngs=rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        """-> logits (B, T, num_labels)."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, rngs=rngs)
        return self.classifier(dropout(self.dropout, hidden, rngs))


class BERTForQuestionAnswering(BertPreTrainedModel):
    """Extractive QA: a linear layer gives start and end logits for every token."""

    hf_architecture = "BertForQuestionAnswering"

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = StaticConfig(**asdict(config))
        self.bert = BERTModel(config, rngs=rngs)
        self.qa_outputs = dense(config.hidden_size, 2, config, rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None, *,
                 rngs: nnx.Rngs | None = None) -> tuple[jax.Array, jax.Array]:
        """-> (start_logits (B, T), end_logits (B, T))."""
        hidden = self.bert(input_ids, attention_mask, token_type_ids, rngs=rngs)
        logits = self.qa_outputs(hidden)  # (B, T, 2)
        return logits[..., 0], logits[..., 1]


# HF architecture name -> our class (config.json "architectures"), as `bert_kit.heads.HEAD_CLASSES`
HEAD_CLASSES = {cls.hf_architecture: cls for cls in (BERTModel, BERTForPreTraining, BERTForMaskedLM,
                                                      BERTForSequenceClassification, BERTForTokenClassification,
                                                      BERTForQuestionAnswering)}
