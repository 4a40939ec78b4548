"""Whole NumPy BERT models: the base encoder, the pretraining model (MLM + NSP) and the losses.

* ``BertBaseModel``: embeddings -> encoder -> (pooler); ``forward`` returns the sequence output.
* ``BertModel``: the pretraining model of the original API, ``forward(input_ids, segment_ids,
  masked_positions) -> (mlm_logits (B, M, V), nsp_logits (B, 2))`` and ``backward(grad_mlm,
  grad_nsp, lr)``. Its MLM decoder is tied to the word embeddings, as in BERT.
* ``BertForPretraining``: the same model with the dict-returning ``forward(token_ids, ...)``;
  ``create_bert_model`` builds it (or the base model).

Backward order in ``BertModel.backward``: heads -> pooler/encoder -> embeddings, all with lr=0, then
the tied gradient is summed and one SGD step updates every parameter. Updating only at the end
matters for the tied table: the decoder's backward must use the weights of the forward pass.

Checkpoints use the HF BERT format (see ``checkpoint.py``), so ``save_pretrained`` output loads in
``transformers`` and in the torch engine, and ``from_pretrained`` reads their checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import checkpoint
from .encoder import BertEmbeddings, BertEncoder, check_ids
from .heads import BertMLMHead, BertNSPHead, BertPooler
from .layers import INIT_STD, Module, softmax

IGNORE_BELOW = 0  # labels < 0 (-1 padding of the original API, -100 of HF) are ignored


def resolve_dtype(dtype) -> np.dtype:
    """np.float32 / np.float64 or their names; anything else is an error."""
    resolved = np.dtype(dtype)
    if resolved not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    return resolved


class _Pretrained:
    """HF-format checkpoints for the model classes below (see ``checkpoint.py``)."""

    def save_pretrained(self, folder: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` (HF names) into ``folder``."""
        checkpoint.save_pretrained(self, folder)

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype=np.float32, strict: bool = True):
        """Build from an HF-format folder (base or pretraining checkpoint).

        ``strict=False`` lets a pretraining model load a base checkpoint and keep fresh heads.
        """
        model = cls(**checkpoint.read_config(folder), dtype=dtype)
        checkpoint.load_weights(model, folder, strict=strict)
        return model


class BertBaseModel(_Pretrained, Module):
    """Embeddings + encoder + pooler. ``forward``: token_ids (B, T) -> sequence output (B, T, H)."""

    def __init__(self, vocab_size: int, dim_model: int, num_heads: int, dim_ff: int, num_layers: int,
                 max_seq_len: int, *, num_segment_types: int = 2, activation: str = "gelu",
                 eps: float = 1e-12, position_embedding: str = "learned", dtype=np.float32,
                 seed: int = 0, initializer_range: float = INIT_STD) -> None:
        super().__init__()
        dtype = resolve_dtype(dtype)
        for name, value in (("vocab_size", vocab_size), ("dim_model", dim_model), ("num_heads", num_heads),
                            ("dim_ff", dim_ff), ("num_layers", num_layers), ("max_seq_len", max_seq_len),
                            ("num_segment_types", num_segment_types)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if dim_model % num_heads != 0:
            raise ValueError(f"dim_model ({dim_model}) must be divisible by num_heads ({num_heads})")
        # Kept for checkpoints: save_pretrained writes it as an HF config.json.
        self.config = dict(vocab_size=vocab_size, dim_model=dim_model, num_heads=num_heads, dim_ff=dim_ff,
                           num_layers=num_layers, max_seq_len=max_seq_len, num_segment_types=num_segment_types,
                           activation=activation, eps=eps, position_embedding=position_embedding)
        self.dtype = dtype
        rng = np.random.default_rng(seed)  # one stream, consumed in construction order
        self.embeddings = BertEmbeddings(vocab_size, dim_model, max_seq_len, num_segment_types, eps=eps,
                                         position_embedding=position_embedding, dtype=dtype, rng=rng)
        self.encoder = BertEncoder(dim_model, num_heads, dim_ff, num_layers, activation=activation,
                                   eps=eps, dtype=dtype, rng=rng)
        self.pooler = BertPooler(dim_model, dtype=dtype, rng=rng)
        _rescale_init(self, initializer_range)

    def forward(self, token_ids: np.ndarray, segment_ids: np.ndarray | None = None,
                attention_mask: np.ndarray | None = None) -> np.ndarray:
        """token_ids, segment_ids, attention_mask: (B, T) -> sequence output (B, T, H)."""
        token_ids = np.asarray(token_ids)
        if attention_mask is not None:
            attention_mask = np.asarray(attention_mask)
            if attention_mask.shape != token_ids.shape:
                raise ValueError(f"attention_mask shape {attention_mask.shape} != token_ids shape {token_ids.shape}")
        return self.encoder(self.embeddings(token_ids, segment_ids), attention_mask)

    def pool(self, sequence_output: np.ndarray) -> np.ndarray:
        """(B, T, H) -> (B, H): tanh pooler on [CLS]."""
        return self.pooler(sequence_output)

    def backward(self, grad_sequence: np.ndarray | None, lr: float = 0.0,
                 grad_pooled: np.ndarray | None = None) -> None:
        """Gradients of the sequence output (B, T, H) and, if ``pool`` was used, of the pooled output (B, H)."""
        if grad_pooled is not None:  # the pooler reads the sequence output, so both paths add
            from_pooler = self.pooler.backward(grad_pooled, lr)  # (B, T, H), non-zero at [:, 0] only
            grad_sequence = from_pooler if grad_sequence is None else grad_sequence + from_pooler
        else:
            self.pooler.zero_grad()  # unused this step
        if grad_sequence is None:
            raise ValueError("backward needs grad_sequence or grad_pooled")
        self.embeddings.backward(self.encoder.backward(grad_sequence, lr), lr)


def _cross_entropy(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over the rows where ``mask``; logits (..., C), labels and mask (...)."""
    num = int(mask.sum())
    if num == 0:  # nothing to score: zero loss, zero gradient
        return 0.0, np.zeros_like(logits)
    safe = np.where(mask, labels, 0)
    shifted = logits - logits.max(axis=-1, keepdims=True)  # stable log-softmax
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(log_probs, safe[..., None], axis=-1)[..., 0]
    loss = -float((picked * mask).sum()) / num
    # d(-log softmax_y)/d logits = softmax - onehot(y); the mean divides by the count.
    onehot = np.arange(logits.shape[-1]) == safe[..., None]
    grad = (softmax(logits, axis=-1) - onehot) * (mask[..., None] / num)
    return loss, grad.astype(logits.dtype, copy=False)


def _rescale_init(module: Module, initializer_range: float) -> None:
    """Layers draw weight matrices from N(0, 0.02) (BERT's default); rescale them to another std.

    Small models trained with plain SGD learn much faster from a larger std (near 1/sqrt(H)).
    """
    if initializer_range <= 0:
        raise ValueError(f"initializer_range must be > 0, got {initializer_range}")
    if initializer_range != INIT_STD:
        for _, param in module.named_parameters():
            if param.ndim == 2:  # matrices and tables; biases and LayerNorm keep 0 and 1
                param *= initializer_range / INIT_STD


class BertModel(_Pretrained, Module):
    """BERT with MLM and NSP heads (the original API's ``BertModel``)."""

    def __init__(self, vocab_size: int, dim_model: int, num_heads: int, dim_ff: int, num_layers: int,
                 max_seq_len: int, *, num_segment_types: int = 2, activation: str = "gelu",
                 eps: float = 1e-12, position_embedding: str = "learned", dtype=np.float32,
                 seed: int = 0, initializer_range: float = INIT_STD) -> None:
        super().__init__()
        self.bert = BertBaseModel(vocab_size, dim_model, num_heads, dim_ff, num_layers, max_seq_len,
                                  num_segment_types=num_segment_types, activation=activation, eps=eps,
                                  position_embedding=position_embedding, dtype=dtype, seed=seed,
                                  initializer_range=initializer_range)
        self.config, self.dtype = self.bert.config, self.bert.dtype
        rng = np.random.default_rng([seed, 1])  # heads get their own stream: base weights don't depend on them
        self.mlm_head = BertMLMHead(dim_model, vocab_size, word_embeddings=self.bert.embeddings.word_embeddings,
                                    activation=activation, eps=eps, dtype=self.dtype, rng=rng)
        self.nsp_head = BertNSPHead(dim_model, dtype=self.dtype, rng=rng)
        _rescale_init(self.mlm_head, initializer_range)
        _rescale_init(self.nsp_head, initializer_range)
        self.sequence_output: np.ndarray | None = None  # (B, T, H) of the last forward
        self.pooled_output: np.ndarray | None = None    # (B, H) of the last forward
        self._output_shapes: tuple = ()

    def forward(self, input_ids: np.ndarray, segment_ids: np.ndarray | None = None,
                masked_positions: np.ndarray | None = None,
                attention_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """input_ids, segment_ids: (B, T); masked_positions: (B, M), -1 = padding, None = all positions.

        Returns mlm_logits (B, M, V) (zeros at padded slots) and nsp_logits (B, 2).
        """
        self.sequence_output = self.bert(input_ids, segment_ids, attention_mask)
        self.pooled_output = self.bert.pool(self.sequence_output)
        mlm_logits = self.mlm_head(self.sequence_output, masked_positions)
        nsp_logits = self.nsp_head(self.pooled_output)
        self._output_shapes = (mlm_logits.shape, nsp_logits.shape)
        return mlm_logits, nsp_logits

    def backward(self, grad_mlm_logits: np.ndarray | None, grad_nsp_logits: np.ndarray | None,
                 lr: float = 0.0) -> None:
        """Gradients of both outputs (None = zero) -> ``grads`` of every layer, then one SGD step."""
        if self.sequence_output is None:
            raise RuntimeError("BertModel.backward called before forward")
        mlm_shape, nsp_shape = self._output_shapes
        grad_mlm_logits = np.zeros(mlm_shape, self.dtype) if grad_mlm_logits is None else grad_mlm_logits
        grad_nsp_logits = np.zeros(nsp_shape, self.dtype) if grad_nsp_logits is None else grad_nsp_logits
        if grad_mlm_logits.shape != mlm_shape or grad_nsp_logits.shape != nsp_shape:
            raise ValueError(f"gradient shapes {grad_mlm_logits.shape}, {grad_nsp_logits.shape} != "
                             f"output shapes {mlm_shape}, {nsp_shape}")
        grad_sequence = self.mlm_head.backward(grad_mlm_logits, 0.0)   # (B, T, H)
        grad_pooled = self.nsp_head.backward(grad_nsp_logits, 0.0)     # (B, H)
        self.bert.backward(grad_sequence, 0.0, grad_pooled=grad_pooled)
        # Tied weights: the table is used twice (lookup and decoder), so its gradient is the sum.
        word = self.bert.embeddings.word_embeddings
        word.grads["weight"] = word.grads["weight"] + self.mlm_head.grads["decoder_weight"]
        self.sgd_step(lr)

    @staticmethod
    def mlm_loss_and_grad(logits: np.ndarray, labels: np.ndarray,
                          mask: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """Mean MLM cross-entropy over the real masked slots and its gradient w.r.t. ``logits``.

        logits (B, M, V); labels (B, M) with -1 (or -100) at padding; mask (B, M), truthy where a slot
        counts (default: labels >= 0). Returns (loss, grad_logits (B, M, V)).
        """
        labels = np.asarray(labels)
        if logits.ndim != 3 or labels.shape != logits.shape[:2]:
            raise ValueError(f"MLM logits (B, M, V) and labels (B, M) disagree: {logits.shape} vs {labels.shape}")
        mask = labels >= IGNORE_BELOW if mask is None else np.asarray(mask).astype(bool)
        if mask.shape != labels.shape:
            raise ValueError(f"mask shape {mask.shape} != labels shape {labels.shape}")
        check_ids("mlm labels", np.where(mask, labels, 0), logits.shape[-1])
        return _cross_entropy(logits, labels, mask)

    @staticmethod
    def nsp_loss_and_grad(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean NSP cross-entropy: logits (B, 2), labels (B,) in {0, 1} (negative = ignored)."""
        labels = np.asarray(labels)
        if logits.ndim != 2 or logits.shape[-1] != 2 or labels.shape != logits.shape[:1]:
            raise ValueError(f"NSP logits (B, 2) and labels (B,) disagree: {logits.shape} vs {labels.shape}")
        mask = labels >= IGNORE_BELOW
        check_ids("nsp labels", np.where(mask, labels, 0), 2, ndim=1)
        return _cross_entropy(logits, labels, mask)


class BertForPretraining(BertModel):
    """``BertModel`` with a dict-returning forward (the second API): all positions by default."""

    def forward(self, token_ids: np.ndarray, segment_ids: np.ndarray | None = None,
                attention_mask: np.ndarray | None = None,
                masked_positions: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Returns mlm_logits (B, T, V) (or (B, M, V) given positions), nsp_logits (B, 2),
        sequence_output (B, T, H) and pooled_output (B, H). ``backward`` is unchanged."""
        mlm_logits, nsp_logits = super().forward(token_ids, segment_ids, masked_positions, attention_mask)
        return {"mlm_logits": mlm_logits, "nsp_logits": nsp_logits,
                "sequence_output": self.sequence_output, "pooled_output": self.pooled_output}


def create_bert_model(vocab_size: int, max_seq_length: int, d_model: int, num_heads: int, d_ff: int,
                      num_layers: int, for_pretraining: bool = True, **kwargs) -> BertBaseModel | BertForPretraining:
    """Pretraining model (MLM + NSP heads) or the bare encoder; kwargs go to the constructor
    (activation, eps, position_embedding="sinusoidal", dtype, seed, num_segment_types)."""
    cls = BertForPretraining if for_pretraining else BertBaseModel
    return cls(vocab_size, d_model, num_heads, d_ff, num_layers, max_seq_length, **kwargs)
