"""Parity of bert_kit.tokenizer with transformers.BertTokenizerFast on real data.

Both tokenizers are loaded twice: from the MiniLM folder (tokenizer.json) and from its vocab.txt
alone (the pipeline built by hand). Over 5,000 SST-2 sentences, CoNLL sentences and SQuAD
question/context pairs plus hand-picked Unicode edge cases, input_ids, token_type_ids,
attention_mask, offsets and word ids must be identical; so must the SQuAD overflow windows.
Run: .venv/bin/python -m pytest tests/test_tokenizer_parity.py -q
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bert_kit.tokenizer import get_tokenizer

transformers = pytest.importorskip("transformers")

HAND_PICKED = [
    "Café naïve résumé Ångström Øresund façade",
    "北京大学 東京タワー 서울 한국어 日本語のテキスト",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷 ❤️",
    "control\x00chars\x07bell\x1b[0m escape \x7f del",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom \u2060wj",
    "tabs\tnew\nlines\r\nand   many     spaces",
    "",
    "   ",
    "x" * 150,
    "Ǆ ß ẞ İstanbul ΣΊΣΥΦΟΣ ﬁ ligature",
    "हिन्दी العربية עברית ไทย",
    "combining e\u0301 a\u0308 o\u0303 n\u0303",
    "fullwidth ＡＢＣ１２３ and nbsp\u00a0here",
    "don't won't U.S.A. e-mail@example.com $3.50 50% #hash @user",
    "math ∑∫√∞ ≤ ≥ ≠ and arrows → ⇒",
    "[CLS] [SEP] [MASK] [UNK] [PAD] [mask] [Mask]",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "\u3000ideographic space\u3000and\u2028line sep\u2029para",
]


def _sst2(data_dir: Path, n: int) -> list[str]:
    rows = []
    for name in ("dev.tsv", "train.tsv"):
        with open(data_dir / "sst2" / name, encoding="utf-8") as f:
            next(f)  # header
            rows += [line.rsplit("\t", 1)[0] for line in f]
    return rows[:n]


def _conll(data_dir: Path, n: int) -> list[list[str]]:
    sentences, words = [], []
    with open(data_dir / "conll2003" / "train.txt", encoding="utf-8") as f:
        for line in f:
            if not line.strip() or line.startswith("-DOCSTART-"):
                if words:
                    sentences.append(words)
                words = []
                if len(sentences) == n:
                    break
            else:
                words.append(line.split(" ")[0])
    return sentences


def _squad(data_dir: Path) -> list[tuple[str, str]]:
    data = json.loads((data_dir / "squad-v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))
    return [(qa["question"], p["context"]) for a in data["data"] for p in a["paragraphs"] for qa in p["qas"][:1]]


@pytest.fixture(scope="module")
def corpus(data_dir) -> dict:
    return {"sst2": _sst2(data_dir, 2300), "conll": _conll(data_dir, 1500), "squad": _squad(data_dir)[:1200]}


@pytest.fixture(scope="module", params=["tokenizer.json", "vocab.txt only"])
def pair_of_tokenizers(request, minilm_path, tmp_path_factory):
    """(ours, HF) loaded the same way: the full folder, or a folder with only vocab.txt."""
    if request.param == "tokenizer.json":
        folder = Path(minilm_path)
    else:
        folder = tmp_path_factory.mktemp("vocab_only")
        shutil.copy(Path(minilm_path) / "vocab.txt", folder / "vocab.txt")
    ours = get_tokenizer(folder)
    assert ours.source.endswith(request.param.split()[0])
    return ours, transformers.BertTokenizerFast.from_pretrained(folder)


def _hf_offsets(batch) -> list[list[tuple[int, int]]]:
    return [[tuple(o) for o in row] for row in batch["offset_mapping"]]


def _assert_same(ours: dict, hf, keys=("input_ids", "token_type_ids", "attention_mask")) -> None:
    for key in keys:
        if isinstance(ours[key], np.ndarray):
            np.testing.assert_array_equal(ours[key], np.asarray(hf[key]), err_msg=key)
        else:
            assert ours[key] == hf[key], key


def test_parity_single_sentences(pair_of_tokenizers, corpus):
    ours, hf = pair_of_tokenizers
    texts = corpus["sst2"] + [" ".join(words) for words in corpus["conll"]] + HAND_PICKED
    assert len(texts) + len(corpus["squad"]) >= 5000
    mine = ours(texts, max_length=40, padding=False, return_tensors=None, return_offsets_mapping=True)
    ref = hf(texts, max_length=40, truncation=True, padding=False, return_offsets_mapping=True)
    _assert_same(mine, ref)
    assert mine["offset_mapping"] == _hf_offsets(ref)
    assert sum(len(r) == 40 for r in mine["input_ids"]) > 50  # some rows really were truncated
    # padded numpy batch (pad to longest) and no truncation at all
    _assert_same(ours(texts, return_tensors="np", max_length=40), hf(texts, max_length=40, truncation=True,
                                                                      padding=True, return_tensors="np"))
    assert ours(texts, truncation=False, return_tensors=None, padding=False)["input_ids"] == hf(texts)["input_ids"]


def test_parity_squad_pairs(pair_of_tokenizers, corpus):
    ours, hf = pair_of_tokenizers
    questions, contexts = zip(*corpus["squad"])
    questions, contexts = list(questions), list(contexts)
    # longest-first truncation to 128 cuts most contexts
    mine = ours(questions, contexts, max_length=128, return_tensors="np", return_offsets_mapping=True)
    ref = hf(questions, contexts, max_length=128, truncation=True, padding=True, return_tensors="np",
             return_offsets_mapping=True)
    _assert_same(mine, ref, keys=("input_ids", "token_type_ids", "attention_mask", "offset_mapping"))
    assert (mine["attention_mask"].sum(1) == 128).mean() > 0.5
    # untruncated pairs, ragged
    questions, contexts = questions[:600], contexts[:600]
    mine = ours(questions, contexts, truncation=False, padding=False, return_tensors=None, return_word_ids=True)
    ref = hf(questions, contexts, padding=False)
    _assert_same(mine, ref)
    assert mine["word_ids"] == [ref.word_ids(i) for i in range(len(questions))]


def test_parity_hand_picked_pairs_tokens_and_decode(pair_of_tokenizers, corpus):
    ours, hf = pair_of_tokenizers
    firsts, seconds = HAND_PICKED, HAND_PICKED[1:] + HAND_PICKED[:1]
    mine = ours(firsts, seconds, max_length=40, return_tensors=None, padding=False, return_offsets_mapping=True)
    ref = hf(firsts, seconds, max_length=40, truncation=True, return_offsets_mapping=True)
    _assert_same(mine, ref)
    assert mine["offset_mapping"] == _hf_offsets(ref)
    for text in HAND_PICKED + corpus["sst2"][:300]:
        assert ours.tokenize(text) == hf.tokenize(text), text
        ids = ours.encode(text)
        assert ids == hf(text, truncation=True, max_length=512)["input_ids"]
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
        assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids), text


@pytest.mark.parametrize("max_length,stride", [(384, 128), (96, 32)])
def test_parity_squad_overflow_windows(pair_of_tokenizers, corpus, max_length, stride):
    """SQuAD feature building: question whole, context in overlapping windows (HF only_second)."""
    ours, hf = pair_of_tokenizers
    longest = sorted(corpus["squad"], key=lambda qc: len(qc[1]), reverse=True)[:6] + corpus["squad"][:4]
    questions, contexts = [q for q, _ in longest], [c for _, c in longest]
    mine = ours(questions, contexts, max_length=max_length, stride=stride, padding="max_length",
                return_overflowing_tokens=True, return_offsets_mapping=True, return_tensors="pt")
    ref = hf(questions, contexts, truncation="only_second", max_length=max_length, stride=stride,
             return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length",
             return_tensors="pt")
    assert mine["input_ids"].shape[0] > len(questions)  # windows really overflowed
    for key in ("input_ids", "token_type_ids", "attention_mask", "offset_mapping"):
        assert mine[key].tolist() == ref[key].tolist(), key
    assert mine["overflow_to_sample_mapping"] == ref["overflow_to_sample_mapping"].tolist()
    assert mine["sequence_ids"] == [ref.sequence_ids(i) for i in range(len(mine["sequence_ids"]))]


def test_parity_split_words_and_word_ids(pair_of_tokenizers, corpus):
    """NER: pre-split CoNLL words, word ids used to align labels to the first sub-token."""
    ours, hf = pair_of_tokenizers
    sentences = corpus["conll"][:1000]
    mine = ours(sentences, is_split_into_words=True, max_length=48, return_word_ids=True,
                return_offsets_mapping=True, return_tensors="np")
    ref = hf(sentences, is_split_into_words=True, max_length=48, truncation=True, padding=True,
             return_offsets_mapping=True, return_tensors="np")
    _assert_same(mine, ref, keys=("input_ids", "token_type_ids", "attention_mask", "offset_mapping"))
    assert mine["word_ids"] == [ref.word_ids(i) for i in range(len(sentences))]
    assert any(None in w[1:] and w.index(None, 1) == 47 for w in mine["word_ids"])  # truncated rows exist
    # word ids of the same sentences given as plain strings
    joined = [" ".join(words) for words in sentences[:300]]
    mine = ours(joined, return_word_ids=True, return_tensors=None, padding=False)
    ref = hf(joined, truncation=True)
    assert mine["word_ids"] == [ref.word_ids(i) for i in range(len(joined))]
