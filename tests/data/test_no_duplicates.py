"""The no-duplicates batch sampler (data/no_duplicates.py): no text twice in a (global) batch,
a deterministic order per (seed, epoch), ranks that split the one-process batch, and a resumed
loader that continues with the very batches of the uninterrupted one.

Run: .venv/bin/python -m pytest tests/data/test_no_duplicates.py -q
"""

from __future__ import annotations

import random

import pytest

from bert_kit.data.no_duplicates import NoDuplicatesSampler, text_keys
from bert_kit.data.pretraining import ResumableDataLoader


def queries_with_many_positives(n_queries: int = 30, seed: int = 0) -> list[tuple[str, str]]:
    """(query, passage) pairs as in NFCorpus's train split: each query with several passages, and
    some passages relevant to several queries."""
    rng = random.Random(seed)
    pairs = []
    for q in range(n_queries):
        for _ in range(rng.randint(1, 8)):
            pairs.append((f"query {q}", f"passage {rng.randint(0, 60)}"))
    return list(dict.fromkeys(pairs))


def batches_of(sampler: NoDuplicatesSampler) -> list[list[int]]:
    order = list(sampler)
    return [order[i:i + sampler.batch_size] for i in range(0, len(order), sampler.batch_size)]


def texts_of(pairs, batch) -> list[str]:
    return [text for i in batch for text in pairs[i]]


def test_no_text_twice_in_a_batch_and_no_example_twice_in_an_epoch():
    pairs = queries_with_many_positives()
    sampler = NoDuplicatesSampler(text_keys(list(zip(*pairs))), batch_size=8, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = batches_of(sampler)
        assert len(batches) == len(pairs) // 8 and all(len(b) == 8 for b in batches)
        assert sampler.duplicates == 0
        for batch in batches:
            texts = texts_of(pairs, batch)
            assert len(set(texts)) == len(texts), batch
        seen = [i for b in batches for i in b]
        assert len(set(seen)) == len(seen) == len(pairs) // 8 * 8


def test_the_order_is_a_function_of_seed_and_epoch():
    keys = text_keys(list(zip(*queries_with_many_positives())))
    a, b, c = (NoDuplicatesSampler(keys, 8, seed=s) for s in (3, 3, 4))
    assert list(a) == list(b) != list(c)
    a.set_epoch(1)
    assert list(a) != list(b)


def test_ranks_split_the_global_batch_of_one_process():
    pairs = queries_with_many_positives()
    keys = text_keys(list(zip(*pairs)))
    one = batches_of(NoDuplicatesSampler(keys, 8, seed=1))
    ranks = [batches_of(NoDuplicatesSampler(keys, 4, seed=1, rank=r, world_size=2)) for r in range(2)]
    assert [r0 + r1 for r0, r1 in zip(*ranks)] == one


def test_too_few_distinct_texts_still_fill_every_batch_and_say_so():
    pairs = [("same query", f"passage {i}") for i in range(12)] + [(f"q{i}", f"p{i}") for i in range(12)]
    sampler = NoDuplicatesSampler(text_keys(list(zip(*pairs))), batch_size=4, seed=0)
    batches = batches_of(sampler)
    assert len(batches) == 6 and all(len(b) == 4 for b in batches)
    # "same query" fits once in each of the 6 batches: the other 6 of its 12 rows sit beside a copy,
    # or sit out the epoch
    held = sum(texts_of(pairs, b).count("same query") for b in batches)
    assert sampler.duplicates == held - 6


def test_fewer_examples_than_a_batch_is_an_error():
    with pytest.raises(ValueError, match="3 training examples fill no batch of 4 x 2 ranks"):
        NoDuplicatesSampler([(0,), (1,), (2,)], 4, world_size=2)


def test_a_resumed_loader_continues_with_the_same_batches():
    pairs = queries_with_many_positives()
    keys = text_keys(list(zip(*pairs)))

    def loader():
        return ResumableDataLoader(list(range(len(pairs))), NoDuplicatesSampler(keys, 8, seed=2), batch_size=8,
                                   collate_fn=list)

    full = loader()
    everything = [b for _ in range(2) for b in full]  # two epochs
    stopped = loader()
    it = iter(stopped)
    first = [next(it) for _ in range(5)]
    state = stopped.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = list(resumed) + list(resumed)
    assert first + rest == everything
