"""Long texts cut before tokenizing, keeping exactly the tokens that truncation keeps.

Truncated to max_length, a text keeps at most its first max_length tokens, but the Rust
tokenizer first normalises, splits and encodes all of it, and for a pair it also builds every
overflow window of one text against every window of the other: time and memory grow with the
product of the two lengths (one pair of 5,000-word texts took 7 s, a 50 MB line 93 s and 6.9 GB;
a 10 MB word 17 s). So `Cutter.cut` hands the tokenizer a shorter text with the same tokens, in
two steps.

Squeeze (`Characters.squeeze`), for runs of characters that add nothing, wherever they are:

- a run of three or more characters that the normaliser drops (control characters, accents it
  strips) or that only end words (whitespace) becomes one of them, a space if it holds one: the
  words on either side stay apart, or together, as before;
- a run of word characters (and dropped ones) keeps its first `max_input_chars_per_word` + 1
  word characters and its last few: WordPiece makes a word of more characters than that one
  [UNK], so the word is still one [UNK], however long it was (a 10 MB line without a space).

The kind of each character is found once per pipeline, when a text first brings it
(`char_kind`: between two letters, is it dropped, a space, a word of its own, or a letter of
the word?). Characters of added tokens ([MASK]) are never squeezed out unless no added token
could match across the gap, and offsets are mapped back to the text as given (`Squeezed`).

Prefix (`Cutter.prefix`), cut at a word boundary, holding more tokens than truncation can keep:

- a boundary is a character that no word and no added token continues across: whitespace,
  punctuation and CJK ideographs, each checked against the tokenizer's own normalizer and
  pre-tokenizer ("[" too, which only starts [MASK]). The tokens before a boundary do not
  depend on what follows it, so a prefix's tokens are the whole text's first tokens, with the
  same offsets and word ids;
- tokens are counted chunk by chunk (about `CHARS_PER_TOKEN` characters per token still
  missing) until the prefix holds one more than can be kept (the last one may differ: an added
  token that strips the whitespace on its right);
- a pair truncated longest-first keeps tokens by both lengths. A text that holds more tokens
  than the whole budget keeps the same share when cut to another such prefix, except in one
  case: both texts longer than the budget, and an odd budget, whose odd token goes to the longer
  text. Then both texts are counted on, side by side, until the shorter one ends (linear time,
  memory of one chunk), and the prefix of the longer one is extended until it is the longer.

After the squeeze every run between boundaries is short, so the tokenizer sees a number of
characters bounded by max_length, not by the text.

Texts are cut only when truncation keeps a prefix: never with overflow windows (QA contexts,
`return_overflowing_tokens`), never without truncation. Only the BERT pipeline is cut
(BertNormalizer and BertPreTokenizer, added tokens that match anywhere); a tokenizer with
another pipeline encodes every text whole.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from tokenizers import Tokenizer, normalizers, pre_tokenizers

CHARS_PER_TOKEN = 8  # characters read per missing token: WordPiece tokens average 4-5 in English
SHORT = 1024  # texts within CHARS_PER_TOKEN * (budget + 1) + SHORT characters are tokenized whole
CHUNK = 1 << 16  # characters per step when counting a whole text (pairs with an odd budget)
CJK_RANGES = ("\u3400", "\u4dbf"), ("\u4e00", "\u9fff")  # ideographs BERT's normalizer spaces apart
MAX_WORD = 10_000  # a WordPiece model that reads longer words than this gets no squeezed word runs
VOID, SPACE, SPLIT, SOLID = "void", "space", "split", "solid"  # what a character is to the pipeline


def _pieces(backend: Tokenizer, text: str) -> list[str]:
    return [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text))]


def char_kind(backend: Tokenizer, c: str) -> str | None:
    """What `backend`'s pipeline makes of character `c` between two letters: VOID (dropped, the
    letters stay one word), SPACE (dropped, the word ends), SPLIT (a word of its own:
    punctuation, CJK), SOLID (one or more characters of the word), or None (anything else)."""
    pieces = _pieces(backend, f"x{c}x")
    if pieces == ["xx"]:
        return VOID
    if pieces == ["x", "x"]:
        return SPACE
    if len(pieces) == 3 and pieces[0] == pieces[2] == "x" and "x" not in pieces[1]:
        return SPLIT
    if len(pieces) == 1 and len(pieces[0]) > 2 and pieces[0][0] == pieces[0][-1] == "x":
        return SOLID
    return None


def _char_class(chars: Iterable[str]) -> str:
    """The inside of a regex [...] matching `chars`, as ranges of consecutive code points."""
    points = sorted(map(ord, chars))
    out, i = [], 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[j] + 1:
            j += 1
        lo, hi = re.escape(chr(points[i])), re.escape(chr(points[j]))
        out.append(lo if i == j else f"{lo}-{hi}")
        i = j + 1
    return "".join(out)


class Squeezed(NamedTuple):
    """A text with runs squeezed out: `text`, and for each kept piece, its start in `text`
    (`starts`) and in the text it was squeezed from (`origins`); `then`: the map of an earlier
    squeeze of that text, or None."""

    text: str
    starts: list[int]
    origins: list[int]
    then: Squeezed | None = None

    def position(self, i: int) -> int:
        """The index in the original text of character i of `text`."""
        k = bisect_right(self.starts, i) - 1
        i = self.origins[k] + i - self.starts[k]
        return i if self.then is None else self.then.position(i)

    def flat(self) -> tuple[list[int], list[int]]:
        """(starts, origins) of one map from `text` to the original text."""
        if self.then is None:
            return self.starts, self.origins
        inner_starts, inner_origins = self.then.flat()
        starts, origins = [], []
        ends = self.starts[1:] + [len(self.text)]
        for start, end, origin in zip(self.starts, ends, self.origins):  # a piece, split where the inner map is
            k = bisect_right(inner_starts, origin) - 1
            while k < len(inner_starts) and (k < 0 or inner_starts[k] < origin + end - start):
                at = max(origin, inner_starts[k])
                starts.append(start + at - origin)
                origins.append(inner_origins[k] + at - inner_starts[k])
                k += 1
        return starts, origins

    def offsets(self, start: int, end: int) -> tuple[int, int]:
        """A token's (start, end) in `text` -> in the original text (a token starts and ends on
        kept characters: squeezed runs are inside a word or between words)."""
        return (start, end) if start >= end else (self.position(start), self.position(end - 1) + 1)


def _drop(text: str, spans: list[tuple[int, int]], then: Squeezed | None) -> Squeezed:
    """`text` without the (start, end) `spans` (sorted, disjoint)."""
    pieces: list[str] = []
    starts: list[int] = []
    origins: list[int] = []
    at = length = 0
    for start, end in spans + [(len(text), len(text))]:
        if start > at:
            pieces.append(text[at:start])
            starts.append(length)
            origins.append(at)
            length += start - at
        at = end
    return Squeezed("".join(pieces), starts or [0], origins or [0], then)


class Characters:
    """What one BERT pipeline makes of each character, learned as texts bring new ones, and the
    patterns built from it: the boundaries a prefix may end at, and the runs a squeeze shortens.
    Shared by every tokenizer of the same pipeline (`for_backend`)."""

    def __init__(self, backend: Tokenizer, added: list[Any]):
        self.backend = backend
        self._lock = threading.Lock()
        taken = {c for t in added for c in t.content}
        self.spaced = any(c.isspace() for c in taken)  # an added token with a space: whitespace is no boundary
        # a token that takes the whitespace beside it into its offsets: that whitespace is kept whole
        self.keep_spaces = self.spaced or any(t.lstrip or t.rstrip for t in added)
        raw = {c: char_kind(backend, c) for c in taken}
        # an added token of word characters alone could match inside a squeezed run: its letters are not squeezed
        lettered = {c for t in added if all(raw[c] in (SOLID, VOID) for c in t.content) for c in t.content}
        self.kinds: dict[str, str | None] = {c: SOLID if raw[c] == SOLID and c not in lettered else None for c in taken}
        # a token's punctuation may still end a prefix where no added token continues across:
        # before a character that starts tokens only ("[" of [MASK]), or after one that no token continues
        self.first = {c for c in taken if raw[c] == SPLIT and all(c not in t.content[1:] for t in added)}
        self.marks = {c for c in taken if raw[c] == SPLIT} - self.first
        self.continued = {c for t in added for c in t.content[:-1]}
        model_word = getattr(backend.model, "max_input_chars_per_word", None)
        # WordPiece makes a word of more than model_word characters one [UNK]; a normalized added token
        # matches after the normalizer, where the letters of a squeezed run could meet
        self.word = (max(model_word, max((len(t.content) for t in added), default=0)) + 1
                     if isinstance(model_word, int) and model_word <= MAX_WORD and type(backend.model).__name__ ==
                     "WordPiece" and not any(t.normalized for t in added) else None)
        self.tail = max(3, max((len(t.content) for t in added), default=0))
        self.base = self._probe(taken)
        self._compile()

    def _probe(self, taken: set[str]) -> str:
        """The base boundary class: punctuation and spaces of the BMP, the CJK ranges."""
        # ASCII symbols ($, +, <) are punctuation to BERT; beyond ASCII, Unicode's punctuation and spaces
        candidates = [c for c in map(chr, range(0x10000)) if unicodedata.category(c)[0] in "PZ"
                      or (c.isascii() and not c.isalnum() and (c.isprintable() or c in "\t\n\r"))]
        for c in candidates:
            if c not in taken:
                self.kinds[c] = char_kind(self.backend, c)
        cjk = ""
        if not self.spaced and not any(lo <= c <= hi for lo, hi in CJK_RANGES for c in taken) and \
                all(char_kind(self.backend, c) == SPLIT for pair in CJK_RANGES for c in pair):
            cjk = "".join(f"{lo}-{hi}" for lo, hi in CJK_RANGES)
        return cjk

    def _compile(self) -> None:
        """The patterns, from the kinds known so far."""
        of: dict[str | None, list[str]] = {VOID: [], SPACE: [], SPLIT: [], SOLID: [], None: []}
        for c, kind in self.kinds.items():
            of[kind].append(c)
        spaces = [] if self.spaced else of[SPACE]
        # of[SPLIT] holds no added token's character: those are SOLID or None
        bounds = _char_class(of[SPLIT] + spaces + sorted(self.first)) + self.base
        alternatives = [f"[{bounds}]"] if bounds else []
        if self.marks:
            alternatives.append(f"(?<![{_char_class(self.continued)}])[{_char_class(self.marks)}]")
        self.boundary = re.compile("|".join(alternatives)) if alternatives else None
        self._unknown = re.compile(f"[^{_char_class(self.kinds)}{self.base}]")
        squeezed = [] if self.keep_spaces else spaces
        blank = _char_class(of[VOID] + squeezed)
        self._blanks = re.compile(f"[{blank}]{{3,}}") if blank else None
        self._space = re.compile(f"[{_char_class(squeezed)}]") if squeezed else None
        letters, void = _char_class(of[SOLID]), _char_class(of[VOID])
        if self.word is not None and letters:
            either = letters + void
            self._runs = re.compile(f"(?<![{either}])[{either}]{{{self.word + self.tail + 1},}}")
            self._head = re.compile((f"(?:[{void}]*[{letters}])" if void else f"[{letters}]") + f"{{{self.word}}}")
        else:
            self._runs = self._head = None

    def learn(self, text: str) -> None:
        """Find the kind of every character of `text` not seen before."""
        at = 0
        while (found := self._unknown.search(text, at)) is not None:
            with self._lock:
                at = found.start()
                for c in set(text[at:at + 4096]) - self.kinds.keys():
                    self.kinds[c] = char_kind(self.backend, c)
                self._compile()

    def squeeze(self, text: str) -> Squeezed | None:
        """`text` with runs that add nothing shortened (see the module docstring), or None when
        it has none. The squeezed text has the same tokens, word ids and (mapped) offsets."""
        self.learn(text)
        squeezed = None
        if self._blanks is not None:
            spans = []
            for run in self._blanks.finditer(text):
                start, end = run.span()
                space = self._space.search(text, start, end) if self._space is not None else None
                keep = space.start() if space is not None else start  # one space keeps the words apart
                spans += [(start, keep), (keep + 1, end)]
            if spans:
                squeezed = _drop(text, [s for s in spans if s[0] < s[1]], None)
                text = squeezed.text
        if self._runs is not None:
            spans = []
            for run in self._runs.finditer(text):
                head = self._head.match(text, run.start())
                if head is not None and head.end() < run.end() - self.tail:
                    spans.append((head.end(), run.end() - self.tail))
            if spans:
                squeezed = _drop(text, spans, squeezed)
        return squeezed


_CHARACTERS: dict[tuple, Characters | None] = {}  # (normalizer settings, added tokens, model) -> its Characters


def for_backend(backend: Tokenizer) -> Characters | None:
    """The `Characters` of `backend`'s pipeline, or None when the pipeline is not BERT's, or an
    added token matches by its neighbours (then no text is cut). Found once per pipeline (0.1 s)."""
    if not (isinstance(backend.normalizer, normalizers.BertNormalizer)
            and isinstance(backend.pre_tokenizer, pre_tokenizers.BertPreTokenizer)):
        return None
    added = list(backend.get_added_tokens_decoder().values())
    key = (backend.normalizer.__getstate__(), tuple((t.content, t.single_word, t.normalized) for t in added),
           type(backend.model).__name__, getattr(backend.model, "max_input_chars_per_word", None))
    if key not in _CHARACTERS:
        # a single-word added token is matched by its neighbours: a cut could change that
        _CHARACTERS[key] = None if any(t.single_word for t in added) else Characters(backend, added)
    return _CHARACTERS[key]


class Cutter:
    """Cuts texts for one tokenizer backend (see the module docstring)."""

    def __init__(self, backend: Tokenizer):
        self.backend = backend
        self._chars: Any = False  # found on first use; None: no text is cut

    @property
    def chars(self) -> Characters | None:
        if self._chars is False:
            self._chars = for_backend(self.backend)
        return self._chars

    @property
    def boundary(self) -> re.Pattern | None:
        return None if self.chars is None else self.chars.boundary

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

    def squeeze(self, item: str | list[str], long: int) -> tuple[str | list[str], Any]:
        """(a text squeezed, its `Squeezed` map or None), when longer than `long` characters; for a
        list of words, each word of more than SHORT characters, and {word index: map}."""
        if isinstance(item, str):
            squeezed = self.chars.squeeze(item) if len(item) > long else None
            return (item, None) if squeezed is None else (squeezed.text, squeezed)
        if sum(map(len, item)) <= long:
            return item, None
        words, maps = list(item), {}
        for i, word in enumerate(words):
            words[i], found = self.squeeze(word, SHORT)
            if found is not None:
                maps[i] = found
        return words, maps or None

    def cut(self, batch_a: list, batch_b: list | None, budget: int, strategy: str,
            split: bool) -> tuple[list, list | None, list[tuple[Any, Any]] | None]:
        """The batch with long texts squeezed and cut, for truncation to `budget` tokens besides
        the special ones (max_length - 2, or - 3 for pairs) with `strategy`; and for each row, the
        maps of its squeezed texts (see `squeeze`; None for a text not squeezed), or None when no
        text was squeezed (`original_offsets` maps the offsets back)."""
        long = CHARS_PER_TOKEN * (budget + 1) + SHORT
        if _longest(batch_a, split) <= long and (batch_b is None or _longest(batch_b, split) <= long):
            return batch_a, batch_b, None  # the common case: no text is long enough to be squeezed or cut
        if self.boundary is None or budget < 1:
            return batch_a, batch_b, None
        if strategy == "only_second" and batch_b is None:  # an error the tokenizer reports
            return batch_a, None, None
        if batch_b is None and not split:
            rows = [self._cut_text(text, budget, long) if len(text) > long else (text, None) for text in batch_a]
            maps = [(squeezed, None) for _, squeezed in rows]
            return [text for text, _ in rows], None, maps if any(m != (None, None) for m in maps) else None
        # a pair's lengths may be counted whole (see _cut_pair): its texts are squeezed whole
        pairs = [(self.squeeze(a, long), self.squeeze(b, long) if batch_b is not None else (None, None))
                 for a, b in zip(batch_a, batch_b if batch_b is not None else batch_a)]
        batch_a = [a for (a, _), _ in pairs]
        batch_b = None if batch_b is None else [b for _, (b, _) in pairs]
        maps = [(ma, mb) for (_, ma), (_, mb) in pairs]
        batch_a, batch_b = self._cut(batch_a, batch_b, budget, strategy, split)
        return batch_a, batch_b, maps if any(m != (None, None) for m in maps) else None

    def _cut_text(self, text: str, budget: int, long: int) -> tuple[str, Squeezed | None]:
        """One text squeezed and cut to a prefix holding more than `budget` tokens. Squeezed a
        window at a time, each four times longer than the last, until the squeezed windows hold
        such a prefix: squeezing a part of a run keeps the tokens as squeezing it whole does (see
        `Characters.squeeze`), and the tokens up to the last boundary of the windows are the
        text's, so a 50 MB text of words is read only as far as its first tokens."""
        parts: list[str] = []
        starts: list[int] = []  # where each kept piece of the windows starts in the squeezed text
        origins: list[int] = []  # and in the text
        done, length, size = 0, 0, 4 * long
        while True:
            window = text[done:size]
            squeezed = self.chars.squeeze(window) if len(window) > long else None
            piece_starts, piece_origins = ([0], [0]) if squeezed is None else squeezed.flat()
            starts += [length + i for i in piece_starts]
            origins += [done + i for i in piece_origins]
            parts.append(window if squeezed is None else squeezed.text)
            length += len(parts[-1])
            done = min(size, len(text))
            shorter = "".join(parts) if len(parts) > 1 else parts[0]
            cut = self.prefix(shorter, budget)  # a prefix ending before the windows end
            if cut is not None or done == len(text):
                kept = shorter if cut is None else shorter[:cut[0]]
                if starts == origins:  # nothing was squeezed out
                    return kept, None
                return kept, Squeezed(shorter, starts, origins)
            size *= 4

    def _cut(self, batch_a: list, batch_b: list | None, budget: int, strategy: str,
             split: bool) -> tuple[list, list | None]:
        one = self.word_prefix if split else (lambda t, n: None if (p := self.prefix(t, n)) is None else t[:p[0]])
        if batch_b is None:
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


def _longest(batch: list, split: bool) -> int:
    """Characters of the longest text of `batch` (of a list of words: of all its words)."""
    return max((sum(map(len, words)) for words in batch) if split else map(len, batch), default=0)


def original_offsets(offsets: list[tuple[int, int]], sequence_ids: list[int | None], word_ids: list[int | None],
                     maps: tuple[Any, Any]) -> list[tuple[int, int]]:
    """Offsets of one encoded row of squeezed texts -> offsets in the texts as given. maps: the
    row's (map of the first text, of the second) from `Cutter.cut`."""
    out = []
    for offset, sequence, word in zip(offsets, sequence_ids, word_ids):
        found = None if sequence is None else maps[sequence]
        if isinstance(found, dict):  # a list of words: offsets are within each word
            found = found.get(word)
        out.append(offset if found is None else found.offsets(*offset))
    return out
