"""Pretraining corpora: readers and a streaming dataset.

* `read_documents(path, mode)` reads plain text (blank-line separated documents, or one per
  line), WikiText (` = Title = ` starts an article), or JSONL with a text field, from a file,
  a directory, a glob or a list of those. `iter_documents` is the lazy version.
* `StreamingTextDataset` is an IterableDataset for corpora bigger than memory: it reads lazily,
  shuffles through a seeded buffer and shards by (rank, world_size) and DataLoader worker, so
  every example is produced exactly once per epoch across all ranks and workers; with a
  tokenizer it tokenises on the fly (truncated, or packed into full blocks) and can skip the
  examples a resumed run has already seen.
* The on-disk token cache, tokenised once (`tokenize_to_cache`), is in `token_cache.py`.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import itertools
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from bert_kit.data import BOM, check_encoding, decode_error, decode_text, parse_jsonl, splits_at_newline_bytes

__all__ = [
    "MODES",
    "resolve_files",
    "iter_documents",
    "read_documents",
    "read_hf_documents",
    "plain_backend",
    "StreamingTextDataset",
]

PathLike = str | os.PathLike
MODES = ("auto", "blank_line", "line", "wikitext", "jsonl")
MAX_LINE_BYTES = 1 << 26  # a corpus line longer than this (64 MB) is refused, read no further


def resolve_files(path: PathLike | Sequence[PathLike]) -> list[Path]:
    """Expand a file, a directory (all files below it, sorted), a glob or a list of these."""
    if isinstance(path, (list, tuple)):
        return [f for p in path for f in resolve_files(p)]
    text = os.fspath(path)
    if any(c in text for c in "*?["):
        files = sorted(Path(f) for f in globlib.glob(text, recursive=True) if os.path.isfile(f))
        if not files:
            raise FileNotFoundError(f"no corpus files match the pattern {text!r}")
        return files
    p = Path(text)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
        if not files:
            raise FileNotFoundError(f"corpus directory {p} contains no files")
        return files
    if not p.exists():  # a FIFO or /dev/stdin is read as a file
        raise FileNotFoundError(f"corpus file not found: {p}")
    return [p]


# compressed corpus files are read through these, by their last suffix
_OPENERS = {".xz": "lzma", ".lzma": "lzma", ".gz": "gzip", ".bz2": "bz2"}


def _open_binary(path: Path) -> Any:
    """A file opened for reading bytes; .xz, .gz and .bz2 files are decompressed on the fly."""
    opener = _OPENERS.get(path.suffix.lower())
    if opener is None:
        return open(path, "rb")
    import importlib

    return importlib.import_module(opener).open(path, "rb")


def _mode_for(path: Path, mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown corpus mode {mode!r}; expected one of {MODES}")
    if mode == "auto":
        suffixes = [s.lower() for s in path.suffixes if s.lower() not in _OPENERS]
        return "jsonl" if suffixes and suffixes[-1] in (".jsonl", ".json") else "blank_line"
    return mode


def _is_heading(line: str) -> bool:
    """WikiText headings look like '= Title =' or '= = Section = ='."""
    return len(line) >= 3 and line.startswith("= ") and line.endswith(" =")


def _lines(path: Path, encoding: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file read lazily; a byte-order mark is dropped and bytes that
    do not decode, a NUL byte or a line past MAX_LINE_BYTES are a ValueError naming the file and
    line (a corpus may be too big to read whole).
    A UTF-16 or UTF-32 file, whose line ends are no single bytes, is decoded whole."""
    encoding = check_encoding(encoding)
    with _open_binary(path) as f:
        if not splits_at_newline_bytes(encoding):
            yield from enumerate(decode_text(f.read(), path, encoding=encoding).splitlines(keepends=True), start=1)
            return
        for lineno in itertools.count(1):
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            if b"\x00" in raw:
                raise ValueError(f"{path}:{lineno}: NUL byte: this is a binary file, not text")
            if len(raw) > MAX_LINE_BYTES:  # read no further: /dev/zero has no line end
                raise ValueError(f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES >> 20} MB: a corpus holds a "
                                 "document or a paragraph per line; is this a text file?")
            try:
                line = raw.decode(encoding)
            except UnicodeDecodeError as e:
                raise decode_error(path, raw, e, lineno, encoding) from None
            yield lineno, line.removeprefix(BOM) if lineno == 1 else line


def _iter_file(path: Path, mode: str, text_field: str, encoding: str, wikitext_unk: str = "[UNK]") -> Iterator[str]:
    lines = _lines(path, encoding)
    if mode == "line":
        for _, line in lines:
            if line.strip():
                yield line.strip()
    elif mode == "jsonl":
        for lineno, record in parse_jsonl((line for _, line in lines), path):
            if not isinstance(record, dict) or text_field not in record:
                raise KeyError(f"{path}:{lineno}: record has no text field {text_field!r}")
            text = record[text_field]
            if not isinstance(text, str):
                raise ValueError(  # a bad file, not a bad call: the command line reports it in one line
                    f"{path}:{lineno}: field {text_field!r} is {type(text).__name__}, not str"
                )
            if text.strip():
                yield text.strip()
    else:
        wikitext = mode == "wikitext"
        block: list[str] = []
        for _, line in lines:
            line = line.strip()
            # WikiText: only a new article title ends a document; blank lines are paragraph
            # breaks and headings are dropped. Plain text: a blank line ends a document.
            if wikitext and _is_heading(line):
                if not line.startswith("= =") and block:
                    yield "\n".join(block)
                    block = []
            elif line:
                # WikiText writes every out-of-vocabulary word as <unk>: the tokenizer's unknown token
                block.append(line.replace("<unk>", wikitext_unk) if wikitext else line)
            elif not wikitext and block:
                yield "\n".join(block)
                block = []
        if block:
            yield "\n".join(block)


def iter_documents(
    path: PathLike | Sequence[PathLike],
    mode: str = "auto",
    text_field: str = "text",
    encoding: str = "utf-8",
    wikitext_unk: str = "[UNK]",
) -> Iterator[str]:
    """Lazily yield the documents of a corpus, each a string whose lines are its paragraphs.

    Modes: "blank_line" (a blank line ends a document), "line" (one document per line),
    "wikitext" (a ' = Title = ' line starts an article; headings dropped; every `<unk>` becomes
    `wikitext_unk`, the tokenizer's unknown token, so it is one [UNK] and not `<`, `unk`, `>`),
    "jsonl" (one JSON object per line, text under `text_field`), "auto" (jsonl for .jsonl/.json,
    else blank_line). Files ending in .xz, .gz or .bz2 are decompressed as they are read (the
    mode looks at the suffix before it). Empty documents are skipped. Files are `encoding` text (a
    Python codec name; default UTF-8); a byte-order mark is ignored; a line that is not `encoding`
    text raises ValueError naming the file and line.
    """
    for file in resolve_files(path):
        yield from _iter_file(file, _mode_for(file, mode), text_field, encoding, wikitext_unk)


def read_documents(
    path: PathLike | Sequence[PathLike],
    mode: str = "auto",
    text_field: str = "text",
    encoding: str = "utf-8",
    wikitext_unk: str = "[UNK]",
) -> list[str]:
    """All documents of a corpus as a list of strings (see `iter_documents` for the modes)."""
    return list(iter_documents(path, mode, text_field, encoding, wikitext_unk))


def read_hf_documents(path: PathLike, split: str = "train", text_field: str = "text") -> list[str]:
    """Documents from a local Hugging Face `datasets` source (needs the optional package).

    `path` is a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`, or a local
    .json/.jsonl/.csv/.parquet/.txt file loaded with the matching builder.
    """
    try:
        import datasets  # optional dependency, imported only here
    except ImportError:
        raise ImportError(
            "read_hf_documents needs the optional 'datasets' package (pip install datasets); "
            "read_documents handles plain text, WikiText and JSONL without it"
        ) from None
    p = Path(path)
    if p.is_dir():
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    elif p.is_file():
        builder = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
        ds = datasets.load_dataset(builder.get(p.suffix.lower(), "text"), data_files=str(p),
                                   split=split)
    else:
        raise FileNotFoundError(f"dataset not found: {p}")
    if text_field not in ds.column_names:
        raise KeyError(f"{p}: dataset has no column {text_field!r} (columns: {ds.column_names})")
    return [t for t in ds[text_field] if isinstance(t, str) and t.strip()]


def plain_backend(tokenizer: Any) -> Any:
    """A private copy of `tokenizer.backend` with truncation and padding switched off.

    Saved tokenizer.json files often carry a fixed truncation/padding setting (e.g. 128); a copy
    keeps documents whole without changing the caller's tokenizer.
    """
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend.to_str())
    backend.no_truncation()
    backend.no_padding()
    return backend


def _encode_documents(backend: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens (one batched call on every core, the GIL
    released). The fast variant (tokenizers >= 0.21) gives the same ids without character offsets."""
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    return [e.ids for e in encode(texts, add_special_tokens=False)]


def _mix(*parts: int) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


class StreamingTextDataset(IterableDataset):
    """Stream documents from files too large for memory, shuffled through a buffer.

    Example k of the corpus (in file order) belongs to shard k mod (world_size * num_workers);
    shard number rank * num_workers + worker_id, so each example is yielded exactly once per epoch
    over all ranks and workers. The shuffle buffer (RNG seeded from seed, epoch and shard) holds
    `buffer_size` documents: bigger means better mixing and more memory. Call `set_epoch` each
    epoch: every epoch restarts the stream in a new order.

    Yields strings, or, with a tokenizer, dicts ready for `DataCollatorForMLM`: input_ids
    [CLS] ids [SEP] truncated to `max_length`; with `packing`, full blocks of the shard's stream
    doc [SEP] doc [SEP] ... as `PackedDataset` cuts them ([CLS] + max_length - 1 tokens, only
    the last block short) plus sequence_ids (L,) numbering the documents of a block. Each dict
    also names its "worker" and "position" (examples of its shard yielded this epoch, itself
    included), which `StreamingDataLoader` records to resume. Files are `encoding` text (default UTF-8).

    Resuming: `set_epoch(epoch, skip=n)` passes over the first n examples of each shard. The
    order is a function of (seed, epoch, shard) alone, so with the same seed the examples that
    follow are exactly those an uninterrupted run would have seen next.
    """

    def __init__(
        self,
        files: PathLike | Sequence[PathLike],
        tokenizer: Any = None,
        max_length: int = 128,
        mode: str = "line",
        text_field: str = "text",
        buffer_size: int = 10_000,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        packing: bool = False,
        encoding: str = "utf-8",
    ) -> None:
        super().__init__()
        self.encoding = check_encoding(encoding)
        self.files = resolve_files(files)  # fail early on a missing file
        _mode_for(self.files[0], mode)  # and on an unknown mode
        if packing and tokenizer is None:
            raise ValueError("packing=True needs a tokenizer")
        if tokenizer is not None and max_length < 3:
            raise ValueError(f"max_length must be >= 3, got {max_length}")
        self.tokenizer, self.max_length, self.packing = tokenizer, max_length, packing
        self.mode, self.text_field = mode, text_field
        self.buffer_size, self.shuffle, self.seed = max(1, buffer_size), shuffle, seed
        dist = torch.distributed
        initialized = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if initialized else 0)
        self.world_size = (world_size if world_size is not None
                           else (dist.get_world_size() if initialized else 1))
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.set_epoch(0)

    def set_epoch(self, epoch: int, skip: int | Sequence[int] = 0, first_worker: int = 0) -> None:
        """Start `epoch` (its own shuffle order). To resume mid-epoch, `skip` examples of each
        shard (one count, or one per DataLoader worker) and let DataLoader worker w serve the
        shard of worker (w + first_worker) mod num_workers, so that worker's batch comes first."""
        self.epoch, self.skip, self.first_worker = int(epoch), skip, int(first_worker)

    def _shard_items(self, shard: int, num_shards: int) -> Iterator[str]:
        k = 0
        unk = getattr(self.tokenizer, "unk_token", "[UNK]")
        for file in self.files:
            for text in _iter_file(file, _mode_for(file, self.mode), self.text_field, self.encoding, unk):
                if k % num_shards == shard:
                    yield text
                k += 1

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        n_workers = info.num_workers if info is not None else 1
        worker = ((info.id if info is not None else 0) + self.first_worker) % n_workers
        if isinstance(self.skip, int):
            skip = self.skip
        elif len(self.skip) == n_workers:
            skip = int(self.skip[worker])
        else:
            raise ValueError(f"skip has {len(self.skip)} counts for {n_workers} DataLoader worker(s)")
        shard = self.rank * n_workers + worker
        items = self._shard_items(shard, self.world_size * n_workers)
        if self.shuffle:
            items = self._buffered(items, random.Random(_mix(self.seed, self.epoch, shard)))
        if self.tokenizer is None:
            yield from itertools.islice(items, skip, None)
            return
        if self.packing:  # block boundaries depend on every earlier document: tokenise them all
            examples = itertools.islice(self._packed(items), skip, None)
        else:  # one example per document: skip before tokenising
            examples = self._truncated(itertools.islice(items, skip, None))
        for position, example in enumerate(examples, start=skip + 1):
            yield {**example, "worker": worker, "position": position}

    def _buffered(self, items: Iterator[str], rng: random.Random) -> Iterator[str]:
        buffer: list[str] = []
        for item in items:
            if len(buffer) < self.buffer_size:
                buffer.append(item)
                continue
            # Emit a random resident and put the new item in its slot.
            j = rng.randrange(len(buffer))
            yield buffer[j]
            buffer[j] = item
        rng.shuffle(buffer)
        yield from buffer

    def _encoded(self, texts: Iterator[str]) -> Iterator[list[int]]:
        """Token ids of each text, without special tokens."""
        backend = plain_backend(self.tokenizer)
        if get_worker_info() is not None:
            # tokenizers turns its thread pool off in forked workers: they are the parallelism
            for text in texts:
                yield backend.encode(text, add_special_tokens=False).ids
            return
        while chunk := list(itertools.islice(texts, 64)):  # batched calls use every core
            yield from _encode_documents(backend, chunk)

    def _truncated(self, texts: Iterator[str]) -> Iterator[dict[str, list[int]]]:
        cls_id, sep_id = int(self.tokenizer.cls_token_id), int(self.tokenizer.sep_token_id)
        for ids in self._encoded(texts):
            yield {"input_ids": [cls_id, *ids[: self.max_length - 2], sep_id]}

    def _packed(self, texts: Iterator[str]) -> Iterator[dict[str, list[int]]]:
        cls_id, sep_id = int(self.tokenizer.cls_token_id), int(self.tokenizer.sep_token_id)
        size = self.max_length - 1  # stream tokens per block, after its [CLS]
        ids: list[int] = []  # stream tokens not yet in a block
        docs: list[int] = []  # the document number of each of them
        for d, doc in enumerate(self._encoded(texts)):
            ids += doc
            ids.append(sep_id)
            docs += [d] * (len(doc) + 1)
            start = 0
            while len(ids) - start >= size:
                yield _block(cls_id, ids[start:start + size], docs[start:start + size])
                start += size
            del ids[:start], docs[:start]
        if ids:
            yield _block(cls_id, ids, docs)


def _block(cls_id: int, ids: list[int], docs: list[int]) -> dict[str, list[int]]:
    """[CLS] + ids, with sequence_ids counting documents from the block's first ([CLS] included)."""
    return {"input_ids": [cls_id, *ids], "sequence_ids": [0, *(d - docs[0] for d in docs)]}
