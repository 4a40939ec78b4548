"""Long texts are cut before tokenizing (bert_kit.long_texts): the tokens kept must be exactly those
of the whole text, for single texts, pairs (every truncation strategy) and word lists.

The property tests compare the tokenizer with a copy whose cutting is switched off, on texts
built from pieces chosen to be awkward at a cut: punctuation, CJK, accents and combining marks,
control characters, whitespace runs, added tokens ([MASK]), words past WordPiece's 100
characters. With the module's constants lowered (a cut every few characters, no "short text"
exemption) short generated texts are cut at every kind of place.

Run: .venv/bin/python -m pytest tests/test_long_texts.py -q
"""

from __future__ import annotations

import contextlib
import pickle
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_kit import long_texts
from bert_kit.tokenizer import get_tokenizer

PIECES = ["a", "the", "Straße", "naïve", "e\u0301", "İ", "ΣΑΣ", "中", "国人", "の", "한국", "😀", "12", "x" * 120,
          ".", ",", "!", "?", "-", "'", '"', "(", ")", "[", "]", "¿", "。", "、", "«", "$", "+",
          " ", "  ", "\t", "\n", "\r\n", "\u3000", "\xa0", "\u2028", "\x00", "\x1c", "\x85", "\u200b", "\ufffd",
          "[MASK]", "[SEP]", "[mask]", "\u0301", "\u0308"]
piece = st.sampled_from(PIECES) | st.sampled_from(PIECES) | st.text(min_size=1, max_size=4)
text = st.lists(piece, min_size=0, max_size=60).map("".join)
long = st.lists(piece, min_size=10, max_size=60).map("".join)  # long enough to be cut when cutting everywhere


@pytest.fixture(scope="module")
def tokenizers(minilm_path):
    """(the tokenizer, a copy that never cuts)."""
    tok = get_tokenizer(minilm_path)
    whole = pickle.loads(pickle.dumps(tok))
    whole._cutter._chars = None  # no text is squeezed or cut: every text is tokenized whole
    return tok, whole


@contextlib.contextmanager
def cutting_everywhere():
    """Cut even short texts, a chunk every character: every position of a short text is tried."""
    saved = long_texts.CHARS_PER_TOKEN, long_texts.SHORT, long_texts.CHUNK
    long_texts.CHARS_PER_TOKEN, long_texts.SHORT, long_texts.CHUNK = 1, 0, 3
    try:
        yield
    finally:
        long_texts.CHARS_PER_TOKEN, long_texts.SHORT, long_texts.CHUNK = saved


def same(tok, whole, *args, **kwargs) -> None:
    """The two tokenizers give the same output (or the same error)."""
    kwargs = {"return_tensors": None, "padding": False, "return_offsets_mapping": True, **kwargs}
    try:
        want = whole(*args, **kwargs)
    except ValueError as e:
        with pytest.raises(ValueError, match="tokenization failed"):
            tok(*args, **kwargs)
        assert "tokenization failed" in str(e)
        return
    assert tok(*args, **kwargs) == want


property_settings = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@property_settings
@given(texts=st.lists(long | text, min_size=1, max_size=3), max_length=st.integers(3, 16))
def test_property_a_cut_text_keeps_the_tokens_and_offsets_of_the_whole_text(tokenizers, texts, max_length):
    tok, whole = tokenizers
    with cutting_everywhere():
        same(tok, whole, texts, max_length=max_length, return_word_ids=True)
        assert tok.encode(texts[0], max_length=max_length) == whole.encode(texts[0], max_length=max_length)


@property_settings
@given(a=long | text, b=long | text, max_length=st.integers(4, 16),
       strategy=st.sampled_from([True, True, "longest_first", "only_first", "only_second"]))
def test_property_a_cut_pair_keeps_the_tokens_of_the_whole_pair(tokenizers, a, b, max_length, strategy):
    """Longest-first shares the budget by both lengths (an odd token goes to the longer text):
    the cut must keep which text is the longer one."""
    tok, whole = tokenizers
    with cutting_everywhere():
        same(tok, whole, [a], [b], max_length=max_length, truncation=strategy)
        if strategy is True:
            assert tok.encode(a, b, max_length=max_length) == whole.encode(a, b, max_length=max_length)


@property_settings
@given(words=st.lists(st.lists(piece, min_size=1, max_size=3).map("".join), min_size=1, max_size=30),
       pair=st.lists(st.lists(piece, min_size=1, max_size=3).map("".join), min_size=1, max_size=30),
       max_length=st.integers(4, 16))
def test_property_cut_word_lists_keep_their_tokens_and_word_ids(tokenizers, words, pair, max_length):
    tok, whole = tokenizers
    with cutting_everywhere():
        same(tok, whole, [words], is_split_into_words=True, max_length=max_length, return_word_ids=True)
        same(tok, whole, [words], [pair], is_split_into_words=True, max_length=max_length)


@settings(max_examples=8, deadline=None)
@given(unit=st.lists(piece, min_size=1, max_size=12).map("".join), repeat=st.integers(50, 200),
       tail=text, max_length=st.integers(3, 64))
def test_property_long_texts_with_the_real_constants(tokenizers, unit, repeat, tail, max_length):
    tok, whole = tokenizers
    long_text = unit * repeat + tail
    same(tok, whole, [long_text, tail], max_length=max_length)
    same(tok, whole, [long_text], [unit * (repeat // 2)], max_length=max_length)


def test_lengths_at_a_tie_and_an_odd_budget(tokenizers):
    """Two long texts of exactly as many tokens, or one more: the odd token goes to the second
    text at a tie and to the longer one otherwise; cut prefixes must give the same."""
    tok, whole = tokenizers
    for n_a, n_b in ((500, 500), (501, 500), (500, 501), (400, 700), (700, 400)):
        a, b = "dog " * n_a, "cat " * n_b
        for max_length in (31, 32, 64):
            same(tok, whole, [a], [b], max_length=max_length)


def test_qa_contexts_and_overflow_windows_are_never_cut(tokenizers):
    """Windows over a context (SQuAD, return_overflowing_tokens) and untruncated calls need
    the whole text: they get what the uncut tokenizer gives."""
    tok, whole = tokenizers
    context = "The Normans gave their name to Normandy, a region in France. " * 300
    same(tok, whole, [context], truncation=False)
    same(tok, whole, ["Who gave their name to Normandy?"], [context], max_length=64, stride=16,
         return_overflowing_tokens=True)
    got = tok(["Who?"], [context], max_length=64, stride=16, return_overflowing_tokens=True,
              return_offsets_mapping=True, padding=False, return_tensors=None)
    assert got["offset_mapping"][-1][-2][1] == len(context.rstrip())  # the last window ends with the context


@contextlib.contextmanager
def backend_spy(tok):
    """Wrap the tokenizer's Rust backend (its cutter's too) while the block runs; yields the list
    of characters every backend call receives (a pair's: both texts together)."""
    seen: list[int] = []
    backend = tok.backend

    def chars(x) -> int:
        return sum(map(len, x)) if isinstance(x, tuple) else len(x)

    class Spy:
        def __getattr__(self, name):
            return getattr(backend, name)

        def encode(self, sequence, *args, **kwargs):
            seen.append(len(sequence))
            return backend.encode(sequence, *args, **kwargs)

        def encode_batch(self, inputs, *args, **kwargs):
            seen.extend(map(chars, inputs))
            return backend.encode_batch(inputs, *args, **kwargs)

        def encode_batch_fast(self, inputs, *args, **kwargs):  # the call for ids without offsets
            seen.extend(map(chars, inputs))
            return backend.encode_batch_fast(inputs, *args, **kwargs)

    tok.backend = tok._cutter.backend = Spy()
    try:
        yield seen
    finally:
        tok.backend = tok._cutter.backend = backend


def test_a_50_mb_line_and_a_long_pair_cost_little_time_and_memory(tokenizers):
    """The bound is in the work done: a text a million times longer than max_length is cut
    before the Rust tokenizer sees it. Asserted on memory (tracemalloc) and on what the backend is
    given, not on the clock."""
    tok, _ = tokenizers
    line = "the quick brown fox jumps over the lazy dog. " * 1_200_000  # 54 MB, one line
    with backend_spy(tok) as seen:
        tracemalloc.start()
        try:
            got = tok([line], max_length=32, return_tensors=None)
            pair = tok(["word " * 5000], ["other word " * 5000], max_length=32, return_tensors=None)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert len(got["input_ids"][0]) == 32 and len(pair["input_ids"][0]) == 32
    assert seen and max(seen) < 80_000  # characters the tokenizer got at once (of 54 million)
    assert peak < 200e6  # bytes: the slices, never copies of the whole line per token


# runs that a squeeze shortens: words past WordPiece's 100 characters (letters, emoji, accents,
# control characters inside), runs of dropped characters and of whitespace, brackets of [MASK]
RUNS = ["a" * 150, "Z" * 300, "😀" * 140, "e\u0301" * 120, "ab\x00" * 60, "\x00" * 7, "\u0301" * 9, " " * 6,
        " \x00\t" * 4, "\x00\x00 \x00", "\n\n\n", "[" * 5, "]" * 5, "[MASK" + "K" * 200, "MASK]" * 30, "x" * 101,
        "x" * 107]
run = st.sampled_from(RUNS)
with_runs = st.lists(run | piece, min_size=1, max_size=40).map("".join)


@property_settings
@given(texts=st.lists(with_runs, min_size=1, max_size=3), max_length=st.integers(3, 24))
def test_property_squeezed_runs_keep_the_tokens_word_ids_and_offsets(tokenizers, texts, max_length):
    """Squeezed and cut, a text has exactly the ids, word ids and offsets of the whole text's
    first max_length tokens (the real constants for the squeeze: runs of 100+ characters)."""
    tok, whole = tokenizers
    with cutting_everywhere():
        same(tok, whole, texts, max_length=max_length, return_word_ids=True)
    same(tok, whole, texts, max_length=max_length, return_word_ids=True)


@property_settings
@given(a=with_runs, b=with_runs, max_length=st.integers(4, 24),
       strategy=st.sampled_from([True, "only_first", "only_second"]))
def test_property_squeezed_pairs_and_word_lists_keep_their_tokens(tokenizers, a, b, max_length, strategy):
    tok, whole = tokenizers
    with cutting_everywhere():
        same(tok, whole, [a], [b], max_length=max_length, truncation=strategy)
        same(tok, whole, [a.split(" ")], is_split_into_words=True, max_length=max_length, return_word_ids=True)


def test_texts_within_the_bound_reach_the_tokenizer_unchanged(tokenizers):
    """The bound, CHARS_PER_TOKEN * (max_length - 1) + SHORT characters: a text within it is not
    touched; one past it with nothing to squeeze or cut is not either."""
    tok, _ = tokenizers
    cutter, budget = tok._cutter, 30  # max_length 32
    bound = long_texts.CHARS_PER_TOKEN * (budget + 1) + long_texts.SHORT
    within = ["a" * bound, "\x00" * bound, " " * bound, ("word " * bound)[:bound]]
    assert cutter.cut(within, None, budget, "longest_first", False) == (within, None, None)
    short = ["a b " * 100]  # a few tokens past the bound, no run: nothing to change
    assert cutter.cut(short, None, 1000, "longest_first", False) == (short, None, None)


@pytest.mark.parametrize("text, same_as", [
    ("a" * 10_000_000, "a" * 500),  # one word: one [UNK]
    ("\x00" * 10_000_000, ""),  # /dev/zero: nothing
    (" " * 10_000_000 + "end", "end"),
    ("😀" * 2_000_000, "😀" * 101),
    ("𠀀" * 2_000_000, "𠀀" * 40),  # a word each
    ("]" * 2_000_000, "]" * 40),
    ("[" * 2_000_000, "[" * 40),
    ("a\x00" * 5_000_000 + " end", "a" * 200 + " end"),
    ("e\u0301" * 5_000_000, "e" * 200),
    ("a" * 10_000_000 + " b c", "a" * 200 + " b c"),  # a squeeze keeps what follows the run
])
def test_a_line_without_spaces_costs_what_max_length_costs(tokenizers, text, same_as):
    """Runs without a boundary (no space, no punctuation) are squeezed before the Rust tokenizer
    sees them: it gets a number of characters bounded by max_length, not by the text, and the
    ids (and offsets, back in the whole text) are those of the whole text."""
    tok, whole = tokenizers
    with backend_spy(tok) as seen:
        got = tok([text], max_length=32, return_tensors=None, return_offsets_mapping=True)
        ids = tok.encode(text, max_length=32)
        only_ids = tok([text], max_length=32, padding=False, return_tensors=None, return_token_type_ids=False,
                       return_attention_mask=False)["input_ids"]  # what embedding asks for
    want = whole([same_as], max_length=32, return_tensors=None)
    assert got["input_ids"] == want["input_ids"] == only_ids and ids == want["input_ids"][0]
    assert max(seen) < 20_000  # characters the tokenizer got at once
    starts = [s for s, e in got["offset_mapping"][0] if e > s]
    ends = [e for s, e in got["offset_mapping"][0] if e > s]
    assert all(0 <= s < e <= len(text) for s, e in zip(starts, ends))
    if text.startswith("a" * 1000):  # the [UNK] covers the whole word
        assert got["offset_mapping"][0][1] == (0, text.index(" ") if " " in text else len(text))
