"""The on-disk token cache of a pretraining corpus: tokenised once, memory-mapped after.

`tokenize_to_cache(files, tokenizer, cache_dir)` tokenises a corpus into a flat memory-mapped
token array plus int64 document offsets; later calls with unchanged files and tokenizer load it
instantly. `TokenCache.document(i)` is a cheap slice, so map-style datasets over it can jump to any
data position. `split_sentences` cuts a document into the sentences an NSP cache holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bert_kit.data import check_encoding
from bert_kit.data.corpus import PathLike, _encode_documents, iter_documents, plain_backend, resolve_files

__all__ = ["TokenCache", "split_sentences", "tokenize_to_cache"]

_CACHE_VERSION = 2  # 2: WikiText's <unk> is the tokenizer's unknown token


class TokenCache:
    """A corpus as one flat token array (B,) and document offsets (D + 1,) int64.

    Document i is `tokens[offsets[i]:offsets[i + 1]]` (no special tokens). The arrays are
    np.memmap views when loaded from disk, so slicing costs no tokenisation and little memory.
    """

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, path: Path | None = None,
                 from_cache: bool = False, groups: np.ndarray | None = None) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(tokens):
            raise ValueError(
                f"offsets must run from 0 to len(tokens)={len(tokens)}, got shape "
                f"{offsets.shape} ending at {offsets[-1] if len(offsets) else None}"
            )
        self.tokens, self.offsets = tokens, offsets
        self.path = path  # the token file, None for in-memory caches
        self.from_cache = from_cache  # True when loaded from an earlier run
        # sentence caches (`sentences=True`): the entries are sentences, and text document j
        # holds entries groups[j]:groups[j + 1]
        self.groups = groups

    def sentence_documents(self) -> list[list[list[int]]]:
        """A sentence cache as documents -> sentences -> token ids (what `NSPDataset` takes)."""
        if self.groups is None:
            raise ValueError("this cache was built without sentences=True: it holds no sentence boundaries")
        sentences = [self.document(i).tolist() for i in range(self.num_documents)]
        return [sentences[a:b] for a, b in zip(self.groups[:-1].tolist(), self.groups[1:].tolist())]

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[int]], vocab_size: int) -> TokenCache:
        """An in-memory cache built from token id lists (no files written)."""
        lengths = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = [t for d in documents for t in d]
        return cls(np.asarray(flat, dtype=_token_dtype(vocab_size)), offsets)

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return self.num_documents

    def document(self, i: int) -> np.ndarray:
        """Token ids of document i, shape (L_i,), a view into the (memory-mapped) array."""
        if not -self.num_documents <= i < self.num_documents:
            raise IndexError(f"document {i} out of range for {self.num_documents} documents")
        i %= self.num_documents
        return self.tokens[self.offsets[i]: self.offsets[i + 1]]

    def __repr__(self) -> str:
        return (f"TokenCache(documents={self.num_documents}, tokens={self.num_tokens}, "
                f"dtype={self.tokens.dtype}, path={self.path})")


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 65536 else np.uint32)


def _cache_key(files: list[Path], tokenizer: Any, mode: str, text_field: str, sentences: bool = False,
               encoding: str = "utf-8") -> str:
    """Hash of what the cache depends on: file identities, their encoding and the whole tokenizer
    definition."""
    stats = []
    for f in files:
        st = f.stat()
        stats.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    tok_hash = hashlib.sha256(tokenizer.backend.to_str().encode()).hexdigest()
    other = [] if encoding == "utf-8" else [encoding]  # UTF-8 caches keep the keys they had before
    blob = json.dumps([_CACHE_VERSION, stats, tok_hash, mode, text_field] + (["sentences"] if sentences else [])
                      + other).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def _atomic_write(target: Path, write: Any) -> None:
    """Write via a temp file in the same folder, then rename: readers never see a partial file."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _load_cache(cache_dir: Path, key: str) -> TokenCache | None:
    meta_path = cache_dir / f"{key}.json"
    token_path, offset_path = cache_dir / f"{key}.tokens", cache_dir / f"{key}.offsets.npy"
    if not (meta_path.is_file() and token_path.is_file() and offset_path.is_file()):
        return None
    meta = json.loads(meta_path.read_text())
    dtype, n = np.dtype(meta["dtype"]), int(meta["num_tokens"])
    if token_path.stat().st_size != n * dtype.itemsize:
        return None  # truncated or foreign file: rebuild
    tokens = np.memmap(token_path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
    offsets = np.load(offset_path, mmap_mode="r")
    groups_path = cache_dir / f"{key}.groups.npy"
    groups = np.load(groups_path) if meta.get("sentences") else None
    return TokenCache(tokens, offsets, path=token_path, from_cache=True, groups=groups)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split a document into sentences: every line, then at sentence-final punctuation."""
    return [s for line in text.splitlines() for s in _SENTENCE_END.split(line.strip()) if s]


def tokenize_to_cache(
    files: PathLike | Sequence[PathLike],
    tokenizer: Any,
    cache_dir: PathLike,
    mode: str = "auto",
    text_field: str = "text",
    batch_size: int = 1000,
    progress: bool = True,
    sentences: bool = False,
    encoding: str = "utf-8",
) -> TokenCache:
    """Tokenise a corpus once into `cache_dir`; return the (memory-mapped) `TokenCache`.

    The cache is keyed by a hash of (file paths, sizes, mtimes, tokenizer definition, mode,
    text_field): unchanged inputs load instantly, any change rebuilds. Files written:
    `<key>.tokens` (raw uint16, or uint32 for vocabularies of 65536+), `<key>.offsets.npy`
    (int64, D + 1) and `<key>.json` (metadata, written last, so its presence marks a complete
    cache). Each file is written to a temp file and renamed, so a crash leaves no half cache.
    sentences=True splits each document into sentences (`split_sentences`) and caches those as
    the entries, plus `<key>.groups.npy` (D + 1,) marking each document's sentences (for NSP).
    `encoding`: the files' codec (see `iter_documents`).
    """
    encoding = check_encoding(encoding)
    paths = resolve_files(files)
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = _cache_key(paths, tokenizer, mode, text_field, sentences, encoding)
    cached = _load_cache(cache_dir, key)
    if cached is not None:
        return cached

    from tqdm.auto import tqdm

    dtype = _token_dtype(int(tokenizer.vocab_size))
    backend = plain_backend(tokenizer)
    offsets = [0]
    groups = [0]  # sentence caches: entry index where each document starts

    def write_tokens(f: Any) -> None:
        bar = tqdm(desc=f"tokenizing {len(paths)} file(s)", unit="doc", disable=not progress)
        batch: list[str] = []
        # a thread encodes one batch on every core while this one reads (decompresses, parses) the
        # next and writes the one before: the reading is no longer added to the encoding
        encoder, pending = ThreadPoolExecutor(1, thread_name_prefix="tokenize"), None  # pending: a Future

        def write(done: Any) -> None:
            encoded = done.result()
            for ids in encoded:
                f.write(np.asarray(ids, dtype=dtype).tobytes())
                offsets.append(offsets[-1] + len(ids))
            bar.update(len(encoded))

        def flush() -> None:
            nonlocal pending, batch
            queued, pending = pending, encoder.submit(_encode_documents, backend, batch)
            batch = []
            if queued is not None:
                write(queued)

        try:
            for doc in iter_documents(paths, mode, text_field, encoding, getattr(tokenizer, "unk_token", "[UNK]")):
                parts = split_sentences(doc) if sentences else [doc]
                batch.extend(parts)
                groups.append(groups[-1] + len(parts))
                if len(batch) >= batch_size:
                    flush()
            if batch:
                flush()
            if pending is not None:
                write(pending)
        finally:
            encoder.shutdown(cancel_futures=True)
        bar.close()

    token_path = cache_dir / f"{key}.tokens"
    _atomic_write(token_path, write_tokens)
    _atomic_write(cache_dir / f"{key}.offsets.npy",
                  lambda f: np.save(f, np.asarray(offsets, dtype=np.int64)))
    if sentences:
        _atomic_write(cache_dir / f"{key}.groups.npy", lambda f: np.save(f, np.asarray(groups, dtype=np.int64)))
    meta = {"version": _CACHE_VERSION, "dtype": dtype.name, "num_tokens": offsets[-1],
            "num_documents": len(offsets) - 1, "files": [str(p) for p in paths], "mode": mode,
            "text_field": text_field, "vocab_size": int(tokenizer.vocab_size), "sentences": sentences}
    _atomic_write(cache_dir / f"{key}.json", lambda f: f.write(json.dumps(meta, indent=1).encode()))
    loaded = _load_cache(cache_dir, key)
    assert loaded is not None  # just written
    loaded.from_cache = False
    return loaded
