"""Batches in which no text comes twice: in-batch negatives that are never copies of a positive.

With in-batch negatives (`training/contrastive.py`) every other row's texts are an anchor's
negatives. A query paired with several relevant passages (NFCorpus's train split has 42 per query
on average), or a passage relevant to several queries, would put a copy of an anchor's own
positive among its negatives when two of its rows shared a batch, teaching the model to push
apart what it should pull together. sentence-transformers' answer is its NO_DUPLICATES batch
sampler; this is the same rule, deterministic and resumable:

    sampler = NoDuplicatesSampler(keys, batch_size=64, seed=42)   # keys[i]: ids of example i's texts
    loader = ResumableDataLoader(items, sampler, batch_size=64, ...)

Each epoch shuffles the examples by (seed, epoch), as `DistributedResumableSampler` does, and
deals them in that order into `len(keys) // (batch_size x world_size)` global batches: an example
goes to the first batch with room after the last batch that holds one of its texts. An example
that fits nowhere (a text in more examples than there are batches) waits; the batches still short
at the end take the waiting ones, and `duplicates` counts those (a data set with that few distinct
texts cannot fill its batches otherwise). The examples past the last whole batch sit out the epoch
(another order the next epoch), so every batch holds batch_size examples on every rank. Rank r
takes rows [r B, (r + 1) B) of each global batch: the ranks' batches together are the batch one
process would take with batch_size x world_size, so in-batch negatives gathered across ranks are
duplicate-free too. Position and state are the parent's: a run resumes mid-epoch exactly.
"""

from __future__ import annotations

from typing import Sequence

import torch

from bert_kit.data.pretraining import DistributedResumableSampler


def text_keys(columns: Sequence[Sequence[str]]) -> list[tuple[int, ...]]:
    """Per example, the ids of its texts (one id per distinct text across every column): the
    `keys` of `NoDuplicatesSampler`. columns: k columns of one text per example each."""
    ids: dict[str, int] = {}
    per_column = [[ids.setdefault(text, len(ids)) for text in column] for column in columns]
    return [tuple(row) for row in zip(*per_column)]


class NoDuplicatesSampler(DistributedResumableSampler):
    """This rank's examples, epoch by epoch, in batches of `batch_size` whose global batch (all
    ranks' together) holds no text twice. keys: per example the ids of its texts (`text_keys`)."""

    def __init__(self, keys: Sequence[Sequence[int]], batch_size: int, seed: int = 0, rank: int = 0,
                 world_size: int = 1) -> None:
        super().__init__(len(keys), shuffle=True, seed=seed, rank=rank, world_size=world_size)
        self.keys = [tuple(k) for k in keys]
        self.batch_size = int(batch_size)
        self.global_batch = self.batch_size * world_size
        self.num_batches = len(self.keys) // self.global_batch
        if self.num_batches < 1:
            raise ValueError(f"{len(self.keys)} training examples fill no batch of {self.batch_size}"
                             + (f" x {world_size} ranks" if world_size > 1 else "") + ": lower batch_size")
        self.duplicates = 0  # examples of the current epoch placed beside a copy of one of their texts
        self._dealt: tuple[int, list[list[int]]] | None = None  # (epoch, its global batches)

    def global_batches(self) -> list[list[int]]:
        """The epoch's global batches (batch_size x world_size example indices each)."""
        if self._dealt is not None and self._dealt[0] == self.epoch:
            return self._dealt[1]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.keys), generator=g).tolist()
        size, count = self.global_batch, self.num_batches
        batches: list[list[int]] = [[] for _ in range(count)]
        last: dict[int, int] = {}  # text id -> the last batch that holds it
        first_open, waiting = 0, []
        for i in order:
            keys = self.keys[i]
            b = max([first_open, *(last.get(k, -1) + 1 for k in keys)])
            while b < count and len(batches[b]) == size:
                b += 1
            if b == count:  # no batch without one of its texts has room
                waiting.append(i)
                continue
            batches[b].append(i)
            for k in keys:
                last[k] = b
            while first_open < count and len(batches[first_open]) == size:
                first_open += 1
        self.duplicates = 0
        for batch in batches:  # short batches take the waiting examples, copies and all
            room = size - len(batch)
            if room and waiting:
                batch.extend(waiting[:room])
                self.duplicates += len(waiting[:room])
                waiting = waiting[room:]
        self._dealt = (self.epoch, batches)
        return batches

    def indices(self) -> list[int]:
        """This rank's indices for the current epoch: its rows of each global batch, in batch order."""
        lo, hi = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        return [i for batch in self.global_batches() for i in batch[lo:hi]]

    def __len__(self) -> int:
        return self.num_batches * self.batch_size
