"""Tests for bert_kit.tokenizer and bert_kit.tokenizer_training: API behaviour, properties,
training, save/load and errors.

Parity with transformers.BertTokenizerFast on real data lives in test_tokenizer_parity.py.
Run: .venv/bin/python -m pytest tests/test_tokenizer.py -q
"""

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bert_kit.tokenizer import WordPieceTokenizer, get_tokenizer
from bert_kit.tokenizer_training import train_tokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def tok(minilm_path) -> WordPieceTokenizer:
    return get_tokenizer(minilm_path)


@pytest.fixture(scope="module")
def vocab(tok) -> dict[str, int]:
    return tok.get_vocab()


def reference_wordpiece(word: str, vocab: dict, max_chars: int = 100) -> list[str]:
    """BERT's greedy longest-match-first WordPiece (google-research/bert tokenization.py)."""
    if len(word) > max_chars:
        return ["[UNK]"]
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
        else:  # no piece matches at `start`: the whole word is unknown
            return ["[UNK]"]
        pieces.append(piece)
        start = end
    return pieces


# ------------------------------------------------------------------------------ basic API
def test_special_ids_and_vocab(tok):
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (
        0, 100, 101, 102, 103,
    )
    assert tok.special_token_ids == frozenset({0, 100, 101, 102, 103})
    assert tok.vocab_size == len(tok) == len(tok.get_vocab()) == 30522
    assert tok.get_vocab()["the"] == 1996
    assert tok.model_max_length == 512 and tok.do_lower_case


def test_encode_tokenize_convert_decode(tok):
    ids = tok.encode("Hello, Wörld! Tokenization")
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    tokens = tok.tokenize("Hello, Wörld! Tokenization")
    assert tokens == ["hello", ",", "world", "!", "token", "##ization"]
    assert tok.convert_ids_to_tokens(ids[1:-1]) == tokens
    assert tok.convert_tokens_to_ids(tokens) == ids[1:-1]
    assert tok.convert_tokens_to_ids("notawordpiece###") == tok.unk_token_id
    assert tok.convert_ids_to_tokens(torch.tensor(101)) == "[CLS]"
    assert tok.decode(ids) == "hello, world! tokenization"
    assert tok.decode(torch.tensor(ids), skip_special_tokens=False) == "[CLS] hello, world! tokenization [SEP]"
    assert tok.batch_decode(np.array([ids, ids])) == ["hello, world! tokenization"] * 2
    # raw "[MASK]" in text is the special token, lowercase "[mask]" is not
    assert tok.encode("a [MASK] b")[2] == tok.mask_token_id
    assert tok.mask_token_id not in tok.encode("a [mask] b")


def test_encode_pair_and_truncation(tok):
    ids = tok.encode("one two three four", "five six seven", max_length=8)
    assert len(ids) == 8
    assert ids.count(tok.sep_token_id) == 2
    # longest-first: tokens come off the longer text first (4+3 -> 3+2 content tokens)
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens == ["[CLS]", "one", "two", "three", "[SEP]", "five", "six", "[SEP]"]
    assert len(tok.encode("word " * 1000)) == 512  # model_max_length caps None
    assert len(tok.encode("word " * 1000, truncation=False)) == 1002


def test_call_shapes_types_and_padding(tok):
    texts = ["a short one", "a somewhat longer sentence than the first one"]
    out = tok(texts)
    assert set(out) == {"input_ids", "token_type_ids", "attention_mask"}
    assert out["input_ids"].dtype == torch.long and out["input_ids"].shape == (2, 10)
    torch.testing.assert_close(out["attention_mask"].sum(1), torch.tensor([5, 10]))
    assert out["input_ids"][0, 5:].tolist() == [tok.pad_token_id] * 5
    np_out = tok(texts, return_tensors="np", padding="max_length", max_length=16, return_offsets_mapping=True)
    assert np_out["input_ids"].dtype == np.int64 and np_out["input_ids"].shape == (2, 16)
    assert np_out["offset_mapping"].shape == (2, 16, 2)
    lists = tok(texts, padding=False, return_tensors=None)
    assert [len(r) for r in lists["input_ids"]] == [5, 10]
    single = tok("just one", return_word_ids=True)
    assert single["input_ids"].shape == (1, 4) and single["word_ids"] == [[None, 0, 1, None]]
    pair = tok("question here", "the context", return_tensors=None)
    assert pair["token_type_ids"] == [[0, 0, 0, 0, 1, 1, 1]]
    ids_only = tok(texts, padding=False, return_tensors=None, return_token_type_ids=False,
                   return_attention_mask=False)
    assert ids_only == {"input_ids": lists["input_ids"]}
    assert set(tok(texts, return_attention_mask=False)) == {"input_ids", "token_type_ids"}


def test_overflow_windows_cover_the_context(tok):
    context = " ".join(f"w{i}" for i in range(60))  # "w12" -> "w", "##12": 2 tokens per word
    out = tok("which word?", context, max_length=40, stride=10, return_overflowing_tokens=True,
              return_offsets_mapping=True, padding="max_length", return_tensors="pt")
    n = out["input_ids"].shape[0]
    assert out["input_ids"].shape == (n, 40) and n > 3
    assert out["overflow_to_sample_mapping"] == [0] * n
    covered = set()
    for w in range(n):
        seq = out["sequence_ids"][w]
        ctx = [i for i, s in enumerate(seq) if s == 1]
        assert seq[:5] == [None, 0, 0, 0, None]  # question kept whole in every window
        spans = [tuple(out["offset_mapping"][w, i].tolist()) for i in ctx]
        covered.update(spans)
        if w > 0:  # consecutive windows overlap by exactly `stride` tokens
            assert spans[:10] == prev[-10:]
        prev = spans
    n_ctx_tokens = len(tok.tokenize(context))
    assert len(covered) == n_ctx_tokens


def test_split_into_words_and_word_ids(tok):
    words = [["EU", "rejects", "German", "call"], ["Peter", "Tokenization"]]
    out = tok(words, is_split_into_words=True, return_word_ids=True, return_tensors=None)
    assert out["word_ids"][0] == [None, 0, 1, 2, 3, None]
    assert out["word_ids"][1][:5] == [None, 0, 1, 1, None]  # token ##ization
    assert out["word_ids"][1][5:] == [None]  # padding
    one = tok(["EU", "rejects"], is_split_into_words=True, return_tensors="pt")
    assert one["input_ids"].shape == (1, 4)


def test_pickle_round_trip(tok):
    clone = pickle.loads(pickle.dumps(tok))
    text = "Pickled tokenizers go to DataLoader workers."
    assert clone.encode(text) == tok.encode(text)
    assert clone.mask_token_id == tok.mask_token_id and clone.backend is not tok.backend


def test_backend_left_without_truncation_or_padding(tok):
    tok(["x " * 50], max_length=8, padding="max_length")
    assert tok.backend.truncation is None and tok.backend.padding is None


MIXED = ["A man is eating food.", "", "   ", "naïve café — “quotes” 你好世界 🙂", "Straße İ ΣΑΣ e\u0301",
         "a [MASK] b [SEP]", "x" * 5000, "word " * 3000, "é" * 9000 + " end", "a\x00b\u200bc", "\t\n", "end."]


@pytest.mark.parametrize("max_length", [None, 8, 64])
def test_ids_alone_equal_the_ids_of_the_full_call(tok, max_length):
    """Asked for ids only (what embedding and the truncation report ask for), the tokenizer takes
    its cheap path (no offsets tracked; short batches skip the long-text cutter): the same ids as
    the call that returns offsets, for single texts and pairs, short, long, empty, unicode, and
    long texts without a space."""
    ids_only = {"padding": False, "return_tensors": None, "return_token_type_ids": False,
                "return_attention_mask": False, "max_length": max_length}
    full = {"padding": False, "return_tensors": None, "return_offsets_mapping": True, "max_length": max_length}
    short = [t for t in MIXED if len(t) < 100]
    for texts, pairs in ((MIXED, None), (short, None), (MIXED, MIXED[::-1]), (short, short[::-1])):
        got = tok(texts, pairs, **ids_only)
        assert list(got) == ["input_ids"]
        assert got["input_ids"] == tok(texts, pairs, **full)["input_ids"]
        if pairs is None:  # (`encode` reads an empty second text as no pair, as BertTokenizerFast.encode)
            assert got["input_ids"] == [tok.encode(t, max_length=max_length or tok.model_max_length) for t in texts]


def test_a_batch_of_short_texts_is_not_cut(tok, minilm_path):
    """The long-text cutter hands a batch of texts shorter than its bound back as it is, without
    reading a character (its character table is not even built)."""
    fresh = get_tokenizer(minilm_path)
    batch = ["a short text", "", "another one"]
    cutter = fresh._cutter
    assert cutter.cut(batch, None, 30, "longest_first", False) == (batch, None, None)
    assert cutter.cut(batch, batch, 30, "longest_first", False)[:2] == (batch, batch)
    assert cutter.cut([["a", "b"]], None, 30, "longest_first", True) == ([["a", "b"]], None, None)
    assert cutter._chars is False  # never looked up
    fresh(batch, max_length=32)
    assert cutter._chars is False


def test_module_imports_without_torch(minilm_path):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from bert_kit.tokenizer import get_tokenizer\n"
        f"t = get_tokenizer({str(minilm_path)!r})\n"
        "out = t(['hello world'], return_tensors='np')\n"
        "assert out['input_ids'].tolist() == [[101, 7592, 2088, 102]], out\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


# ------------------------------------------------------------------------------ properties
TEXT = st.one_of(
    st.text(max_size=80),  # any Unicode (surrogates excluded: they are not valid Unicode text)
    st.text(alphabet="abcXYZ éÉüñß北京😀\t\n .,!?'-\u200b\x00\u0301\ufeff" , max_size=80),
    st.lists(st.sampled_from(["the", "Tokenization", "naïve", "café", "北", "!!", "x" * 120, "##ab"]),
             max_size=12).map(" ".join),
)


@settings(max_examples=150, deadline=None)
@given(s=TEXT)
def test_property_tokens_follow_reference_wordpiece(tok, vocab, s):
    """Tokens = reference WordPiece over the backend's normalised, pre-split words; decode
    gives back those words, modulo whitespace, minus the words that became [UNK]."""
    t = tok
    assume(not any(sp in s for sp in SPECIALS))
    norm = t.backend.normalizer.normalize_str(s)
    words = [w for w, _ in t.backend.pre_tokenizer.pre_tokenize_str(norm)]
    pieces = [reference_wordpiece(w, vocab) for w in words]
    assert t.tokenize(s) == [p for ps in pieces for p in ps]

    ids = t.encode(s, truncation=False)
    assert ids[0] == t.cls_token_id and ids[-1] == t.sep_token_id
    assert all(0 <= i < t.vocab_size for i in ids)
    kept = "".join(w for w, ps in zip(words, pieces) if ps != ["[UNK]"])
    assert "".join(t.decode(ids).split()) == "".join(kept.split())
    # normalisation guarantees: no ASCII upper case, no control chars, no accents left
    assert not any("A" <= c <= "Z" or c in "\x00\t\n\u0301" for c in "".join(words))


@settings(max_examples=100, deadline=None)
@given(s=TEXT)
def test_property_offsets_point_at_the_token_text(tok, s):
    t = tok
    assume(not any(sp in s for sp in SPECIALS))
    out = t(s, return_offsets_mapping=True, return_tensors=None, truncation=False)
    tokens = t.convert_ids_to_tokens(out["input_ids"][0])
    for token, (a, b) in zip(tokens, out["offset_mapping"][0]):
        assert 0 <= a <= b <= len(s)
        if token not in SPECIALS:
            assert t.backend.normalizer.normalize_str(s[a:b]).strip() == token.removeprefix("##")


def test_normalisation_examples(tok):
    assert tok.decode(tok.encode("Héllo\tWORLD\x00!  \u200bÇa  va")) == "hello world! ca va"
    assert tok.tokenize("北京") == ["北", "京"]
    assert tok.tokenize("x" * 101) == ["[UNK]"]


# ------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def wiki_lines(data_dir) -> list[str]:
    with open(data_dir / "wikitext-2" / "train.txt", encoding="utf-8") as f:
        lines = [line.strip() for _, line in zip(range(4000), f)]
    return [line for line in lines if line]


@pytest.fixture(scope="module")
def trained(wiki_lines, tmp_path_factory) -> WordPieceTokenizer:
    path = tmp_path_factory.mktemp("wiki") / "slice.txt"
    path.write_text("\n".join(wiki_lines) + "\n", encoding="utf-8")
    return train_tokenizer([path], vocab_size=2000, min_frequency=2)


def test_train_tokenizer_gives_sane_vocab(trained, wiki_lines, data_dir):
    assert [trained.convert_tokens_to_ids(t) for t in SPECIALS] == [0, 1, 2, 3, 4]
    assert (trained.pad_token_id, trained.unk_token_id, trained.mask_token_id) == (0, 1, 4)
    assert 1500 <= trained.vocab_size <= 2000
    for word in ["the", "of", "and", "in", "was"]:
        assert trained.tokenize(word) == [word]
    held_out = (data_dir / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines()[:300]
    held_out = [line.strip() for line in held_out if line.strip()]
    tokens = [t for line in held_out for t in trained.tokenize(line)]
    words = sum(len(line.split()) for line in held_out)
    assert tokens.count("[UNK]") / len(tokens) < 0.01
    assert 1.0 < len(tokens) / words < 2.0  # a 2k vocab splits rare words, not every word
    assert trained.tokenize("The Unbelievable") == trained.tokenize("the unbelievable")
    assert trained.decode(trained.encode("the game was released in 2011 .")) == "the game was released in 2011."


def test_train_from_iterator_matches_files(trained, wiki_lines):
    from_iter = train_tokenizer(texts=iter(wiki_lines), vocab_size=2000, min_frequency=2)
    assert from_iter.get_vocab() == trained.get_vocab()


def test_trained_save_load_round_trip(trained, wiki_lines, tmp_path):
    from transformers import BertTokenizerFast

    trained.save(tmp_path / "tok")
    written = {p.name for p in (tmp_path / "tok").iterdir()}
    assert written == {"tokenizer.json", "vocab.txt", "tokenizer_config.json"}
    loaded = get_tokenizer(tmp_path / "tok")
    vocab_only = tmp_path / "vocab_only"
    vocab_only.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(tmp_path / "tok" / name, vocab_only / name)
    from_vocab = get_tokenizer(vocab_only)
    hf = BertTokenizerFast.from_pretrained(tmp_path / "tok")
    sample = wiki_lines[:200] + ["Café [MASK] naïve 北京"]
    expected = trained(sample, return_tensors=None)["input_ids"]
    assert loaded(sample, return_tensors=None)["input_ids"] == expected
    assert from_vocab(sample, return_tensors=None)["input_ids"] == expected
    assert hf(sample, padding=True, truncation=True, max_length=512)["input_ids"] == expected
    assert pickle.loads(pickle.dumps(trained))(sample, return_tensors=None)["input_ids"] == expected


def test_cased_vocab_folder_respects_do_lower_case(minilm_path, tmp_path):
    from transformers import BertTokenizerFast

    shutil.copy(Path(minilm_path) / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = get_tokenizer(tmp_path)
    assert not cased.do_lower_case
    hf = BertTokenizerFast.from_pretrained(tmp_path)
    text = "Paris and BERLIN are Cities"
    assert cased.encode(text) == hf(text)["input_ids"]
    assert cased.tokenize("Paris") != get_tokenizer(minilm_path).tokenize("Paris")


# ------------------------------------------------------------------------------ bad input
def test_error_missing_folder_and_vocab(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tokenizer folder not found: .*nope"):
        get_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"no tokenizer.json or vocab.txt in .*empty"):
        (tmp_path / "empty").mkdir()
        get_tokenizer(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=r"vocab file not found: .*missing.txt"):
        WordPieceTokenizer.from_vocab_file(tmp_path / "missing.txt")


def test_error_vocab_without_mask(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n##s\n")
    with pytest.raises(ValueError, match=r"vocab file .*vocab.txt has no '\[MASK\]' token"):
        get_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nhello\n")
    with pytest.raises(ValueError, match=r"vocab.txt:7: token 'hello' already appears on line 6"):
        get_tokenizer(tmp_path)


def test_hub_name_resolution_offline(minilm_path, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError, match=r"'bert-base-uncased' is not available offline.*Pass a folder"):
        get_tokenizer("bert-base-uncased")
    snap = tmp_path / "hub" / "models--org--tiny-bert" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(Path(minilm_path) / "vocab.txt", snap / "vocab.txt")
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("abc123")
    assert get_tokenizer("org/tiny-bert").encode("hello world") == [101, 7592, 2088, 102]


def test_error_bad_arguments(tok):
    with pytest.raises(ValueError, match="padding must be"):
        tok(["a"], padding="longest_first")
    with pytest.raises(ValueError, match="return_tensors must be"):
        tok(["a"], return_tensors="tf")
    with pytest.raises(ValueError, match=r"rows have lengths \[3, 4\]"):
        tok(["a", "a b"], padding=False)
    with pytest.raises(ValueError, match="texts has 2 items but text_pairs has 1"):
        tok(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="both be single examples or both be lists"):
        tok("a", ["c"])
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        tok(["a", 3])
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        tok(["a"], max_length=0)
    with pytest.raises(ValueError, match="texts is empty"):
        tok([])
    with pytest.raises(ValueError, match=r"token id 99999 is outside the vocabulary \(size 30522\)"):
        tok.convert_ids_to_tokens([99999])
    with pytest.raises(ValueError, match=r"ids \[-100\] are outside the vocabulary"):
        tok.decode([101, -100, 102])
    with pytest.raises(ValueError, match="decode takes one sequence"):
        tok.decode([[101, 102]])
    with pytest.raises(ValueError, match="stride 40 must be smaller than max_length minus 3"):
        tok("q", "c " * 100, max_length=42, stride=40, return_overflowing_tokens=True)
    with pytest.raises(ValueError, match="tokenization failed .*truncation='only_second'"):
        tok("a long question " * 10, "c " * 100, max_length=16, return_overflowing_tokens=True)
    with pytest.raises(ValueError, match="pass exactly one of files"):
        train_tokenizer()
    with pytest.raises(FileNotFoundError, match="training file not found: .*nope.txt"):
        train_tokenizer(["nope.txt"])
    with pytest.raises(ValueError, match=r"lacks \['\[MASK\]'\]"):
        train_tokenizer(texts=["a"], special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])


# ------------------------------------------------------------------------------ truncation, pairs, determinism
@settings(max_examples=60, deadline=None)
@given(a=TEXT, b=st.one_of(st.none(), TEXT), max_length=st.integers(1, 12), words=st.booleans())
def test_property_truncation_always_honours_max_length(tok, a, b, max_length, words):
    """Every output fits max_length, or the call says it cannot hold the special tokens."""
    texts = a.split() if words else a
    pair = (b.split() if words else b) if b is not None else None
    assume(not words or (texts and (pair is None or pair)))
    pair = None if pair is not None and len(pair) == 0 else pair  # an empty second text is no pair
    n_special = 2 if pair is None else 3
    if max_length < n_special:
        with pytest.raises(ValueError, match=f"max_length={max_length} cannot hold the {n_special} special tokens"):
            tok(texts, pair, max_length=max_length, is_split_into_words=words, return_tensors=None)
        return
    out = tok(texts, pair, max_length=max_length, is_split_into_words=words, return_tensors=None, padding=False)
    assert len(out["input_ids"][0]) <= max_length
    if not words:
        assert len(tok.encode(a, b or None, max_length=max_length)) <= max_length


def test_max_length_below_the_special_tokens_is_an_error(tok):
    for max_length, pair in ((1, None), (2, "b c")):
        with pytest.raises(ValueError, match=rf"max_length={max_length} cannot hold the"):
            tok("a b c d", pair, max_length=max_length)
        with pytest.raises(ValueError, match=rf"max_length={max_length} cannot hold the"):
            tok.encode("a b c d", pair, max_length=max_length)
    assert tok.encode("a b c", max_length=2) == [101, 102]  # room for the specials only: honoured
    assert tok.encode("a b c", "d", max_length=3) == [101, 102, 102]
    assert len(tok.encode("a b c", max_length=1, truncation=False)) == 5  # no truncation asked: no limit


def test_empty_second_text_matches_bert_tokenizer_fast(tok, minilm_path):
    from transformers import BertTokenizerFast

    hf = BertTokenizerFast.from_pretrained(minilm_path)
    for a, b in [("hello world", ""), ("hello world", " "), ("a", "b")]:
        assert tok(a, b, return_tensors=None)["input_ids"][0] == hf(a, b)["input_ids"], (a, b)
        assert tok(a, b, return_tensors=None)["token_type_ids"][0] == hf(a, b)["token_type_ids"]
        assert tok.encode(a, b) == hf.encode(a, b)
    # in a batch HF keeps the empty second text as a pair: [CLS] a [SEP] [SEP]
    batch_a, batch_b = ["hello world", "a"], ["", "b"]
    assert tok(batch_a, batch_b, return_tensors=None, padding=False)["input_ids"] == hf(batch_a, batch_b)["input_ids"]


TIE_CORPUS = """
import random, sys, json
sys.path.insert(0, {repo!r})
from bert_kit.tokenizer_training import train_tokenizer
rng = random.Random(0)
words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(4)) for _ in range(400)]
texts = [" ".join(words[i:i + 20]) for i in range(0, 400, 20)] * 2   # every word twice: many tied merges
print(json.dumps(train_tokenizer(texts=texts, vocab_size=150, min_frequency=2).get_vocab(), sort_keys=True))
"""


def test_train_tokenizer_is_the_same_in_every_process():
    """The `tokenizers` trainer numbers pieces in hash-map order, which changes from process to
    process; on a corpus full of tied merges it gave a different vocabulary in each of 4 runs."""
    code = TIE_CORPUS.format(repo=str(Path(__file__).parents[1]))
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(3)]
    vocabs = [json.loads(r) for r in runs]
    assert len(vocabs[0]) == 150 and vocabs[0] == vocabs[1] == vocabs[2]


def test_train_tokenizer_limit_alphabet_keeps_the_most_frequent_characters():
    texts = ["aaaa bbb cc d é"] * 5 + ["ü"]
    tok = train_tokenizer(texts=texts, vocab_size=40, min_frequency=1, limit_alphabet=3)
    singles = {t for t in tok.get_vocab() if len(t) == 1}
    assert singles == {"a", "b", "c"}  # d, e (é without its accent) and u are rarer
    assert tok.tokenize("ü d") == ["[UNK]", "[UNK]"]


def test_train_tokenizer_does_not_learn_special_tokens_in_texts():
    tok = train_tokenizer(texts=["the [UNK] sat on the [UNK] mat [MASK]"] * 20, vocab_size=60, min_frequency=1)
    assert not any(piece in tok.get_vocab() for piece in ("unk", "##unk", "mask", "##k", "[", "]"))
    assert tok.tokenize("the [UNK] mat") == ["the", "[UNK]", "mat"]


def test_train_tokenizer_on_a_binary_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"cannot train a tokenizer on .*weights\.bin.*UTF-8"):
        train_tokenizer([path], vocab_size=100)
    with pytest.raises(ValueError, match=r"vocab_size=5 is out of range: .*\[6, .*beyond the 5 special tokens"):
        train_tokenizer(texts=["a"], vocab_size=5)
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got bytes"):
        train_tokenizer(texts=["a", b"b"], vocab_size=50)


def test_train_tokenizer_refuses_a_vocabulary_it_cannot_allocate():
    """The Rust trainer aborted the process with a backtrace on vocab_size=10**12."""
    from bert_kit.checks import ConfigError

    for size in (10**12, 2**24 + 1, 2.5, -1):
        with pytest.raises(ConfigError, match=r"^vocab_size=.* expected an integer in \[6, 16777216\]"):
            train_tokenizer(texts=["a b c"], vocab_size=size)
    with pytest.raises(ConfigError, match="min_frequency=-1"):
        train_tokenizer(texts=["a b c"], vocab_size=50, min_frequency=-1)
    assert "a" in train_tokenizer(texts=["a b c"], vocab_size=6, min_frequency=1).get_vocab()  # the smallest size



def test_train_tokenizer_on_nothing_is_an_error(tmp_path):
    """No files, no texts, or nothing but blank lines and words past 100 characters: no
    vocabulary to learn."""
    with pytest.raises(ValueError, match="files is empty: name at least one text file"):
        train_tokenizer([])
    with pytest.raises(ValueError, match="files is empty"):
        train_tokenizer(iter([]))
    (tmp_path / "blank.txt").write_text("\n\n  \n" + "y" * 300 + "\n")
    with pytest.raises(ValueError, match=r"no word to learn a vocabulary from in .*blank\.txt"):
        train_tokenizer([tmp_path / "blank.txt"])
    with pytest.raises(ValueError, match="no word to learn a vocabulary from in the texts"):
        train_tokenizer(texts=[])
    with pytest.raises(ValueError, match="no word to learn a vocabulary from in the texts"):
        train_tokenizer(texts=["[MASK] [UNK]", ""])


def test_train_tokenizer_leaves_out_words_wordpiece_never_splits():
    """A word past WordPiece's 100 characters encodes as one [UNK]: the trainer does not see it.
    Its merges cost the square of its length (800,000 letters took 5 minutes; 8 MB never ended):
    now such a word costs what its characters cost, and teaches nothing."""
    import time

    texts = ["the cat sat on the mat"] * 20 + ["k" * 100]  # 100 letters: a word WordPiece splits
    plain = train_tokenizer(texts=texts, vocab_size=80, min_frequency=1)
    started = time.perf_counter()
    with_long = train_tokenizer(texts=texts + ["q" * 50_000, "z" * 101 + " mat"], vocab_size=80, min_frequency=1)
    assert time.perf_counter() - started < 30  # the quadratic trainer: hours
    assert with_long.get_vocab() == plain.get_vocab()
    assert "k" in plain.get_vocab()
    assert with_long.tokenize("q" * 50_000) == ["[UNK]"]



def test_train_tokenizer_breaks_lines_too_long_to_hold_between_words(tmp_path, monkeypatch):
    """The Rust trainer holds a whole line (an 8 MB line took 1 GB): a line past MAX_TRAIN_LINE
    characters, in a file or a text, is read broken at a space, and learns what its words do."""
    import bert_kit.tokenizer_training as training

    monkeypatch.setattr(training, "MAX_TRAIN_LINE", 1000)
    words = "the cat sat on the mat, a dog ran past it; "
    short = train_tokenizer(texts=[words] * 500, vocab_size=60, min_frequency=1)
    assert train_tokenizer(texts=[words * 500], vocab_size=60, min_frequency=1).get_vocab() == short.get_vocab()
    (tmp_path / "one_line.txt").write_text("\ufeff" + words * 500 + "\n" + "q" * 5000 + "\n")
    seen: list[int] = []
    real = training._broken

    def broken(chunks):
        for line in real(chunks):
            seen.append(len(line))
            yield line

    monkeypatch.setattr(training, "_broken", broken)
    from_file = train_tokenizer([tmp_path / "one_line.txt"], vocab_size=60, min_frequency=1)
    assert from_file.get_vocab() == short.get_vocab() and seen and max(seen) <= 1001

# ------------------------------------------------------------------------------ invalid Unicode, threads
def test_a_lone_surrogate_is_a_value_error_naming_the_text(tok):
    """"\\ud800" is no character (JSON and Python let it through); the Rust tokenizer raised a
    bare TypeError about TextEncodeInput."""
    with pytest.raises(ValueError, match=r"^texts\[3\] holds a lone surrogate '\\ud800' at character 2"):
        tok(["a", "b", "c", "ab\ud800"])
    with pytest.raises(ValueError, match=r"^text_pairs\[1\] holds a lone surrogate '\\udc80'"):
        tok(["a", "b"], ["c", "\udc80"])
    with pytest.raises(ValueError, match=r"^texts holds a lone surrogate"):
        tok("\ud800")
    with pytest.raises(ValueError, match=r"^texts\[0\]\[1\] holds a lone surrogate"):
        tok([["a", "\ud800"]], is_split_into_words=True)
    with pytest.raises(ValueError, match=r"^text holds a lone surrogate"):
        tok.encode("x\udfff")
    with pytest.raises(ValueError, match=r"^text holds a lone surrogate"):
        tok.tokenize("\ud800")
    assert tok.tokenize("\U0001F600 ok") == tok.tokenize("\ud83d\ude00 ok".encode("utf-16", "surrogatepass")
                                                           .decode("utf-16"))  # a real pair is one character


def test_threads_may_share_a_tokenizer(tok):
    """Truncation is backend state set for one call: two threads with different max_length
    must each get their own (before the lock, one thread's call could run without truncation)."""
    import threading

    text = "word " * 300
    errors: list[str] = []

    def work(max_length: int) -> None:
        for _ in range(150):
            try:
                got = tok([text, "short"], max_length=max_length, return_tensors=None, padding=False)
                if len(got["input_ids"][0]) != min(max_length, 302):  # 300 words, [CLS], [SEP]
                    errors.append(f"{len(got['input_ids'][0])} tokens for max_length={max_length}")
                if tok.tokenize("one two") != ["one", "two"]:
                    errors.append("tokenize")
            except ValueError as e:
                errors.append(str(e))

    threads = [threading.Thread(target=work, args=(n,)) for n in (8, 64, 512)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
