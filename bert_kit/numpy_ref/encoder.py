"""The BERT encoder in NumPy: embeddings, self-attention, feed-forward, encoder layer, layer stack.

Architecture (HF BERT, so weights move to and from the torch engines):

* embeddings = LayerNorm(token + position + segment), eps 1e-12; positions are learned by default,
  or a fixed sinusoidal table (``position_embedding="sinusoidal"``, not trained);
* post-norm layers: ``h = LN(x + Attention(x)); out = LN(h + FFN(h))``;
* attention: separate query/key/value projections, scores scaled by 1/sqrt(head_dim), an optional
  padding mask (B, T) with 1 = attend and 0 = ignore;
* feed-forward: Linear(H, F) -> GELU (exact erf) or ReLU -> Linear(F, H).

No dropout (the engine is deterministic). All maths is batched: no Python loops over the batch,
positions or heads. Shapes: B batch, T sequence length, H dim_model, nh heads, hd = H / nh.
"""

from __future__ import annotations

import numpy as np

from .layers import PAD_ID, Embedding, LayerNorm, Linear, Module, make_activation, softmax


def check_ids(name: str, ids, upper: int, *, ndim: int = 2, allow_padding: bool = False) -> np.ndarray:
    """Return ``ids`` as an integer array after checking rank and range [0, upper) (or -1 if allowed)."""
    ids = np.asarray(ids)
    if ids.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    low = -1 if allow_padding else 0
    bad = (ids < low) | (ids >= upper)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        allowed = f"[0, {upper})" + (" or -1 for padding" if allow_padding else "")
        raise ValueError(f"{name}[{where}] = {ids[where]} is out of range; expected {allowed}")
    return ids


def sinusoidal_positions(max_seq_len: int, dim: int, dtype=np.float32) -> np.ndarray:
    """Fixed table (max_seq_len, dim): sin on even features, cos on odd ones (Vaswani et al.)."""
    pos = np.arange(max_seq_len, dtype=np.float64)[:, None]           # (P, 1)
    freq = np.exp(-np.log(10000.0) * np.arange(0, dim, 2) / dim)       # (ceil(dim/2),)
    table = np.zeros((max_seq_len, dim), dtype=np.float64)
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq[: dim // 2])
    return table.astype(dtype)


class BertEmbeddings(Module):
    """LayerNorm(token + position + segment embeddings): ids (B, T) -> (B, T, H)."""

    def __init__(self, vocab_size: int, dim_model: int, max_seq_len: int, num_segment_types: int = 2,
                 *, eps: float = 1e-12, position_embedding: str = "learned", dtype=np.float32,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        if position_embedding not in ("learned", "sinusoidal"):
            raise ValueError(f"position_embedding must be 'learned' or 'sinusoidal', got {position_embedding!r}")
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len
        self.num_segment_types, self.position_embedding = num_segment_types, position_embedding
        self.word_embeddings = Embedding(vocab_size, dim_model, padding_idx=PAD_ID, dtype=dtype, rng=rng)
        if position_embedding == "learned":
            self.position_embeddings = Embedding(max_seq_len, dim_model, dtype=dtype, rng=rng)
        else:  # a constant, so it lives outside params and gets no gradient
            self._position_table = sinusoidal_positions(max_seq_len, dim_model, dtype)
        self.token_type_embeddings = Embedding(num_segment_types, dim_model, dtype=dtype, rng=rng)
        self.norm = LayerNorm(dim_model, eps, dtype=dtype)

    def position_table(self) -> np.ndarray:
        """(max_seq_len, H): the learned matrix or the fixed sinusoidal one."""
        if self.position_embedding == "learned":
            return self.position_embeddings.params["weight"]
        return self._position_table

    def forward(self, token_ids: np.ndarray, segment_ids: np.ndarray | None = None) -> np.ndarray:
        """token_ids, segment_ids: (B, T) ints (segments default to 0) -> (B, T, H)."""
        token_ids = check_ids("token_ids", token_ids, self.vocab_size)
        batch, seq_len = token_ids.shape
        if seq_len > self.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_seq_len {self.max_seq_len}")
        if segment_ids is None:
            segment_ids = np.zeros_like(token_ids)
        segment_ids = check_ids("segment_ids", segment_ids, self.num_segment_types)
        if segment_ids.shape != token_ids.shape:
            raise ValueError(f"segment_ids shape {segment_ids.shape} != token_ids shape {token_ids.shape}")
        # Every sequence uses positions 0..T-1; broadcasting shares them across the batch.
        positions = np.broadcast_to(np.arange(seq_len), (batch, seq_len))
        if self.position_embedding == "learned":
            pos = self.position_embeddings(positions)
        else:
            pos = self._position_table[:seq_len][None]
        summed = self.word_embeddings(token_ids) + pos + self.token_type_embeddings(segment_ids)
        return self.norm(summed)

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> None:
        """grad_out: (B, T, H). The sum sends the same gradient to each of the three tables."""
        grad_sum = self.norm.backward(grad_out, lr)
        self.word_embeddings.backward(grad_sum, lr)
        if self.position_embedding == "learned":
            self.position_embeddings.backward(grad_sum, lr)
        self.token_type_embeddings.backward(grad_sum, lr)

    # Name used by the original API; it updates all tables, not only the token one.
    backward_embed = backward


class MultiHeadSelfAttention(Module):
    """softmax(Q K^T / sqrt(hd) + mask) V over nh heads, then an output projection: (B, T, H) -> (B, T, H)."""

    def __init__(self, dim_model: int, num_heads: int, *, dtype=np.float32,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        if num_heads <= 0 or dim_model % num_heads != 0:
            raise ValueError(f"dim_model ({dim_model}) must be divisible by num_heads ({num_heads})")
        rng = rng if rng is not None else np.random.default_rng(0)
        self.dim_model, self.num_heads = dim_model, num_heads
        self.head_dim = dim_model // num_heads
        self.scale = self.head_dim ** -0.5
        self.query = Linear(dim_model, dim_model, dtype=dtype, rng=rng)
        self.key = Linear(dim_model, dim_model, dtype=dtype, rng=rng)
        self.value = Linear(dim_model, dim_model, dtype=dtype, rng=rng)
        self.output = Linear(dim_model, dim_model, dtype=dtype, rng=rng)

    def _split_heads(self, x: np.ndarray) -> np.ndarray:
        batch, seq_len, _ = x.shape
        return x.reshape(batch, seq_len, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)  # (B, nh, T, hd)

    def _merge_heads(self, x: np.ndarray) -> np.ndarray:
        batch, _, seq_len, _ = x.shape
        return x.transpose(0, 2, 1, 3).reshape(batch, seq_len, self.dim_model)  # (B, T, H)

    def forward(self, x: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        """x: (B, T, H); attention_mask: (B, T), 1 = real token, 0 = padding (never attended to)."""
        if x.ndim != 3 or x.shape[-1] != self.dim_model:
            raise ValueError(f"attention input must be (batch, seq_len, {self.dim_model}), got {x.shape}")
        q = self._split_heads(self.query(x))  # (B, nh, T, hd)
        k = self._split_heads(self.key(x))
        v = self._split_heads(self.value(x))
        scores = (q @ k.transpose(0, 1, 3, 2)) * self.scale  # (B, nh, T, T)
        if attention_mask is not None:
            keep = np.asarray(attention_mask).astype(bool)[:, None, None, :]  # (B, 1, 1, T)
            # The dtype's minimum (as HF) makes exp() exactly 0 without producing inf - inf = nan.
            scores = np.where(keep, scores, np.finfo(scores.dtype).min)
        probs = softmax(scores, axis=-1)  # (B, nh, T, T), rows sum to 1
        context = self._merge_heads(probs @ v)  # (B, T, H)
        self._cache = (q, k, v, probs)
        return self.output(context)

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        q, k, v, probs = self._require_cache()
        grad_context = self._split_heads(self.output.backward(grad_out, lr))  # (B, nh, T, hd)
        # context = probs @ v: the two matmul rules
        grad_probs = grad_context @ v.transpose(0, 1, 3, 2)  # (B, nh, T, T)
        grad_v = probs.transpose(0, 1, 3, 2) @ grad_context   # (B, nh, T, hd)
        # Softmax Jacobian per row: ds = p * (dp - sum(dp * p)); masked entries have p = 0, so ds = 0.
        grad_scores = probs * (grad_probs - (grad_probs * probs).sum(axis=-1, keepdims=True))
        grad_scores *= self.scale
        # scores = q @ k^T (scaled): dq = ds @ k, dk = ds^T @ q
        grad_q = grad_scores @ k
        grad_k = grad_scores.transpose(0, 1, 3, 2) @ q
        # x feeds all three projections, so its gradient is the sum of the three paths.
        return (self.query.backward(self._merge_heads(grad_q), lr)
                + self.key.backward(self._merge_heads(grad_k), lr)
                + self.value.backward(self._merge_heads(grad_v), lr))


class FeedForward(Module):
    """Position-wise MLP: Linear(H, F) -> activation -> Linear(F, H); (B, T, H) -> (B, T, H)."""

    def __init__(self, dim_model: int, dim_hidden: int, *, activation: str = "gelu", dtype=np.float32,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        self.dense_in = Linear(dim_model, dim_hidden, dtype=dtype, rng=rng)
        self.act = make_activation(activation)
        self.dense_out = Linear(dim_hidden, dim_model, dtype=dtype, rng=rng)

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.dense_out(self.act(self.dense_in(x)))

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        # Chain rule, last layer first.
        return self.dense_in.backward(self.act.backward(self.dense_out.backward(grad_out, lr)), lr)


class TransformerEncoderBlock(Module):
    """One post-norm encoder layer: h = LN(x + Attn(x)); out = LN(h + FFN(h))."""

    def __init__(self, dim_model: int, num_heads: int, dim_ff: int, *, activation: str = "gelu",
                 eps: float = 1e-12, dtype=np.float32, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        self.attention = MultiHeadSelfAttention(dim_model, num_heads, dtype=dtype, rng=rng)
        self.attention_norm = LayerNorm(dim_model, eps, dtype=dtype)
        self.ffn = FeedForward(dim_model, dim_ff, activation=activation, dtype=dtype, rng=rng)
        self.ffn_norm = LayerNorm(dim_model, eps, dtype=dtype)

    def forward(self, x: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        h = self.attention_norm(x + self.attention(x, attention_mask))
        return self.ffn_norm(h + self.ffn(h))

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        # A residual y = x + f(x) passes the gradient straight through and adds f's path.
        grad_h_sum = self.ffn_norm.backward(grad_out, lr)
        grad_h = grad_h_sum + self.ffn.backward(grad_h_sum, lr)
        grad_x_sum = self.attention_norm.backward(grad_h, lr)
        return grad_x_sum + self.attention.backward(grad_x_sum, lr)


class BertEncoder(Module):
    """num_layers encoder layers applied in turn: (B, T, H) -> (B, T, H)."""

    def __init__(self, dim_model: int, num_heads: int, dim_ff: int, num_layers: int, *,
                 activation: str = "gelu", eps: float = 1e-12, dtype=np.float32,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.layers = [TransformerEncoderBlock(dim_model, num_heads, dim_ff, activation=activation,
                                               eps=eps, dtype=dtype, rng=rng) for _ in range(num_layers)]

    def forward(self, x: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        for layer in self.layers:
            x = layer(x, attention_mask)
        return x

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        for layer in reversed(self.layers):
            grad_out = layer.backward(grad_out, lr)
        return grad_out
