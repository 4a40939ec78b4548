"""Sentence embeddings: mean- or [CLS]-pooled BERT states, and the `bert-kit embed` command.

`SentenceEncoder` loads any BERT folder (an HF one such as all-MiniLM-L6-v2, or a bert-kit
checkpoint: config.json + model.safetensors + tokenizer files; RoBERTa, XLM-R, DistilBERT and
ModernBERT folders too), and `encode` returns one
vector per text, as sentence-transformers does:

    enc = SentenceEncoder.from_pretrained("models/all-MiniLM-L6-v2")     # mean pooling, L2-normalised
    vectors = enc.encode(["A man is eating.", "Someone eats."])          # (2, 384) float32
    cosine_similarity(vectors, vectors)                                  # (2, 2)

How `encode` keeps the device busy:
- batches hold a token budget, not a number of texts (`max_tokens_per_batch`: texts x the
  longest one's tokens; sized for the device, `default_token_budget`): thousands of short
  sentences or a few dozen long passages per batch;
- texts go longest first (by characters, then exactly by tokens within each chunk of
  `CHUNK_TEXTS`), so each batch pads to nearly its own length; the output keeps the input order;
- a thread tokenizes the next chunk and lays out its batches (padded ids, packing layout, in
  pinned memory on a GPU) while the device runs the current one;
- on a GPU nothing waits for the device until the end: copies in are asynchronous, the inputs
  are not read back (`unchecked_inputs`: the ids were checked on the host, in NumPy), and the
  vectors stay on the device, where they are put in input order and checked, then copied out
  once; `precision` "auto" runs bf16 autocast where the GPU has it (fp16 on older GPUs, fp32 on
  the CPU).

A caller that needs the tokens first (`bert-kit embed` counts the texts cut to max_length)
tokenizes once with `tokenize` and embeds the ids with `encode_tokenized`.

The pooling functions are plain tensor functions, so the bi-encoder fine-tuning loop
(`bert_kit.tasks.similarity`) trains exactly what is used here.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bert_kit.checks import ConfigError, Range, positive, resolve_device
from bert_kit.data.tables import no_garbage_collection
from bert_kit.input_checks import unchecked_inputs
from bert_kit.families import is_encoder, load_model
from bert_kit.kernels import fast_path
from bert_kit.kernels.packing import Packed
from bert_kit.model import BERTModel
from bert_kit.modernbert import ModernBertModel
from bert_kit.tokenizer import WordPieceTokenizer, get_tokenizer
from bert_kit.tokenizer import _check_str as check_text

POOLING_MODES = ("mean", "cls")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CHUNK_TEXTS = 4096  # texts tokenized at a time by the batching thread
CPU_TOKEN_BUDGET = 8192  # padded tokens a batch on the CPU: 32 passages of 256 tokens, hundreds of sentences
GPU_TOKEN_BUDGET = 131072  # on a GPU: by estimate a MiniLM batch is ~3 TFLOP, far more than its ~100 launches
DEVICE_OUTPUT_BYTES = 1 << 30  # vectors gathered on the GPU up to this size, then copied out at once


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


def inference_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The autocast dtype of `precision` on `device`; "auto" is bf16 on a GPU that has it, fp16 on
    an older GPU, fp32 (no autocast) elsewhere. The rule of `training.precision.resolve_precision`."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r} is not a valid choice: expected one of {PRECISIONS}")
    if precision != "auto":
        return _DTYPES[precision]
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def default_token_budget(device: torch.device, hidden_size: int, intermediate_size: int) -> int:
    """Padded tokens per batch for `device`: CPU_TOKEN_BUDGET on the CPU; on a GPU GPU_TOKEN_BUDGET,
    less where a tenth of its memory cannot hold that many tokens' float32 activations (the
    feed-forward's two intermediate tensors and four hidden-size ones)."""
    if device.type != "cuda":
        return CPU_TOKEN_BUDGET
    bytes_per_token = 4 * (2 * intermediate_size + 4 * hidden_size)
    fits = torch.cuda.get_device_properties(device).total_memory // 10 // bytes_per_token
    return int(max(CPU_TOKEN_BUDGET, min(GPU_TOKEN_BUDGET, fits)))


def token_batches(lengths: Sequence[int], max_tokens: int, max_texts: int | None = None) -> list[slice]:
    """Cut texts sorted longest first (their token counts, `lengths`) into consecutive batches whose
    padded size, texts x the first (longest) one's tokens, stays within `max_tokens` (a text longer
    than that is a batch of its own), with at most `max_texts` texts each."""
    batches, start, n = [], 0, len(lengths)
    while start < n:
        fit = max(1, max_tokens // max(1, int(lengths[start])))
        stop = min(n, start + (fit if max_texts is None else min(fit, max_texts)))
        batches.append(slice(start, stop))
        start = stop
    return batches


@dataclass
class HostBatch:
    """One batch laid out on the host: `rows` (B,) the texts' positions in the input; input_ids and
    attention_mask (B, T) int64 (pinned for a GPU); `layout` the packing of the mask, or None."""

    rows: np.ndarray
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    layout: Packed | None


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
    precision: "auto" (bf16 autocast on a GPU that has it, fp16 on older GPUs, fp32 on the CPU),
        "fp32", "bf16" or "fp16"; weights stay float32, vectors come out float32.
    max_tokens_per_batch: the token budget of a batch (texts x longest text); None sizes it for
        the device (`default_token_budget`).
    """

    def __init__(self, model: BERTModel | ModernBertModel, tokenizer: WordPieceTokenizer, pooling: str = "mean",
                 normalize: bool = True, max_length: int = 256, device: str | torch.device | None = None,
                 unpadded: bool = True, compile: bool = False, precision: str = "auto",
                 max_tokens_per_batch: int | None = None):
        exported = not isinstance(model, torch.nn.Module)  # an `OnnxModel`: an exported graph
        if not (is_encoder(model) if not exported else model.role == "Model"):
            hint = ": pass its encoder, model.bert" if hasattr(model, "bert") else ""
            raise TypeError(f"model must be an encoder (BERTModel or ModernBertModel), got "
                            f"{type(model).__name__}{hint}")
        if not (callable(tokenizer) and hasattr(tokenizer, "pad_token_id")):
            raise TypeError(f"tokenizer must be a WordPieceTokenizer (get_tokenizer(folder)), got {type(tokenizer).__name__}")
        if pooling not in POOLING_MODES:
            raise ConfigError(f"pooling={pooling!r} is not a valid choice: expected one of {POOLING_MODES}")
        for name, value in (("normalize", normalize), ("unpadded", unpadded), ("compile", compile)):
            if not isinstance(value, bool):  # "no" and None read as a choice would be silently True / False
                raise ConfigError(f"{name}={value!r} is not a valid choice: expected True or False")
        # [CLS] and [SEP] plus at least one token, and no more than the model has positions
        offset = " less position_offset" if getattr(model.config, "position_offset", 0) else ""
        Range(3, model.config.max_length, integer=True,
              hint=f"max_position_embeddings of the model{offset}").check("max_length", max_length)
        if max_tokens_per_batch is not None:
            positive(integer=True).check("max_tokens_per_batch", max_tokens_per_batch)
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        if not exported:  # (an exported graph has its own kernels)
            fast_path.apply(self.model, self.device, training=False)
        self.tokenizer = tokenizer
        self.pooling, self.normalize, self.max_length = pooling, normalize, max_length
        self.dtype = inference_dtype(precision, self.device)
        config = model.config
        self.max_tokens_per_batch = max_tokens_per_batch or default_token_budget(
            self.device, config.hidden_size, config.intermediate_size)
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
                        unpadded: bool = True, compile: bool = False, precision: str = "auto",
                        max_tokens_per_batch: int | None = None) -> "SentenceEncoder":
        """Load the encoder and tokenizer of a model folder (task heads in it are ignored); a run
        folder stands for its best/ (fine-tuning) or final/ (pretraining) model, a hub name for
        its local copy. max_length None: the folder's own (`model_folder.default_max_length`:
        its fine-tuning length, its sentence-transformers max_seq_length, else its positions).
        A folder written by `bert-kit export` (an encoder, or a fine-tuned head's graph, which
        outputs the encoder's states too) runs in ONNX Runtime on the CPU, with the same outputs."""
        from bert_kit.model_folder import default_max_length, resolve_model
        from bert_kit.onnx_runtime import OnnxModel, is_onnx_folder

        folder = resolve_model(folder)
        max_length = default_max_length(folder) if max_length is None else max_length  # 0 is refused, not "default"
        if is_onnx_folder(folder):  # written by `bert-kit export`: ONNX Runtime on the CPU
            if compile:
                raise ValueError(f"{folder} is an exported ONNX folder: compile applies to PyTorch models only")
            model, device = OnnxModel(folder), device or "cpu"
            unpadded, precision = False, "fp32"  # the graph takes padded batches, in the precision it was exported in
            if model.role != "Model":
                if not model.has_encoder_states:
                    raise ValueError(f"{folder} holds an exported {model.architecture} graph without the encoder's "
                                     "states (last_hidden_state): export the folder again to embed with it")
                model = model.encoder()  # a head's graph that also outputs the encoder states, as /embed uses
        else:
            model = load_model("Model", folder)
        return cls(model, get_tokenizer(folder), pooling, normalize, max_length, device, unpadded, compile,
                   precision, max_tokens_per_batch)

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    @property
    def precision(self) -> str:
        """The autocast precision the encoder runs in: fp32, bf16 or fp16."""
        return next(name for name, dtype in _DTYPES.items() if dtype == self.dtype)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with [CLS]/[SEP], truncated to max_length, one list per text."""
        if not texts:
            return []
        enc = self.tokenizer(list(texts), max_length=self.max_length, padding=False, truncation=True,
                             return_tensors=None, return_token_type_ids=False, return_attention_mask=False)
        return enc["input_ids"]

    # ---- one batch ----------------------------------------------------------------------------

    def host_batch(self, ids: Sequence[Sequence[int]], rows: np.ndarray | None = None) -> HostBatch:
        """Lay out token id lists as a padded batch on the host (pinned for a GPU), with the packing
        layout of its mask when the encoder runs unpadded: the device is never asked for it. The
        ids are checked against the model's vocabulary here, where it costs no wait for the device."""
        empty = [i for i, row in enumerate(ids) if not len(row)]
        if empty:
            raise ValueError(f"ids[{empty[0]}] is empty: each text needs at least [CLS] and [SEP]")
        # padded in NumPy, one copy for the whole batch (a tensor op per row cost ~5 us each:
        # 2.5 ms for a server batch of 500 sentences)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        keep = np.arange(int(lengths.max()))[None, :] < lengths[:, None]  # (B, T)
        padded = np.full(keep.shape, self.tokenizer.pad_token_id, dtype=np.int64)
        padded[keep] = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        low, high, size = int(padded.min()), int(padded.max()), self.model.config.vocab_size
        if low < 0 or high >= size:  # the message of the model's own check (`input_checks`)
            raise ValueError(f"token id {low if low < 0 else high} out of range for vocab_size {size}")
        input_ids, mask = torch.from_numpy(padded), torch.from_numpy(keep.astype(np.int64))
        layout = None
        if self.unpadded:  # `Packed.from_mask` in NumPy: no torch CPU op in the batching thread
            cu_seqlens = np.zeros(len(ids) + 1, dtype=np.int32)
            np.cumsum(lengths, out=cu_seqlens[1:])
            layout = Packed(torch.from_numpy(cu_seqlens), int(lengths.max()), torch.from_numpy(np.flatnonzero(keep)),
                            *keep.shape)
        if self.device.type == "cuda":  # pinned: the copy to the device neither waits nor stages
            input_ids, mask = input_ids.pin_memory(), mask.pin_memory()
            if layout is not None:
                layout = Packed(layout.cu_seqlens.pin_memory(), layout.max_seqlen, layout.indices.pin_memory(),
                                layout.batch, layout.seqlen)
        return HostBatch(np.arange(len(ids)) if rows is None else rows, input_ids, mask, layout)

    def run_batch(self, batch: HostBatch) -> torch.Tensor:
        """Pooled (and maybe normalised) float32 vectors (B, H) of a host batch, left on the device
        (call under torch.inference_mode and `self.autocast()`)."""
        move = lambda t: t.to(self.device, non_blocking=True)  # noqa: E731  (asynchronous from pinned memory)
        input_ids, mask = move(batch.input_ids), move(batch.attention_mask)
        if self.normalize and getattr(self.model, "pooling", None) == self.pooling:  # an exported graph pools itself
            return self.model.sentence_embedding(input_ids, mask, torch.zeros_like(input_ids))
        layout = batch.layout
        if layout is not None:
            layout = Packed(move(layout.cu_seqlens), layout.max_seqlen, move(layout.indices), layout.batch,
                            layout.seqlen)
        types = None if isinstance(self.model, BERTModel) else torch.zeros_like(input_ids)  # None: segment 0
        hidden = self.forward(input_ids, mask, types, unpadded=layout if layout is not None else False)
        vectors = pool(hidden.float(), mask, self.pooling)
        return F.normalize(vectors, dim=-1) if self.normalize else vectors

    def autocast(self, checked_ids: bool = False) -> contextlib.AbstractContextManager:
        """The encoder's precision as an autocast context (none in fp32); checked_ids: the ids were
        checked on the host (`host_batch`), so the model skips its own check of their values (a
        wait for the device a batch)."""
        stack = contextlib.ExitStack()
        if checked_ids:
            stack.enter_context(unchecked_inputs())
        if self.dtype != torch.float32 and isinstance(self.model, torch.nn.Module):
            stack.enter_context(torch.autocast(self.device.type, dtype=self.dtype))
        return stack

    @torch.inference_mode()
    def encode_ids(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """One batch of token id lists -> pooled (and maybe normalised) vectors (B, H) float32; the
        ids are checked against the model's vocabulary."""
        if not len(ids):
            return torch.zeros(0, self.dim, device=self.device)
        with self.autocast():
            return self.run_batch(self.host_batch(ids))

    # ---- many texts -----------------------------------------------------------------------------

    def id_batches(self, ids: Sequence[Sequence[int]], batch_size: int | None = None) -> Iterator[HostBatch]:
        """Host batches of token id lists, longest first (ties in input order), within the token
        budget (and `batch_size` texts); each batch's `rows` are positions in `ids`."""
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        if len(ids) and not lengths.min():  # named by its place in `ids`, not in a sorted batch
            raise ValueError(f"ids[{int(np.argmin(lengths))}] is empty: each text needs at least [CLS] and [SEP]")
        order = np.argsort(-lengths, kind="stable")
        for part in token_batches(lengths[order], self.max_tokens_per_batch, batch_size):
            rows = order[part]
            yield self.host_batch([ids[j] for j in rows], rows)

    def batches(self, texts: Sequence[str], batch_size: int | None = None) -> Iterator[HostBatch]:
        """Host batches of `texts`, longest first, within the token budget (and `batch_size` texts):
        by characters across chunks of CHUNK_TEXTS texts, by tokens within each chunk."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # longest first: OOM shows at once
        for start in range(0, len(order), CHUNK_TEXTS):
            chunk = np.asarray(order[start: start + CHUNK_TEXTS], dtype=np.int64)
            for batch in self.id_batches(self.tokenize([texts[i] for i in chunk]), batch_size):
                batch.rows = chunk[batch.rows]
                yield batch

    def encode(self, texts: str | Sequence[str], batch_size: int | None = None, show_progress: bool = False,
               convert_to_tensor: bool = False, progress: Callable[[int], object] | None = None
               ) -> np.ndarray | torch.Tensor:
        """Embed texts in the order given: (n, hidden) float32 array ((hidden,) for one str).

        Batches hold `max_tokens_per_batch` padded tokens; batch_size caps the texts in a batch
        too. convert_to_tensor: a float32 tensor on the encoder's device instead of an array.
        progress: called with the number of texts done after each batch (for a caller's bar)."""
        single = isinstance(texts, str)
        if not single and (not isinstance(texts, Iterable) or isinstance(texts, (bytes, dict))):
            raise TypeError(f"texts must be a str or a list of str, got {type(texts).__name__}")
        texts = [texts] if single else list(texts)
        for i, t in enumerate(texts):  # here, not in the batching thread: the error names the input's index
            check_text(t, f"texts[{i}]")
        if batch_size is not None:
            positive(integer=True).check("batch_size", batch_size)
        out = self._encode(self.batches(texts, batch_size), len(texts), convert_to_tensor, show_progress, progress)
        return out[0] if single else out

    def encode_tokenized(self, ids: Sequence[Sequence[int]], batch_size: int | None = None,
                         show_progress: bool = False, convert_to_tensor: bool = False,
                         progress: Callable[[int], object] | None = None) -> np.ndarray | torch.Tensor:
        """`encode` of texts tokenized already: `ids` as `tokenize` returns them (one list per
        text, [CLS] and [SEP] included) -> (n, hidden) float32, in the order given. For a caller
        that needs the tokens first (`bert-kit embed` reports the texts cut to max_length):
        the texts are tokenized once. The batches are sorted by tokens across all the texts."""
        if batch_size is not None:
            positive(integer=True).check("batch_size", batch_size)
        return self._encode(self.id_batches(ids, batch_size), len(ids), convert_to_tensor, show_progress, progress)

    def _encode(self, batches: Iterator[HostBatch], n: int, on_device: bool, show_progress: bool,
                progress: Callable[[int], object] | None) -> np.ndarray | torch.Tensor:
        """The vectors (n, H) of `batches` (made in a thread beside the device), in input order."""
        bar = None
        if show_progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=n, desc="embed", unit="text", dynamic_ncols=True)
        cuda = self.device.type == "cuda"
        # On a GPU the vectors stay there, are put in input order there and copied out in one go (a
        # reorder and a check of 200 MB take ~0.1 s each in NumPy); past DEVICE_OUTPUT_BYTES each
        # batch is copied out as it is computed, no device memory held (each copy then waits).
        gather = on_device or (cuda and n * self.dim * 4 <= DEVICE_OUTPUT_BYTES)
        done = torch.empty(n, self.dim, device=self.device if gather else "cpu")
        rows, at = np.empty(n, dtype=np.int64), 0
        prefetched = _Prefetched(batches)  # the batching thread starts on entry
        try:
            with torch.inference_mode(), self.autocast(checked_ids=True), no_garbage_collection(), \
                    prefetched as ready:
                for batch in ready:
                    size = len(batch.rows)
                    done[at: at + size].copy_(self.run_batch(batch), non_blocking=cuda)
                    rows[at: at + size] = batch.rows
                    at += size
                    for report in (bar.update if bar is not None else None, progress):
                        if report is not None:
                            report(size)
        finally:
            if bar is not None:
                bar.close()
        if gather:  # the vectors computed longest first, put back in input order
            out = torch.empty_like(done)
            out[torch.from_numpy(rows).to(self.device)] = done
            self._check_finite(out)  # the one wait for the device
            return out if on_device else out.cpu().numpy()
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()  # the last copy out
        out = np.empty_like(done.numpy())
        out[rows] = done.numpy()
        self._check_finite(out)
        return out

    def _check_finite(self, out: np.ndarray | torch.Tensor) -> None:
        bad = int((~torch.isfinite(out)).any(dim=1).sum()) if torch.is_tensor(out) else \
            int((~np.isfinite(out)).any(axis=1).sum())
        if bad:  # NaN weights (or an overflow) give NaN vectors: an error, never vectors that mean nothing
            params = getattr(self.model, "named_parameters", lambda: [])()
            broken = next((name for name, p in params if not torch.isfinite(p).all()), None)
            overflow = f"{self.precision} overflowed: use precision fp32" if self.dtype == torch.float16 else \
                "a layer overflowed"
            why = f"its weights hold NaN or inf values (first in {broken})" if broken else overflow
            raise FloatingPointError(f"the model's vectors are NaN or inf for {bad} of {len(out)} text(s): {why}")

    def embed(self, texts: str | Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Same as `encode`; the short name of the 001 API."""
        return self.encode(texts, batch_size=batch_size)

    __call__ = embed

    def similarity(self, texts_a: Sequence[str], texts_b: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Row-wise cosine similarity (n,) of two equally long lists of texts (or two texts: (1,))."""
        texts_a = [texts_a] if isinstance(texts_a, str) else texts_a
        texts_b = [texts_b] if isinstance(texts_b, str) else texts_b
        if len(texts_a) != len(texts_b):
            raise ValueError(f"{len(texts_a)} first texts but {len(texts_b)} second texts")
        a, b = self.encode(texts_a, batch_size), self.encode(texts_b, batch_size)
        a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        return np.einsum("nh,nh->n", a.astype(np.float64), b.astype(np.float64))


class _Prefetched:
    """Runs an iterator in a thread, `depth` items ahead of the loop that consumes it; its error is
    raised in the consumer; leaving the loop early (an error, Ctrl-C) stops the thread."""

    _END = object()

    def __init__(self, items: Iterator, depth: int = 4):
        self.items, self.queue, self.stop = items, queue.Queue(maxsize=depth), threading.Event()
        self.thread = threading.Thread(target=self._produce, name="embed-batches", daemon=True)

    def _produce(self) -> None:
        try:
            for item in self.items:
                if not self._put(item):
                    return
        except BaseException as e:  # noqa: BLE001  (handed to the consumer, which raises it)
            self._put(e)
            return
        self._put(self._END)

    def _put(self, item: object) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __enter__(self) -> Iterator:
        self.thread.start()
        return self._consume()

    def _consume(self) -> Iterator:
        while True:
            item = self.queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


_ENCODERS: dict[tuple, SentenceEncoder] = {}


def embed(texts: str | Sequence[str], model: str | Path, pooling: str = "mean", normalize: bool = True,
          max_length: int = 256, batch_size: int | None = None, device: str | None = None,
          precision: str = "auto") -> np.ndarray:
    """One-call embeddings: `embed(texts, "path/to/model")` -> (n, hidden); the encoder is cached."""
    key = (str(Path(model).resolve()), pooling, normalize, max_length, str(device), precision)
    if key not in _ENCODERS:
        _ENCODERS[key] = SentenceEncoder.from_pretrained(model, pooling, normalize, max_length, device,
                                                         precision=precision)
    return _ENCODERS[key].encode(texts, batch_size=batch_size)
