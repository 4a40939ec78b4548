"""Texts longer than max_length: counted, so that every command that cuts them says so.

Truncation keeps the first max_length tokens of a text (of a pair: longest first) and drops the
rest. Silently, 830-token reviews would be trained on and predicted from their first 128 tokens.
So every command that truncates (`finetune`, `evaluate`, `predict`, `embed`, `glue`) counts
what it cut with `find_truncated` and prints one line per input file, before the work:

    train.csv: 142 of 2,000 texts were longer than max_length 128 and were cut (median 212 tokens,
    longest 830); set max_length higher (up to the model's 512 positions) to keep more of each

`predict` also marks each cut row of its output (`"truncated": true`).

Only a row whose tokens fill max_length can have been cut, and only those rows are tokenized
again, without the limit (counted up to COUNT_LIMIT tokens: a longer text is "at least" that):
a file of short texts costs nothing more.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from bert_kit.data import setting

COUNT_LIMIT = 16_384  # tokens a cut text is counted up to (a 50 MB line is not tokenized whole)
CHUNK = 1024  # texts tokenized again at once


@dataclass
class Truncated:
    """Which of `total` texts (or pairs) were cut to `max_length` tokens, and their whole lengths."""

    total: int
    max_length: int
    rows: list[int] = field(default_factory=list)  # 0-based rows that were cut
    lengths: list[int] = field(default_factory=list)  # their tokens ([CLS]/[SEP] included), at most COUNT_LIMIT
    unit: str = "texts"  # what a row is: texts, pairs, questions
    key: str = "max_length"  # the setting that is the limit

    def __bool__(self) -> bool:
        return bool(self.rows)

    def merge(self, other: Truncated, unit: str = "pairs") -> Truncated:
        """Rows cut in either of two columns of the same rows (the two sentences of bi-encoder
        pairs, each truncated on its own), with the longer of the two lengths."""
        longest = dict(zip(self.rows, self.lengths))
        for row, n in zip(other.rows, other.lengths):
            longest[row] = max(n, longest.get(row, 0))
        rows = sorted(longest)
        return Truncated(self.total, self.max_length, rows, [longest[r] for r in rows], unit, self.key)

    def message(self, source: str | Path | None = None, positions: int | None = None) -> str:
        """One line: how many were cut and by how much, and what to do; `positions`: the model's."""
        lengths = sorted(self.lengths)

        def tokens(n: float) -> str:
            return f"at least {COUNT_LIMIT:,}" if n >= COUNT_LIMIT else f"{n:,.0f}"

        key = setting(self.key)
        if positions is not None and self.max_length >= positions:
            advice = (f"the model has {positions} positions, so the rest of each is never read: split long texts "
                      "into parts to use all of them")
        elif positions is not None:
            advice = f"set {key} higher (up to the model's {positions} positions) to keep more of each"
        else:
            advice = f"set {key} higher to keep more of each"
        where = f"{source}: " if source is not None else ""
        median, longest = tokens(statistics.median_low(lengths)), tokens(lengths[-1])
        return (f"{where}{len(self.rows):,} of {self.total:,} {self.unit} were longer than {key} {self.max_length} "
                f"and were cut (median {median} tokens, longest {longest}); {advice}")


def find_truncated(tokenizer: Any, texts: Sequence[Any], pairs: Sequence[Any] | None, max_length: int | None,
                   kept: Sequence[int] | None = None, unit: str = "texts") -> Truncated:
    """The rows of `texts` (with `pairs`, the second texts) that truncation to `max_length` cuts.

    kept: the token count of each row as truncated (len(input_ids)), when it was tokenized
    already; else it is tokenized here. Only rows that fill max_length are tokenized again.
    max_length None: the tokenizer's own limit (`model_max_length`), as it truncates."""
    max_length = max_length or tokenizer.model_max_length
    if kept is None:
        kept = [len(ids) for ids in token_ids(tokenizer, texts, pairs, max_length)]
    full = [i for i, n in enumerate(kept) if n >= max_length]
    found = Truncated(len(kept), max_length, unit=unit)
    for start in range(0, len(full), CHUNK):
        rows = full[start: start + CHUNK]
        counted = token_ids(tokenizer, [texts[i] for i in rows], None if pairs is None else [pairs[i] for i in rows],
                             COUNT_LIMIT)
        for i, ids in zip(rows, counted):
            if len(ids) > max_length:
                found.rows.append(i)
                found.lengths.append(len(ids))
    return found


def find_long_questions(tokenizer: Any, questions: Sequence[str], max_query_length: int) -> Truncated:
    """The questions of QA examples longer than `max_query_length` tokens (without [CLS]/[SEP]),
    which the windows cut to that many (`bert_kit.data.squad`); lengths without [CLS]/[SEP] too."""
    found = find_truncated(tokenizer, questions, None, max_query_length + 2)
    return Truncated(found.total, max_query_length, found.rows, [n - 2 for n in found.lengths], "questions",
                     "max_query_length")


def token_ids(tokenizer: Any, texts: Sequence[Any], pairs: Sequence[Any] | None, max_length: int) -> list[list[int]]:
    """The ids of each text (with `pairs`, of each pair) truncated to `max_length`, special tokens
    included, unpadded: what a model is given, and what `find_truncated` counts (`kept`)."""
    if not len(texts):
        return []
    return tokenizer(list(texts), None if pairs is None else list(pairs), max_length=max_length, padding=False,
                     truncation=True, return_tensors=None, return_token_type_ids=False,
                     return_attention_mask=False)["input_ids"]


def report_truncated(found: Truncated, source: str | Path | None = None, positions: int | None = None) -> None:
    """Print `found.message` on stderr when some rows were cut."""
    if found:
        print(found.message(source, positions), file=sys.stderr, flush=True)
