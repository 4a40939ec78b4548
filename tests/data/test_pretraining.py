"""Tests for bert_kit.data.pretraining: NSP pairs, packing, samplers, resumable loaders.

Run: .venv/bin/python -m pytest tests/data/test_pretraining.py -q
"""

import random

import numpy as np
import pytest
import torch

from bert_kit.data.corpus import read_documents
from bert_kit.data.token_cache import TokenCache
from bert_kit.data.masking import IGNORE_INDEX
from bert_kit.data.pretraining import (
    DistributedResumableSampler,
    MLMDataset,
    NSPDataset,
    PackedDataset,
    ResumableSampler,
    _truncate_pair,
    block_diagonal_mask,
    create_mlm_dataloader,
    create_nsp_instances,
    create_pretraining_dataloader,
    split_sentences,
)


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    return get_tokenizer(minilm_path)


@pytest.fixture(scope="module")
def wiki_docs(data_dir):
    return read_documents(data_dir / "wikitext-2" / "valid.txt", mode="wikitext")


@pytest.fixture(scope="module")
def nsp(wiki_docs, tokenizer):
    return NSPDataset(wiki_docs, tokenizer, max_length=128, seed=0)


def _key(ids):
    return "," + ",".join(map(str, ids)) + ","


def test_split_sentences():
    text = 'It rained . Then it " stopped " ! Was it over ? yes .\nNew line here'
    assert split_sentences(text) == ["It rained .", 'Then it " stopped " !', "Was it over ? yes .",
                                     "New line here"]


def test_nsp_label_balance(nsp, tokenizer):
    labels = [inst.next_sentence_label for inst in nsp.instances]
    # Pairs of three more seeds, reusing the tokenised documents: ~10k pairs in all.
    for seed in (1, 2, 3):
        more = create_nsp_instances(nsp.documents, 128, random.Random(seed))
        labels += [inst.next_sentence_label for inst in more]
    assert len(labels) > 8000
    assert abs(np.mean(labels) - 0.5) < 0.02


def test_nsp_example_layout(nsp, tokenizer):
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    lengths = []
    for i in range(len(nsp)):
        ex = nsp[i]
        ids, types = ex["input_ids"].tolist(), ex["token_type_ids"].tolist()
        lengths.append(len(ids))
        assert len(ids) == len(types) <= 128
        assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2
        first_sep = ids.index(sep)
        a, b = nsp.instances[i].tokens_a, nsp.instances[i].tokens_b
        assert ids[1:first_sep] == a and ids[first_sep + 1:-1] == b and a and b
        assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
        assert int(ex["next_sentence_label"]) == nsp.instances[i].next_sentence_label
    assert max(lengths) == 128
    # short_seq_prob: some documents target a shorter length.
    assert np.mean(np.array(lengths) < 64) > 0.02


def test_nsp_pairs_come_from_the_right_documents(nsp):
    flat = [_key([t for s in doc for t in s]) for doc in nsp.documents]
    n_next = n_random = 0
    for inst in nsp.instances:
        if inst.next_sentence_label == 0:  # IsNext: B continues A in the same document
            assert inst.doc_a == inst.doc_b
            assert _key(inst.tokens_a + inst.tokens_b) in flat[inst.doc_a]
            n_next += 1
        else:  # random: B is a real span of another document
            assert inst.doc_b != inst.doc_a
            assert _key(inst.tokens_b) in flat[inst.doc_b]
            assert _key(inst.tokens_a) in flat[inst.doc_a]
            n_random += 1
    assert n_next > 500 and n_random > 500


def test_truncate_pair_longest_first():
    a, b = list(range(10)), list(range(100, 104))
    ta, tb = _truncate_pair(a, b, 8)
    assert (ta, tb) == ([6, 7, 8, 9], [100, 101, 102, 103])  # A trimmed at its front
    ta, tb = _truncate_pair(a, b, 5)
    assert (ta, tb) == ([7, 8, 9], [100, 101])  # equal length: B first, then alternate
    assert _truncate_pair(a, b, 20) == (a, b)


def test_nsp_needs_two_documents(tokenizer):
    with pytest.raises(ValueError, match="at least 2 non-empty documents"):
        NSPDataset(["Only one document . With two sentences ."], tokenizer)


def test_create_mlm_dataloader_as_in_readme(tokenizer):
    texts = [f"Your training text number {i} about masked language models." for i in range(20)]
    texts.append("a much longer text " * 60)
    train_loader = create_mlm_dataloader(
        texts=texts,
        tokenizer=tokenizer,
        batch_size=8,
        mask_probability=0.15,
    )
    batches = list(train_loader)
    assert [b["input_ids"].shape[0] for b in batches] == [8, 8, 5]
    long_row = texts.index(texts[-1])
    assert len(train_loader) == 3 and long_row == 20
    for b in batches:
        assert set(b) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
        B, T = b["input_ids"].shape
        assert T <= 128
        assert all(b[k].shape == (B, T) and b[k].dtype == torch.long for k in b)
        assert torch.equal(b["attention_mask"].sum(1) > 0, torch.ones(B, dtype=torch.bool))
        assert (b["labels"][b["attention_mask"] == 0] == IGNORE_INDEX).all()
    assert max(b["input_ids"].shape[1] for b in batches) == 128  # the long text, truncated

    # Unshuffled: labels are the dataset's original ids at masked positions, -100 elsewhere.
    ds = MLMDataset(texts, tokenizer)
    loader = create_mlm_dataloader(texts, tokenizer, batch_size=21, shuffle=False,
                                   mask_probability=0.3)
    b = next(iter(loader))
    for i in range(len(texts)):
        orig = ds[i]["input_ids"]
        n = len(orig)
        lab = b["labels"][i, :n]
        chosen = lab != IGNORE_INDEX
        assert torch.equal(lab[chosen], orig[chosen])
        assert torch.equal(b["input_ids"][i, :n][~chosen], orig[~chosen])
        assert not chosen[0] and not chosen[n - 1]  # [CLS] and [SEP]
    assert (b["labels"] != IGNORE_INDEX).sum() > 50


def test_sampler_covers_each_index_once_across_ranks():
    for world in (1, 2, 4):
        seen = []
        for rank in range(world):
            s = DistributedResumableSampler(20, seed=1, rank=rank, world_size=world)
            s.set_epoch(3)
            seen += list(s)
            assert len(s) == 20 // world
        assert sorted(seen) == list(range(20))
    # Not divisible: padding repeats a few indices; drop_last cuts them.
    padded = [i for r in range(3) for i in DistributedResumableSampler(10, rank=r, world_size=3)]
    assert len(padded) == 12 and set(padded) == set(range(10))
    cut = [i for r in range(3)
           for i in DistributedResumableSampler(10, rank=r, world_size=3, drop_last=True)]
    assert len(cut) == len(set(cut)) == 9


def test_sampler_is_deterministic_and_resumes_mid_epoch():
    s = ResumableSampler(50, seed=7)
    s.set_epoch(2)
    full = list(s)
    assert sorted(full) == list(range(50)) and full != list(range(50))
    s.set_epoch(3)
    assert list(s) != full
    # Consume 17 indices, save, restore into a fresh sampler: exactly the remaining ones follow.
    s.set_epoch(2)
    it = iter(s)
    head = [next(it) for _ in range(17)]
    state = s.state_dict()
    assert state == {"epoch": 2, "position": 17, "seed": 7}
    fresh = ResumableSampler(50, seed=7)
    fresh.load_state_dict(state)
    assert head + list(fresh) == full
    with pytest.raises(ValueError, match="seed"):
        ResumableSampler(50, seed=8).load_state_dict(state)


def test_loader_resume_reproduces_batches_and_masks(tokenizer, wiki_docs):
    texts = [line for d in wiki_docs[:3] for line in d.splitlines()][:40]
    loader = create_mlm_dataloader(texts, tokenizer, batch_size=4, max_length=48, seed=11)
    epoch0 = list(loader)
    epoch1 = list(loader)  # a second pass starts the next epoch: new order and masks
    assert len(epoch0) == 10
    assert not torch.equal(epoch0[0]["labels"], epoch1[0]["labels"])

    resumed = create_mlm_dataloader(texts, tokenizer, batch_size=4, max_length=48, seed=11)
    it = iter(resumed)
    for k in range(3):
        assert all(torch.equal(v, epoch0[k][n]) for n, v in next(it).items())
    state = resumed.state_dict()
    assert state == {"epoch": 0, "batch_index": 3}
    again = create_mlm_dataloader(texts, tokenizer, batch_size=4, max_length=48, seed=11,
                                  num_workers=2)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == 7
    for got, want in zip(rest, epoch0[3:]):
        assert all(torch.equal(got[n], want[n]) for n in want)
    assert again.state_dict() == {"epoch": 1, "batch_index": 0}


def test_next_epoch_started_early_gives_the_same_batches_and_resumes(tokenizer, wiki_docs):
    from bert_kit.data.pretraining import ResumableDataLoader

    texts = [line for d in wiki_docs[:3] for line in d.splitlines()][:60]

    def loader(workers: int, early: bool) -> ResumableDataLoader:
        plain = create_mlm_dataloader(texts, tokenizer, batch_size=4, max_length=48, seed=11)
        sampler = DistributedResumableSampler(len(plain.dataset), shuffle=True, seed=11)
        return ResumableDataLoader(plain.dataset, sampler, batch_size=4, collate_fn=plain.collate_fn,
                                   num_workers=workers, start_next_epoch_early=early)

    def same(a, b):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    reference = loader(0, False)
    epochs = [list(reference) for _ in range(3)]
    n = len(epochs[0])
    assert n == 12 and not same(epochs[0][0], epochs[1][0])
    early = loader(2, True)
    for e in range(3):
        it = iter(early)
        for k, want in enumerate(epochs[e]):
            assert same(next(it), want), (e, k)
            # the next epoch's workers start once n - 8 batches are out, while this epoch's run
            assert (early._next is not None) == (k + 1 >= n - 8), k
        assert next(it, None) is None
    # stopped with the next epoch started: its state is still the batches consumed
    stopped = loader(2, True)
    it = iter(stopped)
    for _ in range(10):
        next(it)
    assert stopped._next is not None and stopped.state_dict() == {"epoch": 0, "batch_index": 10}
    resumed = loader(2, True)
    resumed.load_state_dict(stopped.state_dict())
    rest = list(resumed) + list(resumed)
    assert len(rest) == 2 + n and all(same(a, b) for a, b in zip(rest, epochs[0][10:] + epochs[1]))
    # a partial pass iterated again continues where it stopped, not with the early epoch
    assert all(same(a, b) for a, b in zip(list(stopped), epochs[0][10:]))
    assert stopped.state_dict() == {"epoch": 1, "batch_index": 0}


def test_no_workers_start_for_an_epoch_past_the_runs_end(tokenizer, wiki_docs):
    from bert_kit.data.pretraining import ResumableDataLoader

    texts = [line for d in wiki_docs[:3] for line in d.splitlines()][:60]
    plain = create_mlm_dataloader(texts, tokenizer, batch_size=4, max_length=48, seed=11)

    def started_early(stop_after: int | None, epochs: int = 2, resume_at: int = 0) -> list[bool]:
        """Per epoch read: whether the next epoch's workers were started during it."""
        sampler = DistributedResumableSampler(len(plain.dataset), shuffle=True, seed=11)
        loader = ResumableDataLoader(plain.dataset, sampler, batch_size=4, collate_fn=plain.collate_fn,
                                     num_workers=1, start_next_epoch_early=True)
        loader.load_state_dict({"epoch": 0, "batch_index": resume_at})
        if stop_after is not None:
            loader.stop_after(stop_after)
        seen = []
        for _ in range(epochs):
            for _ in loader:
                pass
            seen.append(loader._next is not None)
        return seen

    n = len(plain)  # 12 batches an epoch
    assert started_early(None) == [True, True]
    assert started_early(2 * n) == [True, False]  # the run ends with the second epoch
    assert started_early(n) == [False, False]
    assert started_early(n + 1) == [True, False]  # one batch of the second epoch is read
    assert started_early(n - 3 + 1, resume_at=3) == [True, False]  # counted from the resumed position
    assert started_early(n - 3, resume_at=3) == [False, False]


def test_packed_dataset_reconstructs_the_stream():
    docs = [[5, 6, 7], [8], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [], [19, 20]]
    cache = TokenCache.from_documents(docs, vocab_size=30522)
    ds = PackedDataset(cache, max_length=6, cls_token_id=1, sep_token_id=2)
    stream = [t for d in docs for t in (*d, 2)]
    blocks = [ds[i] for i in range(len(ds))]
    assert len(ds) == -(-len(stream) // 5)
    assert all(b["input_ids"][0] == 1 for b in blocks)
    assert all(len(b["input_ids"]) == 6 for b in blocks[:-1])
    assert [t for b in blocks for t in b["input_ids"][1:].tolist()] == stream
    # sequence_ids: numbering of documents within the block; [SEP] closes its document.
    assert blocks[0]["input_ids"].tolist() == [1, 5, 6, 7, 2, 8]
    assert blocks[0]["sequence_ids"].tolist() == [0, 0, 0, 0, 0, 1]
    assert blocks[3]["input_ids"].tolist() == [1, 18, 2, 2, 19, 20]
    assert blocks[3]["sequence_ids"].tolist() == [0, 0, 0, 1, 2, 2]
    with pytest.raises(IndexError):
        ds[len(ds)]

    mask = block_diagonal_mask(torch.tensor([[0, 0, 1, -1]]))
    assert mask.shape == (1, 4, 4)
    assert mask[0].int().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]


def test_create_pretraining_dataloader_nsp_and_packed(tokenizer, wiki_docs):
    loader = create_pretraining_dataloader(wiki_docs[:6], tokenizer, batch_size=8, max_length=64)
    b = next(iter(loader))
    assert b["next_sentence_label"].shape == (8,)
    assert set(b["next_sentence_label"].tolist()) <= {0, 1}
    assert b["input_ids"].shape == b["token_type_ids"].shape == b["labels"].shape
    assert b["input_ids"].shape[1] <= 64 and (b["token_type_ids"] == 1).any()

    packed = create_pretraining_dataloader(wiki_docs[:6], tokenizer, batch_size=8,
                                           max_length=64, nsp=False, pad_to_multiple_of=8)
    batches = list(packed)
    assert all(b["input_ids"].shape[1] == 64 for b in batches[:-1])
    assert "next_sentence_label" not in batches[0] and "sequence_ids" in batches[0]
    n_tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    cache = packed.dataset.cache
    assert n_tokens == cache.num_tokens + cache.num_documents + len(packed.dataset)
    with pytest.raises(ValueError, match="TokenCache"):
        create_pretraining_dataloader(cache, tokenizer, nsp=True)
