"""Pretraining datasets, samplers and loaders: MLM, MLM + NSP, and packed MLM-only.

* `MLMDataset`: one [CLS] text [SEP] example per text, truncated to `max_length`.
* `NSPDataset`: sentence pairs built as in Google's create_pretraining_data.py: sentences of a
  document are gathered up to a target length (max_length - 3, or a random shorter one with
  probability `short_seq_prob`), split at a random sentence boundary into A and B; with
  probability 0.5 B is replaced by text from another document. Labels follow HF:
  next_sentence_label 0 = B follows A (IsNext), 1 = B is random (NotNext).
  Two departures from the reference code, both to keep the label balance and the pair
  boundary honest: an IsNext chunk of a single long sentence is split inside that sentence, and
  truncation (longest first) trims A from its front and B from its back, so the A|B boundary
  always stays in the text.
* `PackedDataset`: MLM-only (RoBERTa "full sentences"): documents of a `TokenCache` laid end to
  end as [CLS] doc [SEP] doc [SEP] ... and cut into full `max_length` blocks; `sequence_ids`
  names the document of each token so a block-diagonal attention mask can keep them apart.
* `DistributedResumableSampler`: a deterministic order per (seed, epoch), sharded over ranks,
  that can restart mid-epoch. `ResumableDataLoader` ties sampler and collator together, counts
  consumed batches and exposes `state_dict()` for exact resume.
* `StreamingDataLoader`: the same for a `StreamingTextDataset`, whose position is the number
  of examples consumed (per DataLoader worker, whose batches arrive round-robin).
"""

from __future__ import annotations

import contextlib
import functools
import random
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .corpus import StreamingTextDataset, _encode_documents, plain_backend
from .masking import DataCollatorForMLM
from .token_cache import TokenCache, split_sentences

__all__ = [
    "split_sentences", "MLMDataset", "NSPInstance", "create_nsp_instances", "NSPDataset", "PackedDataset",
    "block_diagonal_mask", "DistributedResumableSampler", "ResumableSampler", "ResumableDataLoader",
    "StreamingDataLoader", "create_mlm_dataloader", "create_pretraining_dataloader",
]

IS_NEXT, NOT_NEXT = 0, 1  # next_sentence_label values (the HF convention)

# A sentence ends at . ! or ? followed by space and something that can start a sentence.
def _tokenize(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    return _encode_documents(plain_backend(tokenizer), list(texts)) if texts else []


class MLMDataset(Dataset):
    """[CLS] text [SEP] examples for masked-LM training (masking happens in the collator).

    `texts_or_token_ids` is a list of strings, or of token id lists without special tokens.
    Longer texts are truncated to `max_length` tokens (use `PackedDataset` to keep all text).
    Item i is {"input_ids": LongTensor (L_i,)} with L_i <= max_length.
    """

    def __init__(self, texts_or_token_ids: Sequence[str] | Sequence[Sequence[int]],
                 tokenizer: Any, max_length: int = 128) -> None:
        if isinstance(texts_or_token_ids, str):
            raise TypeError("MLMDataset takes a list of texts, got a single str")
        if len(texts_or_token_ids) == 0:
            raise ValueError("MLMDataset needs at least one text")
        if max_length < 3:
            raise ValueError(f"max_length must be >= 3, got {max_length}")
        if isinstance(texts_or_token_ids[0], str):
            ids = _tokenize(tokenizer, texts_or_token_ids)
        else:
            ids = [list(map(int, x)) for x in texts_or_token_ids]
        cls_id, sep_id = int(tokenizer.cls_token_id), int(tokenizer.sep_token_id)
        self.examples = [torch.tensor([cls_id, *x[: max_length - 2], sep_id]) for x in ids]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.examples[i]}


@dataclass
class NSPInstance:
    """One sentence pair: token ids of A and B (no special tokens) and where they came from."""

    tokens_a: list[int]
    tokens_b: list[int]
    next_sentence_label: int  # 0 = IsNext, 1 = random B
    doc_a: int
    doc_b: int


def _truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """Longest-first: shorten the longer of A and B (B on ties) until both fit.

    A loses tokens at its front and B at its back, so the A|B junction is kept.
    """
    la, lb = len(a), len(b)
    excess = la + lb - max_tokens
    if excess > 0:
        cut = min(excess, abs(la - lb))  # first bring the longer down to the shorter
        if la > lb:
            la -= cut
        else:
            lb -= cut
        excess -= cut
        lb -= (excess + 1) // 2  # then alternate, B first on ties
        la -= excess // 2
    return a[len(a) - la:], b[:lb]


def create_nsp_instances(
    documents: Sequence[Sequence[Sequence[int]]],
    max_length: int,
    rng: random.Random,
    short_seq_prob: float = 0.1,
    nsp_probability: float = 0.5,
) -> list[NSPInstance]:
    """Build sentence pairs from documents given as lists of tokenised sentences.

    Every pair fits [CLS] A [SEP] B [SEP] in `max_length`. Needs two or more non-empty documents.
    """
    max_tokens = max_length - 3
    if max_tokens < 2:
        raise ValueError(f"max_length must be >= 5 for sentence pairs, got {max_length}")
    docs = [[list(s) for s in d if len(s)] for d in documents]
    nonempty = [i for i, d in enumerate(docs) if d]
    if len(nonempty) < 2:
        raise ValueError(f"NSP needs at least 2 non-empty documents, got {len(nonempty)}")
    rank_of = {d: k for k, d in enumerate(nonempty)}
    instances: list[NSPInstance] = []
    for doc_index, doc in enumerate(docs):
        # As in the reference code, one target length per document; sometimes short, so the
        # model also sees the short inputs of fine-tuning.
        target = max_tokens
        if rng.random() < short_seq_prob:
            target = rng.randint(2, max_tokens)
        chunk: list[list[int]] = []
        length, i = 0, 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= target:
                is_random = rng.random() < nsp_probability
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                tokens_a = [t for s in chunk[:a_end] for t in s]
                if len(chunk) == 1 and not is_random and len(tokens_a) < 2:
                    is_random = True  # a one-token sentence cannot be split
                if is_random:
                    # Draw uniformly among the other non-empty documents.
                    r = rng.randrange(len(nonempty) - 1)
                    doc_b = nonempty[r + 1] if r >= rank_of[doc_index] else nonempty[r]
                    rdoc = docs[doc_b]
                    tokens_b, target_b = [], max(1, target - len(tokens_a))
                    for s in rdoc[rng.randrange(len(rdoc)):]:
                        tokens_b.extend(s)
                        if len(tokens_b) >= target_b:
                            break
                    i -= len(chunk) - a_end  # unused sentences go back to the pool
                elif len(chunk) == 1:
                    # Split the single sentence, so IsNext stays as likely as NotNext.
                    cut = rng.randint(1, len(tokens_a) - 1)
                    tokens_a, tokens_b, doc_b = tokens_a[:cut], tokens_a[cut:], doc_index
                else:
                    tokens_b, doc_b = [t for s in chunk[a_end:] for t in s], doc_index
                tokens_a, tokens_b = _truncate_pair(tokens_a, tokens_b, max_tokens)
                instances.append(NSPInstance(tokens_a, tokens_b, NOT_NEXT if is_random else IS_NEXT,
                                             doc_index, doc_b))
                chunk, length = [], 0
            i += 1
    return instances


class NSPDataset(Dataset):
    """Sentence pairs for MLM + NSP pretraining (masking happens in the collator).

    `documents`: strings (split into sentences with `split_sentences` when `split=True`, else
    into lines), lists of sentence strings, or lists of tokenised sentences (lists of ids).
    Pairs are drawn once, from `seed`. Item i is a dict of
    input_ids (L,) = [CLS] A [SEP] B [SEP], token_type_ids (L,) = 0 up to the first [SEP]
    inclusive and 1 after, next_sentence_label () = 0 IsNext / 1 random; L <= max_length.
    """

    def __init__(self, documents: Sequence[Any], tokenizer: Any, max_length: int = 128,
                 seed: int = 0, short_seq_prob: float = 0.1, nsp_probability: float = 0.5,
                 split: bool = True) -> None:
        self.documents = self._tokenize_documents(documents, tokenizer, split)
        self.cls_id, self.sep_id = int(tokenizer.cls_token_id), int(tokenizer.sep_token_id)
        self.instances = create_nsp_instances(self.documents, max_length, random.Random(seed),
                                              short_seq_prob, nsp_probability)

    @staticmethod
    def _tokenize_documents(documents: Sequence[Any], tokenizer: Any,
                            split: bool) -> list[list[list[int]]]:
        segments: list[list[Any]] = []
        for k, doc in enumerate(documents):
            if isinstance(doc, str):
                segments.append(split_sentences(doc) if split else doc.splitlines())
            elif isinstance(doc, Sequence):
                segments.append(list(doc))
            else:
                raise TypeError(f"document {k} is {type(doc).__name__}; expected str or list")
        # Tokenise every string sentence of the corpus in one batched call.
        flat = [s for d in segments for s in d if isinstance(s, str)]
        encoded = iter(_tokenize(tokenizer, flat))
        return [[next(encoded) if isinstance(s, str) else [int(t) for t in s] for s in d]
                for d in segments]

    def __len__(self) -> int:
        return len(self.instances)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        inst = self.instances[i]
        a, b = inst.tokens_a, inst.tokens_b
        ids = [self.cls_id, *a, self.sep_id, *b, self.sep_id]
        types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        return {"input_ids": torch.tensor(ids), "token_type_ids": torch.tensor(types),
                "next_sentence_label": torch.tensor(inst.next_sentence_label)}


class PackedDataset(Dataset):
    """Documents of a `TokenCache` packed into full-length blocks (MLM-only pretraining).

    The stream doc0 [SEP] doc1 [SEP] ... is cut into pieces of max_length - 1 tokens and each
    block is [CLS] + piece, so only the last block is short and no token is dropped (a long
    document continues in the next block). Item i is a dict of input_ids (L,) and
    sequence_ids (L,): 0, 1, ... numbering the documents within the block ([CLS] belongs to the
    first, each [SEP] to the document it closes). Items are slices of the memmap, no tokenising.
    """

    def __init__(self, token_cache: TokenCache, max_length: int = 128, tokenizer: Any = None,
                 cls_token_id: int | None = None, sep_token_id: int | None = None) -> None:
        if tokenizer is not None:
            cls_token_id, sep_token_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        if cls_token_id is None or sep_token_id is None:
            raise ValueError("PackedDataset needs a tokenizer or cls_token_id and sep_token_id")
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        self.cache, self.max_length = token_cache, max_length
        self.cls_id, self.sep_id = int(cls_token_id), int(sep_token_id)
        offsets = np.asarray(token_cache.offsets, dtype=np.int64)
        n_docs = len(offsets) - 1
        # Document d starts at stream position offsets[d] + d (one [SEP] per earlier document).
        self.starts = offsets[:-1] + np.arange(n_docs, dtype=np.int64)
        self.stream_length = int(offsets[-1]) + n_docs
        self.block = max_length - 1

    def __len__(self) -> int:
        return -(-self.stream_length // self.block)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"block {i} out of range for {len(self)} blocks")
        begin, end = i * self.block, min((i + 1) * self.block, self.stream_length)
        d = int(np.searchsorted(self.starts, begin, side="right")) - 1
        ids, seq = [np.array([self.cls_id], dtype=np.int64)], [np.zeros(1, dtype=np.int64)]
        local = 0
        while d < len(self.starts) and self.starts[d] < end:
            doc = np.asarray(self.cache.document(d), dtype=np.int64)
            piece = np.append(doc, self.sep_id)  # doc tokens then its [SEP]
            lo, hi = max(begin - self.starts[d], 0), min(end - self.starts[d], len(piece))
            ids.append(piece[lo:hi])
            seq.append(np.full(hi - lo, local, dtype=np.int64))
            local, d = local + 1, d + 1
        return {"input_ids": torch.from_numpy(np.concatenate(ids)),
                "sequence_ids": torch.from_numpy(np.concatenate(seq))}


def block_diagonal_mask(sequence_ids: torch.Tensor) -> torch.Tensor:
    """Bool (B, T, T) attention mask from sequence_ids (B, T): True where query and key are
    tokens of the same packed document; padding (-1) attends to nothing."""
    same = sequence_ids[:, :, None] == sequence_ids[:, None, :]
    return same & (sequence_ids >= 0)[:, :, None] & (sequence_ids >= 0)[:, None, :]


class DistributedResumableSampler(Sampler[int]):
    """Deterministic shuffled order per (seed, epoch), sharded over ranks, restartable mid-epoch.

    The epoch's permutation of range(dataset_len) is padded by repeating its start (or cut, with
    drop_last) to a multiple of world_size; rank r takes every world_size-th index from r. Every
    example is seen exactly once per epoch across ranks when world_size divides dataset_len.
    `position` counts the indices of this rank already consumed; iteration starts there.
    """

    def __init__(self, dataset_len: int, shuffle: bool = True, seed: int = 0, rank: int = 0,
                 world_size: int = 1, drop_last: bool = False) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.dataset_len, self.shuffle, self.seed = int(dataset_len), shuffle, int(seed)
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.epoch, self.position = 0, 0

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self.epoch, self.position = int(epoch), 0

    def indices(self) -> list[int]:
        """This rank's full index list for the current epoch."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.dataset_len, generator=g).tolist()
        else:
            order = list(range(self.dataset_len))
        if self.drop_last:
            order = order[: len(order) - len(order) % self.world_size]
        elif order and len(order) % self.world_size:
            extra = self.world_size - len(order) % self.world_size
            order += (order * (extra // len(order) + 1))[:extra]
        return order[self.rank:: self.world_size]

    def __len__(self) -> int:
        if self.drop_last:
            return self.dataset_len // self.world_size
        return -(-self.dataset_len // self.world_size)

    def __iter__(self) -> Iterator[int]:
        order = self.indices()
        if self.position >= len(order):
            self.position = 0  # a finished epoch iterated again replays it from the start
        for k in range(self.position, len(order)):
            self.position = k + 1
            yield order[k]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        missing = {"epoch", "position"} - set(state)
        if missing:
            raise KeyError(f"sampler state lacks keys {sorted(missing)}")
        if "seed" in state and int(state["seed"]) != self.seed:
            raise ValueError(f"sampler state has seed {state['seed']}, this sampler {self.seed}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


# The single-process sampler is the distributed one with its defaults (rank 0 of 1).
ResumableSampler = DistributedResumableSampler


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def leave_stop_signals_to_the_main_process(worker_id: int) -> None:
    """DataLoader workers ignore SIGINT and SIGTERM. A stop sent to the whole process group (Ctrl-C,
    `timeout`, `scancel`) would otherwise kill them first and break the main process's graceful
    save; the main process stops them itself when its loader is done. Workers start with the
    signals blocked (`stop_signals_blocked`): one that arrived before this point is discarded
    by SIG_IGN when they are unblocked."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _start_worker(user_init: Callable[[int], None] | None, worker_id: int) -> None:
    """Every worker of the loaders below: stop signals first, then the caller's worker_init_fn."""
    leave_stop_signals_to_the_main_process(worker_id)
    if user_init is not None:
        user_init(worker_id)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while DataLoader workers start: they inherit the blocked mask, so a
    stop sent to the process group between their birth and `leave_stop_signals_to_the_main_process`
    cannot kill them (it happens when every epoch starts new workers). The main process receives a
    signal that arrived meanwhile as soon as the block is lifted."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class ResumableDataLoader(DataLoader):
    """A DataLoader over a `DistributedResumableSampler` and a `DataCollatorForMLM`.

    It keeps (epoch, batch index) in step for both, so shuffling and masking are a function of
    (seed, epoch, batch index) only: iterating again after a full pass starts the next epoch
    (after a partial pass, it continues where the consumer stopped),
    `state_dict()` records the batches consumed (not those prefetched by workers), and
    `load_state_dict()` makes the next iteration continue with exactly the batches, and masks,
    that the interrupted run would have produced.

    With workers and `start_next_epoch_early`, the next epoch's workers start (and prefetch) while
    the last batches of this one are consumed. Otherwise every epoch begins with a pause while they
    start: 0.2-0.35 s (`benchmarks/epoch_start.py`), seen every 45 steps of BERT-base pretraining on
    WikiText-2 over two H200s, whose steps take 0.05 s. `stop_after` tells it where the run ends,
    so that no workers start for an epoch that will not be read.
    """

    def __init__(self, dataset: Dataset, sampler: DistributedResumableSampler,
                 start_next_epoch_early: bool = False, **kwargs: Any) -> None:
        kwargs["worker_init_fn"] = functools.partial(_start_worker, kwargs.get("worker_init_fn"))
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.epoch, self.batch_index, self._finished = 0, 0, False
        self.start_next_epoch_early = start_next_epoch_early and self.num_workers > 0
        self._next: tuple[int, Iterator] | None = None  # (epoch, its batches), started early
        self._end: int | None = None  # where reading stops, as epoch * len(self) + batch index

    def stop_after(self, batches: int) -> None:
        """The consumer reads at most `batches` more batches (from the current position)."""
        epoch, index = (self.epoch + 1, 0) if self._finished else (self.epoch, self.batch_index)
        self._end = epoch * len(self) + index + batches

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.batch_index, self._finished = int(epoch), 0, False

    def state_dict(self) -> dict[str, int]:
        if self._finished:
            return {"epoch": self.epoch + 1, "batch_index": 0}
        return {"epoch": self.epoch, "batch_index": self.batch_index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch_index = int(state["epoch"]), int(state["batch_index"])
        self._finished, self._next = False, None

    def _start(self, epoch: int, batch_index: int) -> Iterator[dict[str, torch.Tensor]]:
        """Batches of `epoch` from `batch_index` on; the workers start (and prefetch) now. Sampler
        and collator are set here, in this process: the workers of an epoch still being consumed
        hold their own copies (and its sampler iterator its own order), so they keep their epoch."""
        self.sampler.set_epoch(epoch)
        self.sampler.load_state_dict({"epoch": epoch, "position": batch_index * self.batch_size})
        if hasattr(self.collate_fn, "set_epoch"):
            self.collate_fn.set_epoch(epoch, start_step=batch_index)
        with stop_signals_blocked():
            return super().__iter__()  # starts the workers, if any

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._finished:
            self.set_epoch(self.epoch + 1)
        early, self._next = self._next, None
        fresh = self.batch_index == 0 and early is not None and early[0] == self.epoch
        batches = early[1] if fresh else self._start(self.epoch, self.batch_index)
        # the next epoch's workers start when this epoch's last prefetched batches are out
        start_next_at = len(self) - max(8, self.num_workers * (self.prefetch_factor or 2))
        next_read = self._end is None or (self.epoch + 1) * len(self) < self._end
        for batch in batches:
            self.batch_index += 1
            if self.start_next_epoch_early and next_read and self.batch_index == max(1, start_next_at):
                self._next = (self.epoch + 1, self._start(self.epoch + 1, 0))
            yield batch
        self._finished = True


def _as_list(examples: list[Any]) -> list[Any]:
    """DataLoader collate_fn that leaves the examples to `StreamingDataLoader`."""
    return examples


class StreamingDataLoader:
    """Masked batches from a `StreamingTextDataset`, resumable at the examples consumed.

    DataLoader workers read, shuffle and tokenise their shards; the batches are padded and
    masked here, in the consuming process, so a mask is a function of (seed, epoch, batch index)
    as with `ResumableDataLoader`, whatever the number of workers. Worker batches arrive
    round-robin: `state_dict()` records the examples consumed in this epoch (in all and per
    worker) and which worker's batch comes next; after `load_state_dict()` the next iteration
    skips those examples and continues with the batches, and masks, that an uninterrupted run
    would have produced (same seed, ranks and workers). Iterating again after a full pass
    starts the next epoch, which reshuffles the stream. The length of an epoch is not known ahead,
    so unlike `ResumableDataLoader` its workers start when the epoch begins (a pause of a fraction
    of a second, once per pass over a corpus large enough to be streamed).
    """

    def __init__(self, dataset: StreamingTextDataset, collator: DataCollatorForMLM, batch_size: int,
                 num_workers: int = 0, pin_memory: bool = False, seed: int = 0) -> None:
        self.dataset, self.collator, self.batch_size = dataset, collator, batch_size
        self.num_shards, self.pin_memory = max(1, num_workers), pin_memory
        # an own generator: starting an iteration never draws from the global RNG (dropout)
        self.loader = DataLoader(dataset, batch_size=batch_size, collate_fn=_as_list, num_workers=num_workers,
                                 generator=torch.Generator().manual_seed(seed),
                                 worker_init_fn=functools.partial(_start_worker, None))
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.batch_index, self.examples = int(epoch), 0, 0
        self.positions, self.next_worker, self._finished = [0] * self.num_shards, 0, False

    def state_dict(self) -> dict[str, Any]:
        if self._finished:
            return {"epoch": self.epoch + 1, "batch_index": 0, "examples": 0,
                    "positions": [0] * self.num_shards, "next_worker": 0}
        return {"epoch": self.epoch, "batch_index": self.batch_index, "examples": self.examples,
                "positions": list(self.positions), "next_worker": self.next_worker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["positions"]) != self.num_shards:
            raise ValueError(f"stream state has positions for {len(state['positions'])} DataLoader worker(s), "
                             f"this loader runs {self.num_shards}")
        self.epoch, self.batch_index = int(state["epoch"]), int(state["batch_index"])
        self.examples, self.next_worker = int(state["examples"]), int(state["next_worker"])
        self.positions, self._finished = [int(p) for p in state["positions"]], False

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._finished:
            self.set_epoch(self.epoch + 1)
        self.dataset.set_epoch(self.epoch, skip=list(self.positions), first_worker=self.next_worker)
        self.collator.set_epoch(self.epoch, start_step=self.batch_index)
        fresh = self.batch_index == 0
        with stop_signals_blocked():
            batches = iter(self.loader)  # starts the workers, if any
        for examples in batches:
            # a batch is consecutive examples of one worker's shard: its last one is the position
            worker = examples[-1]["worker"]
            self.positions[worker] = examples[-1]["position"]
            self.next_worker = (worker + 1) % self.num_shards
            self.batch_index += 1
            self.examples += len(examples)
            batch = self.collator(examples)
            yield {k: v.pin_memory() for k, v in batch.items()} if self.pin_memory else batch
        if fresh and self.batch_index == 0:
            ds = self.dataset
            raise ValueError(f"no text for rank {ds.rank} of {ds.world_size} in {[str(f) for f in ds.files]}: "
                             f"fewer documents than ranks x DataLoader workers ({ds.world_size} x {self.num_shards})")
        self._finished = True


def _make_loader(dataset: Dataset, collator: DataCollatorForMLM, batch_size: int, shuffle: bool,
                 seed: int, num_workers: int, rank: int, world_size: int,
                 drop_last: bool) -> ResumableDataLoader:
    sampler = DistributedResumableSampler(len(dataset), shuffle=shuffle, seed=seed, rank=rank,
                                          world_size=world_size, drop_last=drop_last)
    return ResumableDataLoader(dataset, sampler, batch_size=batch_size, collate_fn=collator,
                               num_workers=num_workers, drop_last=drop_last)


def create_mlm_dataloader(
    texts: Sequence[str] | Sequence[Sequence[int]],
    tokenizer: Any,
    batch_size: int = 8,
    mask_probability: float = 0.15,
    max_length: int = 128,
    shuffle: bool = True,
    whole_word: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    pad_to_multiple_of: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
) -> ResumableDataLoader:
    """Masked-LM batches from texts: dicts of input_ids, token_type_ids, attention_mask and
    labels, all (B, T) long, T <= max_length (padded to the longest example of the batch)."""
    dataset = MLMDataset(texts, tokenizer, max_length)
    collator = DataCollatorForMLM(tokenizer, mask_probability, whole_word, pad_to_multiple_of, seed)
    return _make_loader(dataset, collator, batch_size, shuffle, seed, num_workers, rank,
                        world_size, drop_last)


def create_pretraining_dataloader(
    documents: Sequence[Any] | TokenCache,
    tokenizer: Any,
    batch_size: int = 8,
    max_length: int = 128,
    nsp: bool = True,
    mask_probability: float = 0.15,
    whole_word: bool = False,
    short_seq_prob: float = 0.1,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    pad_to_multiple_of: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
) -> ResumableDataLoader:
    """BERT pretraining batches from documents (see `NSPDataset` for the accepted forms).

    nsp=True: MLM + NSP pairs; batches add next_sentence_label (B,) (0 IsNext, 1 random).
    nsp=False: MLM only on packed full-length blocks (`PackedDataset`); `documents` may then be
    a `TokenCache`, and batches add sequence_ids (B, T) for a block-diagonal attention mask.
    """
    if nsp:
        if isinstance(documents, TokenCache):
            raise ValueError("NSP needs sentence boundaries: pass documents, not a TokenCache")
        dataset: Dataset = NSPDataset(documents, tokenizer, max_length, seed, short_seq_prob)
    else:
        cache = documents
        if not isinstance(cache, TokenCache):
            texts = [d if isinstance(d, str) else "\n".join(d) for d in documents]
            cache = TokenCache.from_documents(_tokenize(tokenizer, texts), tokenizer.vocab_size)
        dataset = PackedDataset(cache, max_length, tokenizer=tokenizer)
    collator = DataCollatorForMLM(tokenizer, mask_probability, whole_word, pad_to_multiple_of, seed)
    return _make_loader(dataset, collator, batch_size, shuffle, seed, num_workers, rank,
                        world_size, drop_last)
