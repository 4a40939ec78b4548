"""Tests for bert_kit.data.masking: 80/10/10 statistics, special tokens, whole words, seeding.

Run: .venv/bin/python -m pytest tests/data/test_masking.py -q
"""

import pytest
import torch

from bert_kit.data.masking import (
    IGNORE_INDEX,
    DataCollatorForMLM,
    continuation_from_word_ids,
    mask_tokens,
    row_prediction_slots,
)

CLS, SEP, PAD, MASK, UNK = 101, 102, 0, 103, 100
SPECIAL = [PAD, UNK, CLS, SEP, MASK]
V = 30522


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    return get_tokenizer(minilm_path)


@pytest.fixture(scope="module")
def wiki_lines(data_dir):
    lines = (data_dir / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if len(ln.strip()) > 40 and not ln.strip().startswith("=")]


def _synthetic_batch(B=400, T=512, seed=0):
    """(B, T) ids: [CLS] words [SEP] then padding; rows have varied lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, V, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    for i, n in enumerate(lengths.tolist()):
        ids[i, 0], ids[i, n - 1] = CLS, SEP
        ids[i, n:] = PAD
    return ids


def test_masking_statistics_80_10_10():
    ids = _synthetic_batch()
    special = torch.isin(ids, torch.tensor(SPECIAL))
    eligible = int((~special).sum())
    assert eligible > 140_000
    g = torch.Generator().manual_seed(1)
    masked, labels = mask_tokens(ids, SPECIAL, V, MASK, 0.15, generator=g)

    chosen = labels != IGNORE_INDEX
    n = int(chosen.sum())
    assert abs(n / eligible - 0.15) < 0.005
    # Labels: original id where chosen, -100 elsewhere; specials and padding never chosen.
    assert torch.equal(labels[chosen], ids[chosen])
    assert not chosen[special].any()
    assert torch.equal(masked[special], ids[special])
    assert torch.equal(masked[~chosen], ids[~chosen])

    to_mask = chosen & (masked == MASK)
    to_random = chosen & (masked != MASK) & (masked != ids)
    unchanged = chosen & (masked == ids)
    assert abs(int(to_mask.sum()) / n - 0.8) < 0.01
    assert abs(int(to_random.sum()) / n - 0.1) < 0.01
    assert abs(int(unchanged.sum()) / n - 0.1) < 0.01
    # Random replacements are never special tokens and spread over the vocabulary.
    replacements = masked[to_random]
    assert not torch.isin(replacements, torch.tensor(SPECIAL)).any()
    assert replacements.unique().numel() > 0.8 * replacements.numel()
    assert int(replacements.min()) < 2000 and int(replacements.max()) > V - 2000


def test_mask_and_id_forms_agree_and_edge_probabilities():
    ids = _synthetic_batch(B=8, T=64)
    special = torch.isin(ids, torch.tensor(SPECIAL))
    a = mask_tokens(ids, SPECIAL, V, MASK, generator=torch.Generator().manual_seed(3))
    b = mask_tokens(ids, special, V, MASK, generator=torch.Generator().manual_seed(3),
                    random_exclude_ids=SPECIAL)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    _, none = mask_tokens(ids, SPECIAL, V, MASK, mask_probability=0.0)
    assert (none == IGNORE_INDEX).all()
    _, all_ = mask_tokens(ids, SPECIAL, V, MASK, mask_probability=1.0)
    assert torch.equal(all_ != IGNORE_INDEX, ~special)


def test_reproducible_with_seed_and_input_untouched():
    ids = _synthetic_batch(B=16, T=128)
    before = ids.clone()
    m1, l1 = mask_tokens(ids, SPECIAL, V, MASK, generator=torch.Generator().manual_seed(7))
    m2, l2 = mask_tokens(ids, SPECIAL, V, MASK, generator=torch.Generator().manual_seed(7))
    m3, l3 = mask_tokens(ids, SPECIAL, V, MASK, generator=torch.Generator().manual_seed(8))
    assert torch.equal(ids, before)
    assert torch.equal(m1, m2) and torch.equal(l1, l2)
    assert not torch.equal(l1, l3)


def test_whole_word_masking_keeps_words_intact(tokenizer, wiki_lines):
    collator = DataCollatorForMLM(tokenizer, whole_word=True, seed=0)
    examples = [tokenizer.encode(t, max_length=128) for t in wiki_lines[:64]]
    cont = torch.tensor([tok.startswith("##") for tok in
                         tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))])
    chosen_total = eligible_total = 0
    for epoch in range(15):
        collator.set_epoch(epoch)
        batch = collator(examples)
        labels, att = batch["labels"], batch["attention_mask"].bool()
        chosen = labels != IGNORE_INDEX
        # Original ids: labels where chosen, else the (unchanged) input ids.
        orig = torch.where(chosen, labels, batch["input_ids"])
        is_cont = cont[orig] & att
        assert is_cont.any()
        # Every '##' token is chosen exactly when the token before it is: all-or-none words.
        prev = torch.zeros_like(chosen)
        prev[:, 1:] = chosen[:, :-1]
        assert torch.equal(chosen[is_cont], prev[is_cont])
        special = torch.isin(orig, torch.tensor(sorted(tokenizer.special_token_ids))) | ~att
        assert not chosen[special].any()
        chosen_total += int(chosen.sum())
        eligible_total += int((~special).sum())
    # Words are chosen with p = 0.15, so tokens are too, in expectation (~100k tokens seen).
    assert abs(chosen_total / eligible_total - 0.15) < 0.01


def test_whole_word_from_word_ids(tokenizer, wiki_lines):
    enc = tokenizer(wiki_lines[:32], max_length=96, return_word_ids=True)
    word_ids = torch.tensor([[-1 if w is None else w for w in row] for row in enc["word_ids"]])
    ids = enc["input_ids"]
    special = torch.isin(ids, torch.tensor(sorted(tokenizer.special_token_ids)))
    cont = continuation_from_word_ids(word_ids)
    assert cont.any() and not cont[special].any()
    for seed in range(10):
        _, labels = mask_tokens(ids, special, tokenizer.vocab_size, tokenizer.mask_token_id,
                                generator=torch.Generator().manual_seed(seed),
                                word_ids=word_ids, whole_word=True)
        chosen = labels != IGNORE_INDEX
        for row in range(ids.shape[0]):
            for w in word_ids[row].unique().tolist():
                if w >= 0:  # all tokens of word w chosen together, or none of them
                    assert chosen[row][word_ids[row] == w].unique().numel() == 1


def test_collator_padding_keys_and_fresh_mask_each_epoch(tokenizer, wiki_lines):
    collator = DataCollatorForMLM(tokenizer, pad_to_multiple_of=8, seed=5)
    examples = [
        {"input_ids": tokenizer.encode(t, max_length=20 + 7 * k), "next_sentence_label": k % 2,
         "token_type_ids": [0] * 5 + [1] * (15 + 7 * k), "sequence_ids": [0] * (20 + 7 * k)}
        for k, t in enumerate(wiki_lines[:4])
    ]
    batch = collator(examples)
    longest = max(len(e["input_ids"]) for e in examples)
    B, T = batch["input_ids"].shape
    assert B == 4 and T % 8 == 0 and longest <= T < longest + 8
    for k, ex in enumerate(examples):
        n = len(ex["input_ids"])
        assert batch["attention_mask"][k].tolist() == [1] * n + [0] * (T - n)
        assert batch["token_type_ids"][k, :n].tolist() == ex["token_type_ids"]
        assert (batch["sequence_ids"][k, n:] == -1).all()
        assert (batch["input_ids"][k, n:] == tokenizer.pad_token_id).all()
        assert (batch["labels"][k, n:] == IGNORE_INDEX).all()
    assert batch["next_sentence_label"].tolist() == [0, 1, 0, 1]
    assert all(v.dtype == torch.long for v in batch.values())

    collator.set_epoch(0)
    e0 = collator(examples)["labels"]
    collator.set_epoch(0)
    e0_again = collator(examples)["labels"]
    collator.set_epoch(1)
    e1 = collator(examples)["labels"]
    assert torch.equal(e0, e0_again)
    assert not torch.equal(e0, e1)
    # Resuming at batch 1 gives the mask the second batch of the epoch would have had.
    collator.set_epoch(2)
    collator(examples)
    second = collator(examples)["labels"]
    collator.set_epoch(2, start_step=1)
    assert torch.equal(collator(examples)["labels"], second)


def test_segment_pairs_give_type_1_from_a_random_point(tokenizer, wiki_lines):
    examples = [tokenizer.encode(t, max_length=64) for t in wiki_lines[:256]]
    plain = DataCollatorForMLM(tokenizer, seed=3)(examples)
    collator = DataCollatorForMLM(tokenizer, seed=3, segment_pairs=True)
    batch = collator(examples)
    types, att = batch["token_type_ids"], batch["attention_mask"]
    assert not plain["token_type_ids"].any()
    # one switch from 0 to 1 per row at most, never on padding
    real = att[:, 1:] == 1
    assert (types[:, 1:] >= types[:, :-1])[real].all() and not types[att == 0].any()
    share = types.sum(1).float() / att.sum(1)
    assert 0.35 < share.mean() < 0.65 and (share == 0).any() and (share > 0.9).any()
    collator.set_epoch(0)
    assert torch.equal(collator(examples)["token_type_ids"], types)  # a function of (seed, epoch, step)
    # given token types are kept
    given = [{"input_ids": x, "token_type_ids": [0] * len(x)} for x in examples[:4]]
    assert not collator(given)["token_type_ids"].any()


def test_bad_inputs_raise_clear_errors():
    ids = _synthetic_batch(B=2, T=16)
    with pytest.raises(ValueError, match="whole_word"):
        mask_tokens(ids, SPECIAL, V, MASK, whole_word=True)
    with pytest.raises(ValueError, match=r"\(2, 15\)"):
        mask_tokens(ids, torch.zeros(2, 15, dtype=torch.bool), V, MASK)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        mask_tokens(ids[0], SPECIAL, V, MASK)
    with pytest.raises(ValueError, match="mask_probability"):
        mask_tokens(ids, SPECIAL, V, MASK, mask_probability=1.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gives_the_cpu_mask():
    ids = _synthetic_batch(B=32, T=128)
    cont = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.3
    for whole_word in (False, True):
        cpu = mask_tokens(ids, SPECIAL, V, MASK, generator=torch.Generator().manual_seed(0),
                          whole_word=whole_word, is_continuation=cont)
        gpu = mask_tokens(ids.cuda(), SPECIAL, V, MASK, generator=torch.Generator().manual_seed(0),
                          whole_word=whole_word, is_continuation=cont.cuda())
        assert gpu[0].is_cuda and gpu[1].is_cuda
        assert torch.equal(gpu[0].cpu(), cpu[0]) and torch.equal(gpu[1].cpu(), cpu[1])


def test_a_cap_per_row_keeps_the_lowest_draws_and_leaves_other_rows_alone(tokenizer, wiki_lines):
    """max_per_row (the JAX engine's fixed per-row prediction slots): no row over the cap; rows under
    it masked exactly as without it, and so is everything else drawn (same random stream); whole
    words stay whole; a cap above every row changes nothing."""
    ids = _synthetic_batch(B=64, T=128)
    g = lambda: torch.Generator().manual_seed(11)  # noqa: E731
    masked, labels = mask_tokens(ids, SPECIAL, V, MASK, 0.3, generator=g())
    counts = (labels != IGNORE_INDEX).sum(1)
    cap = int(counts.float().median())
    capped, capped_labels = mask_tokens(ids, SPECIAL, V, MASK, 0.3, generator=g(), max_per_row=cap)
    kept = (capped_labels != IGNORE_INDEX).sum(1)
    assert (kept <= cap).all() and (kept == cap)[counts >= cap].all()  # over the cap: cut to it exactly
    under = counts <= cap
    assert under.any() and (~under).any()
    assert torch.equal(capped_labels[under], labels[under]) and torch.equal(capped[under], masked[under])
    chosen = capped_labels != IGNORE_INDEX
    assert ((labels != IGNORE_INDEX) | ~chosen).all()  # a subset of the uncapped choice
    assert torch.equal(capped[chosen], masked[chosen])  # the same 80/10/10 action at what is kept
    assert torch.equal(capped[~chosen], ids[~chosen])
    same = mask_tokens(ids, SPECIAL, V, MASK, 0.3, generator=g(), max_per_row=128)
    assert torch.equal(same[0], masked) and torch.equal(same[1], labels)

    collator = DataCollatorForMLM(tokenizer, 0.4, whole_word=True, seed=0, max_predictions=12)
    examples = [tokenizer.encode(t, max_length=96) for t in wiki_lines[:48]]
    batch = collator(examples)
    chosen = batch["labels"] != IGNORE_INDEX
    assert chosen.sum(1).max() <= 12 and chosen.sum(1).max() >= 10
    cont = torch.tensor([t.startswith("##") for t in tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))])
    orig = torch.where(chosen, batch["labels"], batch["input_ids"])
    is_cont = cont[orig] & batch["attention_mask"].bool()
    prev = torch.zeros_like(chosen)
    prev[:, 1:] = chosen[:, :-1]
    assert torch.equal(chosen[is_cont], prev[is_cont])  # whole words, cap or not


def test_row_prediction_slots_line_up_with_the_labels():
    labels = torch.full((3, 10), IGNORE_INDEX)
    labels[0, [1, 4, 9]] = torch.tensor([7, 8, 9])
    labels[2, 0] = 5
    out = row_prediction_slots({"labels": labels}, slots=4)
    positions, targets = out["masked_positions"], out["masked_labels"]
    assert positions.shape == targets.shape == (3, 4)
    assert positions[0, :3].tolist() == [1, 4, 9] and targets[0].tolist() == [7, 8, 9, IGNORE_INDEX]
    assert (targets[1] == IGNORE_INDEX).all() and targets[2].tolist() == [5] + [IGNORE_INDEX] * 3
    real = targets != IGNORE_INDEX
    assert torch.equal(labels.gather(1, positions)[real], targets[real]) and (positions[~real] == 0).all()
    assert row_prediction_slots({"labels": labels}, slots=12)["masked_labels"].shape == (3, 12)  # more than T
    with pytest.raises(ValueError, match="3 masked tokens, more than its 2 prediction slots"):
        row_prediction_slots({"labels": labels}, slots=2)
