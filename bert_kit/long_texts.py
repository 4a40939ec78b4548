"""Long texts cut before tokenizing, keeping exactly the tokens that truncation keeps.

Truncated to max_length, a text keeps at most its first max_length tokens, but the Rust
tokenizer first normalises, splits and encodes all of it, and for a pair it also builds every
overflow window of one text against every window of the other: time and memory grow with the
product of the two lengths (one pair of 5,000-word texts took 7 s, a 50 MB line 93 s and 6.9 GB).
So `Cutter.cut` hands the tokenizer a prefix of each long text, cut at a word boundary, that
holds more tokens than truncation can keep:

- a boundary is a character that no word and no added token ([MASK]) continues across:
  whitespace, punctuation and CJK ideographs, each checked once against the tokenizer's own
  normalizer and pre-tokenizer. The tokens before a boundary do not depend on what follows it,
  so a prefix's tokens are the whole text's first tokens, with the same offsets and word ids;
- tokens are counted chunk by chunk (about `CHARS_PER_TOKEN` characters per token still
  missing) until the prefix holds one more than can be kept (the last one may differ: an added
  token that strips the whitespace on its right);
- a pair truncated longest-first keeps tokens by both lengths. A text that holds more tokens
  than the whole budget keeps the same share when cut to another such prefix, except in one
  case: both texts longer than the budget, and an odd budget, whose odd token goes to the longer
  text. Then both texts are counted on, side by side, until the shorter one ends (linear time,
  memory of one chunk), and the prefix of the longer one is extended until it is the longer.

Texts are cut only when truncation keeps a prefix: never with overflow windows (QA contexts,
`return_overflowing_tokens`), never without truncation. Only the BERT pipeline is cut
(BertNormalizer and BertPreTokenizer, added tokens that match anywhere); a tokenizer with
another pipeline encodes every text whole.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import Any

from tokenizers import Tokenizer, normalizers, pre_tokenizers

CHARS_PER_TOKEN = 8  # characters read per missing token: WordPiece tokens average 4-5 in English
SHORT = 1024  # texts within CHARS_PER_TOKEN * (budget + 1) + SHORT characters are tokenized whole
CHUNK = 1 << 16  # characters per step when counting a whole text (pairs with an odd budget)
CJK_RANGES = ("\u3400", "\u4dbf"), ("\u4e00", "\u9fff")  # ideographs BERT's normalizer spaces apart


def _pieces(backend: Tokenizer, text: str) -> list[str]:
    return [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text))]


_PATTERNS: dict[tuple, re.Pattern | None] = {}  # (normalizer settings, added tokens) -> boundary pattern


def boundary_pattern(backend: Tokenizer) -> re.Pattern | None:
    """A regex matching one boundary character of `backend`'s pipeline, or None when the pipeline
    is not BERT's (then no text is cut). Found once per pipeline (about 0.1 s)."""
    if not (isinstance(backend.normalizer, normalizers.BertNormalizer)
            and isinstance(backend.pre_tokenizer, pre_tokenizers.BertPreTokenizer)):
        return None
    added = tuple((t.content, t.single_word) for t in backend.get_added_tokens_decoder().values())
    key = (backend.normalizer.__getstate__(), added)
    if key not in _PATTERNS:
        _PATTERNS[key] = _probe(backend, added)
    return _PATTERNS[key]


def _probe(backend: Tokenizer, added: tuple[tuple[str, bool], ...]) -> re.Pattern | None:
    if any(single_word for _, single_word in added):  # matched by its neighbours: a cut could change that
        return None
    taken = set("".join(content for content, _ in added))
    spaced = any(c.isspace() for c in taken)  # an added token with a space: whitespace is no boundary
    # ASCII symbols ($, +, <) are punctuation to BERT; beyond ASCII, Unicode's punctuation and spaces
    candidates = [c for c in map(chr, range(0x10000)) if unicodedata.category(c)[0] in "PZ"
                  or (c.isascii() and not c.isalnum() and (c.isprintable() or c in "\t\n\r"))]
    chars = []
    for c in candidates:
        if c in taken:
            continue
        pieces = _pieces(backend, f"x{c}x")  # isolated (punctuation) or dropped between words (space)
        if (len(pieces) == 3 and pieces[0] == pieces[2] == "x" and "x" not in pieces[1]) or \
                (pieces == ["x", "x"] and not spaced):
            chars.append(re.escape(c))
    cjk = ""
    if not spaced and not any(lo <= c <= hi for lo, hi in CJK_RANGES for c in taken) and \
            all(len(_pieces(backend, f"x{c}x")) == 3 for pair in CJK_RANGES for c in pair):
        cjk = "".join(f"{lo}-{hi}" for lo, hi in CJK_RANGES)
    return re.compile("[" + "".join(chars) + cjk + "]") if chars or cjk else None


class Cutter:
    """Cuts texts to prefixes for one tokenizer backend (see the module docstring)."""

    def __init__(self, backend: Tokenizer):
        self.backend = backend
        self._boundary: Any = False  # found on first use

    @property
    def boundary(self) -> re.Pattern | None:
        if self._boundary is False:
            self._boundary = boundary_pattern(self.backend)
        return self._boundary

    def count(self, text: str | list[str]) -> int:
        """Tokens of a text (or a list of words), without [CLS]/[SEP]."""
        return len(self.backend.encode(text, is_pretokenized=isinstance(text, list), add_special_tokens=False).ids)

    # ---- one text -------------------------------------------------------------------------------

    def walk(self, text: str, end: int = 0, count: int = 0, budget: int | None = None) -> Iterator[tuple[int, int]]:
        """(end, tokens of text[:end]) at successive boundaries from `end`; the last is (len(text),
        all tokens). Steps of CHARS_PER_TOKEN per token short of `budget` + 1, else of CHUNK."""
        while end < len(text):
            stop = self._stop(text, end, CHUNK if budget is None else CHARS_PER_TOKEN * max(budget + 1 - count, 1))
            count += self.count(text[end:stop])
            end = stop
            yield end, count

    def _stop(self, text: str, end: int, step: int) -> int:
        """The first boundary at least `step` characters after `end`, else the end of the text."""
        found = self.boundary.search(text, end + step) if self.boundary else None
        return found.start() if found else len(text)

    def prefix(self, text: str, budget: int) -> tuple[int, int] | None:
        """(end, tokens) of the shortest walked prefix of `text` holding more than `budget` tokens,
        or None when the text is short or holds no such prefix (it is then tokenized whole)."""
        if self.boundary is None or len(text) <= CHARS_PER_TOKEN * (budget + 1) + SHORT:
            return None
        for end, count in self.walk(text, budget=budget):
            if count > budget:
                return (end, count) if end < len(text) else None
        return None

    # ---- a list of words (is_split_into_words) --------------------------------------------------

    def word_prefix(self, words: list[str], budget: int) -> list[str] | None:
        """The first words of `words` (the last one maybe cut) holding more than `budget` tokens,
        or None when the list is short or holds no more. Each word is tokenized on its own."""
        if self.boundary is None or sum(map(len, words)) <= CHARS_PER_TOKEN * (budget + 1) + SHORT:
            return None
        count = 0
        for i, word in enumerate(words):
            cut = self.prefix(word, budget - count)
            if cut is not None:
                return words[:i] + [word[:cut[0]]]
            count += self.count(word)
            if count > budget:
                return words[: i + 1] if i + 1 < len(words) else None
        return None

    # ---- a batch ---------------------------------------------------------------------------------

    def cut(self, batch_a: list, batch_b: list | None, budget: int, strategy: str,
            split: bool) -> tuple[list, list | None]:
        """The batch with long texts cut, for truncation to `budget` tokens besides the special
        ones (max_length - 2, or - 3 for pairs) with `strategy`."""
        if self.boundary is None or budget < 1:
            return batch_a, batch_b
        one = self.word_prefix if split else (lambda t, n: None if (p := self.prefix(t, n)) is None else t[:p[0]])
        if batch_b is None:
            if strategy == "only_second":  # an error the tokenizer reports
                return batch_a, None
            return [x if (c := one(x, budget)) is None else c for x in batch_a], None
        out_a, out_b = [], []
        for a, b in zip(batch_a, batch_b):
            if strategy == "only_first":  # the second text is kept whole, and so tokenized whole
                a = a if (c := one(a, budget)) is None else c
            elif strategy == "only_second":
                b = b if (c := one(b, budget)) is None else c
            elif split:
                a, b = self._cut_word_pair(a, b, budget)
            else:
                a, b = self._cut_pair(a, b, budget)
            out_a.append(a)
            out_b.append(b)
        return out_a, out_b

    def _cut_pair(self, a: str, b: str, budget: int) -> tuple[str, str]:
        """Longest-first: each long text cut to more than `budget` tokens; with an odd budget, the
        prefixes also keep which text is the longer one (see the module docstring)."""
        pa, pb = self.prefix(a, budget), self.prefix(b, budget)
        if (pa is None and pb is None) or budget % 2 == 0:
            return a if pa is None else a[:pa[0]], b if pb is None else b[:pb[0]]
        # a text that is not cut is counted whole
        (ea, ca), (eb, cb) = pa or (len(a), self.count(a)), pb or (len(b), self.count(b))
        if self._longer(a, ea, ca, b, eb, cb):  # a's prefix must hold more tokens than b's
            for ea, ca in self.walk(a, ea, ca, budget=cb) if ca <= cb else ():
                if ca > cb:
                    break
        elif ca > cb:  # b's prefix must hold at least as many tokens as a's
            for eb, cb in self.walk(b, eb, cb, budget=ca - 1):
                if cb >= ca:
                    break
        return a[:ea], b[:eb]

    def _longer(self, a: str, ea: int, ca: int, b: str, eb: int, cb: int) -> bool:
        """Whether text a holds more tokens than text b, counting on from prefixes (ea, ca) and
        (eb, cb) side by side until the shorter text ends."""
        while ea < len(a) and eb < len(b):  # a chunk of each at once: the Rust tokenizer gives each a core
            sa, sb = self._stop(a, ea, CHUNK), self._stop(b, eb, CHUNK)
            na, nb = (len(e.ids) for e in self.backend.encode_batch([a[ea:sa], b[eb:sb]], add_special_tokens=False))
            ea, ca, eb, cb = sa, ca + na, sb, cb + nb
        walk_a, walk_b = self.walk(a, ea, ca), self.walk(b, eb, cb)
        while ea < len(a) and ca <= cb:  # b is counted: is a longer?
            ea, ca = next(walk_a)
        while eb < len(b) and cb < ca:  # a is counted: is b as long?
            eb, cb = next(walk_b)
        return ca > cb

    def _cut_word_pair(self, a: list[str], b: list[str], budget: int) -> tuple[list[str], list[str]]:
        """Longest-first on word lists: as `_cut_pair`, except that where the order of the two
        lengths matters (an odd budget, both over it) both are tokenized whole (no caller in
        bert-kit encodes pairs of word lists)."""
        ca, cb = self.word_prefix(a, budget), self.word_prefix(b, budget)
        if budget % 2 == 1 and (ca is not None or cb is not None):
            whole = b if cb is None else a if ca is None else None  # the list that is not cut
            if whole is None or self.count(whole) > budget:  # its order against the cut one matters
                return a, b
        return a if ca is None else ca, b if cb is None else cb
