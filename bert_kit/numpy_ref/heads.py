"""Pretraining heads of the NumPy BERT: pooler, masked-LM head and next-sentence head.

* ``BertPooler``: tanh(Linear(h[:, 0])), the [CLS] summary used by NSP and classifiers.
* ``BertMLMHead``: gathers the hidden states at the masked positions, then HF's prediction head:
  transform = Linear(H, H) -> GELU -> LayerNorm, decoder = t @ E^T + bias where E is the word
  embedding matrix (tied weights). Computing the vocabulary projection only at the masked
  positions (M of them) instead of all T saves most of the head's cost.
* ``BertNSPHead``: Linear(H, 2) on the pooled output.

``masked_positions`` is (B, M) with -1 for padding slots; padded slots produce logits of 0 and
receive no gradient, so ragged numbers of masks per sequence fit in one array.
"""

from __future__ import annotations

import numpy as np

from .encoder import check_ids
from .layers import Embedding, LayerNorm, Linear, Module, Tanh, _normal, make_activation


class BertPooler(Module):
    """Dense + tanh on the first position ([CLS]): (B, T, H) -> (B, H)."""

    def __init__(self, dim_model: int, *, dtype=np.float32, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        self.dense = Linear(dim_model, dim_model, dtype=dtype, rng=rng)
        self.act = Tanh()

    def forward(self, hidden_states: np.ndarray) -> np.ndarray:
        if hidden_states.ndim != 3:
            raise ValueError(f"pooler expects (batch, seq_len, dim), got {hidden_states.shape}")
        self._cache = (hidden_states.shape,)
        return self.act(self.dense(hidden_states[:, 0]))

    def backward(self, grad_out: np.ndarray, lr: float = 0.0) -> np.ndarray:
        """grad_out: (B, H) -> (B, T, H), zero everywhere except position 0."""
        (shape,) = self._require_cache()
        grad_hidden = np.zeros(shape, dtype=grad_out.dtype)
        grad_hidden[:, 0] = self.dense.backward(self.act.backward(grad_out), lr)
        return grad_hidden


class BertMLMHead(Module):
    """Logits over the vocabulary at the masked positions: (B, T, H), (B, M) -> (B, M, V).

    With ``word_embeddings`` given, the decoder reuses that table (weight tying): the head then owns
    only the output ``bias`` and leaves its decoder gradient in ``grads["decoder_weight"]`` for the
    owner of the table to add to the lookup gradient and apply. Without it the head owns a separate
    ``decoder_weight`` (V, H) and updates it itself.
    """

    def __init__(self, dim_model: int, vocab_size: int, *, word_embeddings: Embedding | None = None,
                 activation: str = "gelu", eps: float = 1e-12, dtype=np.float32,
                 rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        self.dim_model, self.vocab_size = dim_model, vocab_size
        self.transform = Linear(dim_model, dim_model, dtype=dtype, rng=rng)
        self.act = make_activation(activation)
        self.norm = LayerNorm(dim_model, eps, dtype=dtype)
        # Underscore: a reference, not a child, so the table is not listed (or updated) twice.
        self._tied = word_embeddings
        if word_embeddings is None:
            self.params["decoder_weight"] = _normal(rng, (vocab_size, dim_model), dtype)
        elif word_embeddings.params["weight"].shape != (vocab_size, dim_model):
            raise ValueError(f"tied embedding shape {word_embeddings.params['weight'].shape} "
                             f"!= (vocab_size, dim_model) = {(vocab_size, dim_model)}")
        self.params["bias"] = np.zeros(vocab_size, dtype=dtype)

    @property
    def decoder_weight(self) -> np.ndarray:
        """(V, H): the word embedding matrix when tied."""
        return self._tied.params["weight"] if self._tied is not None else self.params["decoder_weight"]

    def forward(self, hidden_states: np.ndarray, masked_positions: np.ndarray | None = None) -> np.ndarray:
        """hidden_states (B, T, H); masked_positions (B, M) in [0, T) or -1; None means all T positions."""
        if hidden_states.ndim != 3 or hidden_states.shape[-1] != self.dim_model:
            raise ValueError(f"MLM head expects (batch, seq_len, {self.dim_model}), got {hidden_states.shape}")
        batch, seq_len, _ = hidden_states.shape
        if masked_positions is None:
            masked_positions = np.broadcast_to(np.arange(seq_len), (batch, seq_len))
        positions = check_ids("masked_positions", masked_positions, seq_len, allow_padding=True)
        if positions.shape[0] != batch:
            raise ValueError(f"masked_positions has batch {positions.shape[0]}, hidden_states has {batch}")
        valid = positions >= 0                                  # (B, M)
        index = np.where(valid, positions, 0)                   # padding reads position 0, zeroed below
        rows = np.arange(batch)[:, None]                        # (B, 1) broadcasts against (B, M)
        gathered = hidden_states[rows, index]                   # (B, M, H)
        t = self.norm(self.act(self.transform(gathered)))      # (B, M, H)
        logits = t @ self.decoder_weight.T + self.params["bias"]  # (B, M, V)
        self._cache = (t, rows, index, valid, hidden_states.shape)
        return np.where(valid[..., None], logits, 0).astype(logits.dtype, copy=False)

    def backward(self, grad_logits: np.ndarray, lr: float = 0.0) -> np.ndarray:
        """grad_logits (B, M, V) -> gradient w.r.t. hidden_states (B, T, H), non-zero only at masked rows."""
        t, rows, index, valid, hidden_shape = self._require_cache()
        grad_logits = grad_logits * valid[..., None]            # padded slots are constants
        g2 = grad_logits.reshape(-1, self.vocab_size)           # (B*M, V)
        self.grads["decoder_weight"] = g2.T @ t.reshape(-1, self.dim_model)  # (V, H)
        self.grads["bias"] = g2.sum(axis=0)
        grad_t = grad_logits @ self.decoder_weight              # (B, M, H), before any update
        grad_gathered = self.transform.backward(self.act.backward(self.norm.backward(grad_t, lr)), lr)
        # Gather's backward is a scatter-add (a position listed twice gets both gradients).
        grad_hidden = np.zeros(hidden_shape, dtype=grad_gathered.dtype)
        np.add.at(grad_hidden, (np.broadcast_to(rows, index.shape), index), grad_gathered)
        self.update(lr)  # when tied, params holds only the bias: the table is its owner's to update
        return grad_hidden


class BertNSPHead(Module):
    """Linear(H, 2) on the pooled output: (B, H) -> (B, 2) logits (1 = B follows A)."""

    def __init__(self, dim_model: int, *, dtype=np.float32, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(0)
        self.dense = Linear(dim_model, 2, dtype=dtype, rng=rng)

    def forward(self, pooler_output: np.ndarray) -> np.ndarray:
        if pooler_output.ndim != 2:
            raise ValueError(f"NSP head expects (batch, dim), got {pooler_output.shape}")
        return self.dense(pooler_output)

    def backward(self, grad_logits: np.ndarray, lr: float = 0.0) -> np.ndarray:
        return self.dense.backward(grad_logits, lr)
