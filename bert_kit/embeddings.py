"""Sentence embeddings: mean- or [CLS]-pooled BERT states, and the `bert-kit embed` command.

`SentenceEncoder` loads any BERT folder (an HF one such as all-MiniLM-L6-v2, or a bert-kit
checkpoint: config.json + model.safetensors + tokenizer files; RoBERTa, XLM-R, DistilBERT and
ModernBERT folders too), and `encode` returns one
vector per text, as sentence-transformers does:

    enc = SentenceEncoder.from_pretrained("models/all-MiniLM-L6-v2")     # mean pooling, L2-normalised
    vectors = enc.encode(["A man is eating.", "Someone eats."])          # (2, 384) float32
    cosine_similarity(vectors, vectors)                                  # (2, 2)

Texts are sorted by token count before batching, so each batch pads to nearly its own length,
and the original order is restored at the end. The pooling functions are plain tensor
functions, so the bi-encoder fine-tuning loop (`bert_kit.tasks.similarity`) trains exactly what is used here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bert_kit.checks import ConfigError, Range, positive, resolve_device
from bert_kit.families import is_encoder, load_model
from bert_kit.kernels import fast_path
from bert_kit.kernels.packing import Packed
from bert_kit.model import BERTModel
from bert_kit.modernbert import ModernBertModel
from bert_kit.tokenizer import WordPieceTokenizer, get_tokenizer

POOLING_MODES = ("mean", "cls")


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the real tokens' states: hidden (B, T, H), mask (B, T) -> (B, H)."""
    if hidden.dim() != 3 or attention_mask.shape != hidden.shape[:2]:
        raise ValueError(f"mean_pool takes hidden (B, T, H) and attention_mask (B, T), got {tuple(hidden.shape)} "
                         f"and {tuple(attention_mask.shape)}")
    hidden = hidden.float()  # 16-bit states under autocast: sum in float32
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    # the clamp keeps an all-padding row at 0 instead of NaN (sentence-transformers does the same)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str = "mean") -> torch.Tensor:
    """Sentence vectors (B, H) from hidden (B, T, H): "mean" over real tokens or the "cls" state."""
    if mode == "mean":
        return mean_pool(hidden, attention_mask)
    if mode == "cls":
        return hidden[:, 0]  # the raw [CLS] state, not the tanh pooler (as sentence-transformers)
    raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}")


def cosine_similarity(a, b) -> np.ndarray:
    """Cosine similarity matrix: a (n, H) and b (m, H) (numpy or torch; 1-D means one row) -> (n, m)."""
    a = np.atleast_2d(a.detach().cpu().numpy() if torch.is_tensor(a) else np.asarray(a, dtype=np.float64))
    b = np.atleast_2d(b.detach().cpu().numpy() if torch.is_tensor(b) else np.asarray(b, dtype=np.float64))
    for name, x in (("a", a), ("b", b)):
        if x.ndim != 2:
            raise ValueError(f"{name} must be (n, H) embeddings (or one (H,) vector), got shape {x.shape}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"embedding widths differ: {a.shape} vs {b.shape}")
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return a @ b.T


class SentenceEncoder:
    """A BERT encoder plus pooling that turns texts into fixed-size vectors.

    model: an encoder (`BERTModel`, `ModernBertModel`); tokenizer: a `WordPieceTokenizer` (or any
    `get_tokenizer` gives); pooling: "mean" or "cls";
    normalize: L2-normalise each vector (cosine similarity becomes a dot product);
    max_length: tokens per text, longer texts are truncated (256 as all-MiniLM-L6-v2);
    unpadded: run only the real tokens through the encoder (`BERTModel(..., unpadded=True)`).
    The model gets the fast path for inference on `device` (`fast_path.apply`), unless it has one.
    compile: `torch.compile` the encoder for inference, with weights frozen into the graph
        (inductor `freezing`: constant folding and pre-packed matmul weights). The first batches
        pay a one-off compilation (about 10 s on 2 CPU cores); after that MiniLM encodes about
        twice as fast on the CPU. Worth it for large inputs; uses the padded path.
    """

    def __init__(self, model: BERTModel | ModernBertModel, tokenizer: WordPieceTokenizer, pooling: str = "mean",
                 normalize: bool = True, max_length: int = 256, device: str | torch.device | None = None,
                 unpadded: bool = True, compile: bool = False):
        exported = not isinstance(model, torch.nn.Module)  # an `OnnxModel`: an exported graph
        if not (is_encoder(model) if not exported else model.role == "Model"):
            hint = ": pass its encoder, model.bert" if hasattr(model, "bert") else ""
            raise TypeError(f"model must be an encoder (BERTModel or ModernBertModel), got "
                            f"{type(model).__name__}{hint}")
        if not (callable(tokenizer) and hasattr(tokenizer, "pad_token_id")):
            raise TypeError(f"tokenizer must be a WordPieceTokenizer (get_tokenizer(folder)), got {type(tokenizer).__name__}")
        if pooling not in POOLING_MODES:
            raise ConfigError(f"pooling={pooling!r} is not a valid choice: expected one of {POOLING_MODES}")
        # [CLS] and [SEP] plus at least one token, and no more than the model has positions
        offset = " less position_offset" if getattr(model.config, "position_offset", 0) else ""
        Range(3, model.config.max_length, integer=True,
              hint=f"max_position_embeddings of the model{offset}").check("max_length", max_length)
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        if not exported:  # (an exported graph has its own kernels)
            fast_path.apply(self.model, self.device, training=False)
        self.tokenizer = tokenizer
        self.pooling, self.normalize, self.max_length = pooling, normalize, max_length
        # The packed path skips padding in every matmul. Measured on CPU (MiniLM, STS-B dev,
        # length-sorted, CPU-seconds): +5% texts/s at batch 32 and +25% at batch 128, so it is
        # the default everywhere; on CUDA it also gets varlen flash attention.
        self.unpadded = unpadded and not compile  # the compiled graph takes padded batches
        self.forward = self.model
        if compile:
            compiled = torch.compile(self.model, dynamic=True)

            def frozen_forward(*args, **kwargs):
                # inductor reads `freezing` when it compiles (first call, new shapes): scope it
                # to this model so other compiled models (training ones) keep trainable weights
                with torch._inductor.config.patch(freezing=True):
                    return compiled(*args, **kwargs)

            self.forward = frozen_forward

    @classmethod
    def from_pretrained(cls, folder: str | Path, pooling: str = "mean", normalize: bool = True,
                        max_length: int | None = None, device: str | torch.device | None = None,
                        unpadded: bool = True, compile: bool = False) -> "SentenceEncoder":
        """Load the encoder and tokenizer of a model folder (task heads in it are ignored); a run
        folder stands for its best/ (fine-tuning) or final/ (pretraining) model, a hub name for
        its local copy. max_length None: the folder's own (`model_folder.default_max_length`:
        its fine-tuning length, its sentence-transformers max_seq_length, else its positions).
        A folder written by `bert-kit export` (an encoder) runs in ONNX Runtime on the CPU, with
        the same outputs."""
        from bert_kit.model_folder import default_max_length, resolve_model
        from bert_kit.onnx_runtime import OnnxModel, is_onnx_folder

        folder = resolve_model(folder)
        max_length = max_length or default_max_length(folder)
        if is_onnx_folder(folder):  # written by `bert-kit export`: ONNX Runtime on the CPU
            if compile:
                raise ValueError(f"{folder} is an exported ONNX folder: compile applies to PyTorch models only")
            model, device = OnnxModel(folder), device or "cpu"
            unpadded = False  # the graph takes padded batches
            if model.role != "Model":
                raise ValueError(f"{folder} holds an exported {model.architecture} graph; sentence embeddings "
                                 f"need an exported encoder (a BertModel folder)")
        else:
            model = load_model("Model", folder)
        return cls(model, get_tokenizer(folder), pooling, normalize, max_length, device, unpadded, compile)

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with [CLS]/[SEP], truncated to max_length, one list per text."""
        if not texts:
            return []
        enc = self.tokenizer(list(texts), max_length=self.max_length, padding=False, truncation=True,
                             return_tensors=None, return_token_type_ids=False, return_attention_mask=False)
        return enc["input_ids"]

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor on the encoder's device; to a GPU from pinned memory without waiting (the
        copy queues behind the kernels already launched, and the host goes on preparing)."""
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    @torch.inference_mode()
    def encode_ids(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """One batch of token id lists -> pooled (and maybe normalised) vectors (B, H) float32."""
        if not len(ids):
            return torch.zeros(0, self.dim, device=self.device)
        empty = [i for i, row in enumerate(ids) if not len(row)]
        if empty:
            raise ValueError(f"ids[{empty[0]}] is empty: each text needs at least [CLS] and [SEP]")
        # padded on the host in NumPy, one copy for the whole batch (a tensor op per row cost
        # ~5 us each: 2.5 ms for a server batch of 500 sentences)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        keep = np.arange(int(lengths.max()))[None, :] < lengths[:, None]  # (B, T)
        padded = np.full(keep.shape, self.tokenizer.pad_token_id, dtype=np.int64)
        padded[keep] = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        input_ids, mask = torch.from_numpy(padded), torch.from_numpy(keep.astype(np.int64))
        # the packing layout from the host's mask: the device is never asked for it
        layout = Packed.from_mask(mask) if self.unpadded else False
        if layout:
            layout = Packed(self._to_device(layout.cu_seqlens), layout.max_seqlen, self._to_device(layout.indices),
                            layout.batch, layout.seqlen)
        input_ids, mask = self._to_device(input_ids), self._to_device(mask)
        if self.normalize and getattr(self.model, "pooling", None) == self.pooling:  # an exported graph pools itself
            return self.model.sentence_embedding(input_ids, mask, torch.zeros_like(input_ids))
        hidden = self.forward(input_ids, mask, torch.zeros_like(input_ids), unpadded=layout)
        vectors = pool(hidden.float(), mask, self.pooling)
        return F.normalize(vectors, dim=-1) if self.normalize else vectors

    def encode(self, texts: str | Sequence[str], batch_size: int = 32, show_progress: bool = False) -> np.ndarray:
        """Embed texts in the order given: (n, hidden) float32 array ((hidden,) for one str)."""
        single = isinstance(texts, str)
        if not single and (not isinstance(texts, Iterable) or isinstance(texts, (bytes, dict))):
            raise TypeError(f"texts must be a str or a list of str, got {type(texts).__name__}")
        texts = [texts] if single else list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(t).__name__}")
        positive(integer=True).check("batch_size", batch_size)
        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first: OOM shows at once
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        starts = range(0, len(order), batch_size)
        if show_progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="embed", unit="batch")
        done = []  # vectors stay on the device until the end: no wait after every batch
        for start in starts:
            chunk = order[start: start + batch_size]
            done.append((chunk, self.encode_ids([ids[i] for i in chunk])))
        for chunk, vectors in done:
            out[chunk] = vectors.cpu().numpy()
        bad = int((~np.isfinite(out)).any(axis=1).sum())
        if bad:  # NaN weights (or an overflow) give NaN vectors: an error, never vectors that mean nothing
            params = getattr(self.model, "named_parameters", lambda: [])()
            broken = next((name for name, p in params if not torch.isfinite(p).all()), None)
            why = f"its weights hold NaN or inf values (first in {broken})" if broken else "a layer overflowed"
            raise FloatingPointError(f"the model's vectors are NaN or inf for {bad} of {len(texts)} text(s): {why}")
        return out[0] if single else out

    def embed(self, texts: str | Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Same as `encode`; the short name of the 001 API."""
        return self.encode(texts, batch_size=batch_size)

    __call__ = embed

    def similarity(self, texts_a: Sequence[str], texts_b: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Row-wise cosine similarity (n,) of two equally long lists of texts (or two texts: (1,))."""
        texts_a = [texts_a] if isinstance(texts_a, str) else texts_a
        texts_b = [texts_b] if isinstance(texts_b, str) else texts_b
        if len(texts_a) != len(texts_b):
            raise ValueError(f"{len(texts_a)} first texts but {len(texts_b)} second texts")
        a, b = self.encode(texts_a, batch_size), self.encode(texts_b, batch_size)
        a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        return np.einsum("nh,nh->n", a.astype(np.float64), b.astype(np.float64))


_ENCODERS: dict[tuple, SentenceEncoder] = {}


def embed(texts: str | Sequence[str], model: str | Path, pooling: str = "mean", normalize: bool = True,
          max_length: int = 256, batch_size: int = 32, device: str | None = None) -> np.ndarray:
    """One-call embeddings: `embed(texts, "path/to/model")` -> (n, hidden); the encoder is cached."""
    key = (str(Path(model).resolve()), pooling, normalize, max_length, str(device))
    if key not in _ENCODERS:
        _ENCODERS[key] = SentenceEncoder.from_pretrained(model, pooling, normalize, max_length, device)
    return _ENCODERS[key].encode(texts, batch_size=batch_size)
