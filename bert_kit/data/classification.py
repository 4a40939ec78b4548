"""Sequence classification data: file reader, label checks, dataset and a dynamically padded loader.

A file in any layout of `bert_kit.data.tables` (TSV/CSV with or without a header, JSON Lines, one
text per line) becomes texts, optional second texts and labels; :class:`ClassificationDataset`
tokenizes them once up front ([CLS] a [SEP] (b [SEP])), and :func:`pad_collate` pads each batch
only to its own longest row, which keeps short-sentence tasks such as SST-2 cheap. Labels are
ints for classification and floats for regression (STS-B); the collate turns them into int64 /
float32 tensors accordingly.

Labels are checked, not guessed (:func:`convert_labels`): given `label_names` or `num_labels`
win; a fractional label among integer classes, a non-finite, null or boolean label, a class
outside the names or ids, a mix of numbers and names, or two class names that differ only in
case (`Positive`, `positive`) is an error naming the file and line. Several labels per text
(multi-label classification: JSON lists, `"joy,anger"`, one 0/1 column per label) are read as
label sets by `bert_kit.data.label_sets`, detected or asked for (`multi_label`); asked not to
(`multi_label=False`), a column of lists is refused (:func:`check_single_labels`), as each
combination would become a class of its own. :func:`tokenless` finds the texts that give the
model no token at all (blank, or only control characters).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bert_kit.data import read_text, setting
from bert_kit.data.label_sets import LIST_DELIMITERS, column_sets, convert_sets, detect, split_sets
from bert_kit.data.tables import Column, first_line, no_garbage_collection, read_table, separator_hint, table_layout
from bert_kit.data.truncation import Truncated, find_truncated

# fields padded by pad_collate and the value each is padded with (None = the pad token id)
_PAD_VALUES = {"input_ids": None, "token_type_ids": 0, "attention_mask": 0, "labels": -100}
_NOT_BATCHED = frozenset({"document"})  # the text a window came from: for pooling outputs, not a model input
_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL_COMMA = re.compile(r"[+-]?\d*,\d+")  # "0,5": a number as some locales write it, not a list
_WORD = re.compile(r"\w")  # a letter, digit or underscore: a text holding one gives a token


class ClassificationData(NamedTuple):
    """What :func:`read_classification_file` returns."""

    texts: list[str]
    labels: list[int] | list[float] | list[list[int]] | None  # None when no label column was asked for
    text_pairs: list[str] | None  # second sentences, None without a pair column
    label_names: list[str] | None  # names of label ids 0..K-1 when the file has string labels
    lines: list[str] | None = None  # "file:line" of each example
    multi_label: bool = False  # labels are label sets: the sorted ids of each row's labels
    detected: str = ""  # why the labels were read as sets, when nobody asked for it


def _parse_label(value: Any, at: str) -> tuple[str, Any, str]:
    """(kind, value, as written): kind "int" (written as an integer), "float" (with a point or an
    exponent) or "name". Null, boolean, non-finite and empty labels raise ValueError."""
    if value is None:
        raise ValueError(f"{at}: label is null (missing); every example needs a label")
    if isinstance(value, bool):
        raise ValueError(f"{at}: label {str(value).lower()} is a boolean; write 0/1 or a class name")
    if isinstance(value, int):
        return "int", value, str(value)
    if isinstance(value, float):
        number, text = value, repr(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError(f"{at}: empty label")
        if _INTEGER.fullmatch(text):
            return "int", int(text), text
        try:
            number = float(text)
        except ValueError:
            return "name", text, text
    else:
        raise ValueError(f"{at}: label {value!r} is a JSON {type(value).__name__}, expected a number or a class name")
    if not math.isfinite(number):
        raise ValueError(f"{at}: label {text!r} is not a finite number")
    return "float", number, text


def _parse_labels(raw: Sequence[Any], where: Sequence[str]) -> list[tuple[str, Any, str]]:
    """`_parse_label` of every label, each distinct value parsed once (a column holds few); an
    error names the first line holding the bad value, which is the first bad line."""
    seen: dict[tuple[type, Any], tuple[str, Any, str]] = {}
    out = []
    for value, at in zip(raw, where):
        key = (type(value), value) if isinstance(value, (str, int, float)) else None
        if key is None:
            out.append(_parse_label(value, at))
            continue
        if key not in seen:
            seen[key] = _parse_label(value, at)
        out.append(seen[key])
    return out


def _list_hint(text: Any) -> str:
    """A hint for a label that looks like several ("8,20"), read where one label per row is expected."""
    if isinstance(text, str) and any(d in text for d in LIST_DELIMITERS):
        return f"; several labels in one row? set {setting('classification.multi_label', True)}"
    return ""


def _file_of(at: str) -> str:
    """The file part of a "file:line" location."""
    return at.rsplit(":", 1)[0]


def _check_case(names: list[str], parsed: list[tuple[str, Any, str]], where: list[str]) -> None:
    """Class names that differ only in case would silently become separate classes: refuse them,
    naming the line of the later spelling and where the other one first appears."""
    by_fold: dict[str, list[str]] = {}
    for name in names:
        by_fold.setdefault(name.casefold(), []).append(name)
    clash = next((spellings for spellings in by_fold.values() if len(spellings) > 1), None)
    if clash is None:
        return
    first: dict[str, str] = {}
    for (_, _, text), at in zip(parsed, where):
        first.setdefault(text, at)
    a, b = sorted(clash, key=lambda n: where.index(first[n]))[:2]
    raise ValueError(f"{first[b]}: label {b!r} differs from label {a!r} ({first[a]}) only in case, so they would be "
                     f"two classes; write one spelling, or list both in {setting('label_names')} to keep them apart")


def _class_ids(parsed: list[tuple[str, Any, str]], where: list[str], num_labels: int | None) -> list[int]:
    """Integral labels as class ids, checked to lie in 0..num_labels-1."""
    ids = []
    for (kind, value, text), at in zip(parsed, where):
        if value < 0:
            raise ValueError(f"{at}: label {text} is negative; class ids run from 0 (for regression set num_labels=1)")
        if num_labels is not None and value >= num_labels:
            raise ValueError(f"{at}: label {text} is outside the num_labels={num_labels} classes 0..{num_labels - 1}")
        ids.append(int(value))
    return ids


def convert_labels(raw: Sequence[Any], where: Sequence[str], label_names: Sequence[str] | None = None,
                   num_labels: int | None = None) -> tuple[list[int] | list[float], list[str] | None]:
    """Raw label values (strings of a TSV, JSON values) -> (class ids or float scores, names).

    where[i] is "file:line" of raw[i], for errors. Rules, first match wins:
    - num_labels=1: regression; every label must be a finite number -> floats.
    - label_names given: a label is one of the names (by text), or a class id 0..K-1 -> ids.
    - all class names: ids of the sorted names (the same ids for every split); with num_labels,
      exactly that many names.
    - all integral numbers: class ids >= 0 (and < num_labels when given).
    - numbers with fractions, none written as an integer ("0.5", "3.800"): regression -> floats.
    Errors name the line: a fractional label among integer classes or with num_labels > 1, a
    number among names (or a name among numbers), null, boolean, non-finite or empty labels.
    """
    where = list(where)
    if label_names is not None and num_labels != 1:
        index = {str(name): i for i, name in enumerate(label_names)}
        out = []
        for value, at in zip(raw, where):
            text = value.strip() if isinstance(value, str) else value
            if isinstance(text, (str, int)) and not isinstance(text, bool) and str(text) in index:
                out.append(index[str(text)])
                continue
            kind, number, text = _parse_label(value, at)
            if kind == "name" or (kind == "float" and not float(number).is_integer()) \
                    or not 0 <= number < len(index):
                raise ValueError(f"{at}: label {text!r} is not one of label_names {list(label_names)} "
                                 f"nor a class id 0..{len(index) - 1}{_list_hint(text)}")
            out.append(int(number))
        return out, list(label_names)

    parsed = _parse_labels(raw, where)
    kinds = Counter(kind for kind, _, _ in parsed)
    if num_labels == 1:
        for (kind, _, text), at in zip(parsed, where):
            if kind == "name":
                raise ValueError(f"{at}: label {text!r} is not a number; num_labels=1 means regression on scores")
        return [float(value) for _, value, _ in parsed], None
    if kinds["name"] and len(kinds) > 1:  # the rarer kind is the odd one out
        names_rare = kinds["name"] <= len(parsed) - kinds["name"]
        at, text = next((at, text) for (kind, _, text), at in zip(parsed, where) if (kind == "name") == names_rare)
        if names_rare:
            raise ValueError(f"{at}: label {text!r} is not a number but the other labels are numbers "
                             f"(a header line? set {setting('header', True)}); to use class names give label_names"
                             f"{_list_hint(text)}")
        raise ValueError(f"{at}: label {text!r} is a number but the other labels are class names; "
                         "give label_names to list every class")
    if kinds["name"]:
        names = sorted({text for _, _, text in parsed})  # sorted: the same ids for every split
        _check_case(names, parsed, where)
        if len(names) < 2 and num_labels is None:
            raise ValueError(f"{_file_of(where[0])}: every label is {names[0]!r}: a classifier needs two or "
                             "more classes; give label_names or num_labels")
        if num_labels is not None and len(names) != num_labels:
            raise ValueError(f"{_file_of(where[0])}: {len(names)} class names {names[:10]} but "
                             f"num_labels={num_labels}; give label_names (in id order) to fix the classes")
        index = {name: i for i, name in enumerate(names)}
        return [index[text] for _, _, text in parsed], names
    fractional = [(at, text) for (kind, value, text), at in zip(parsed, where) if not float(value).is_integer()]
    if not fractional:
        return _class_ids(parsed, where, num_labels), None
    at, text = fractional[0]
    if num_labels is not None:
        raise ValueError(f"{at}: label {text!r} is fractional but num_labels={num_labels} asks for class ids; "
                         "set num_labels=1 for regression")
    if kinds["int"]:
        example = next(text for kind, _, text in parsed if kind == "int")
        raise ValueError(f"{at}: label {text!r} is fractional but the other labels are integer classes "
                         f"(such as {example}); set num_labels=1 for regression")
    return [float(value) for _, value, _ in parsed], None


def check_single_labels(raw: Sequence[Any], where: Sequence[str], column: Column,
                        label_names: Sequence[str] | None = None) -> None:
    """Refuse a column of label lists where one label per row is asked for (`multi_label=False`):
    a JSON list, or labels that hold a list delimiter (`,` `;` `|`) in most rows ("price,quality").
    Read as classes, every combination of labels would become a class of its own, trained without
    a word. A label that is one of `label_names` is a class, whatever it holds; a blank label
    beside rows of lists is a row of none of the labels, which only label sets read."""
    what = (f"several labels per row, but {setting('classification.multi_label', False)} reads one label per row "
            "and each combination would become a class of its own: leave out multi_label to read them as label "
            "sets (multi-label classification), or give each row one label")
    for value, at in zip(raw, where):
        if isinstance(value, list):
            raise ValueError(f"{at}: column {column!r} holds a JSON list of labels ({_json_text(value)}): {what}")
    names = {str(n) for n in label_names or ()}
    labels = [(value.strip(), at) for value, at in zip(raw, where) if isinstance(value, str)]
    for delimiter in LIST_DELIMITERS:
        listed = [(text, at) for text, at in labels if delimiter in text and text not in names
                  and all(part.strip() for part in text.split(delimiter)) and not _DECIMAL_COMMA.fullmatch(text)]
        if 2 * len(listed) > len(raw):
            text, at = listed[0]
            raise ValueError(f"{at}: column {column!r} holds lists of labels ({text!r}, separated by {delimiter!r}, "
                             f"in {len(listed):,} of {len(raw):,} rows): {what}")
        blank = next((at for text, at in labels if not text), None)
        if listed and blank is not None:  # a row with no label is one of a file of label sets
            raise ValueError(f"{blank}: empty label, and other rows hold lists of labels ({listed[0][0]!r}, in "
                             f"{len(listed):,} of {len(raw):,} rows): "
                             f"to read them as label sets, a blank one meaning none of the labels, set "
                             f"{setting('classification.multi_label', True)}")


def _json_text(value: Any, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 3] + "..."


def _text(value: Any, at: str, column: Column) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{at}: column {column!r} holds {'null' if value is None else type(value).__name__}, "
                         "expected a text")
    return value


def read_classification_file(path: str | Path, text_column: Column = "sentence",
                             label_column: Column | None = "label",
                             text_pair_column: Column | None = None, delimiter: str | None = None,
                             label_names: Sequence[str] | None = None, *, num_labels: int | None = None,
                             header: bool | None = None, where: Mapping[Any, Any] | None = None,
                             label_pattern: str | re.Pattern | None = None, encoding: str | None = None,
                             text: str | None = None, what: str = "classification file",
                             multi_label: bool | None = None, label_delimiter: str | None = None,
                             label_columns: Sequence[Column] | None = None) -> ClassificationData:
    """Read a classification / regression file into a :class:`ClassificationData` tuple.

    Any layout of :func:`bert_kit.data.tables.read_table` (``header``, ``delimiter``, ``where``;
    columns by name or 0-based index). Labels follow :func:`convert_labels` (``label_names``,
    ``num_labels``); pass the training split's names to read other splits with the same ids.
    ``label_pattern``: a regular expression with ``label`` and ``text`` groups that must match
    the whole text column, for labels written into the text (``__label__pos great film``); the
    label column is then not read. ``label_column=None`` reads texts only (a text that does not
    match ``label_pattern`` is then kept whole). ``encoding``: the file's codec (default UTF-8);
    ``text``: the file's text when it was read already; ``what``: how errors name the file. Errors
    name the file and line.

    Label sets (multi-label, `bert_kit.data.label_sets`): ``label_columns`` reads one 0/1 column per
    label (their names are the labels', unless ``label_names``); else ``multi_label`` True reads
    the label column as sets (items between ``label_delimiter``s, default ","), None as sets where
    they are detected, False never. The data's ``labels`` are then each row's sorted label ids.
    """
    pattern = re.compile(label_pattern) if isinstance(label_pattern, str) else label_pattern
    labelled = label_column is not None
    if text is None:
        text = read_text(path, what, encoding)
    columns = [text_column] + ([text_pair_column] if text_pair_column is not None else [])
    if table_layout(path, text, delimiter, header, columns + [label_column] + list(where or {})) == "lines":
        # a .txt file of one text per line: the whole line is the text
        columns_hint = "; for a .txt file of columns, " + separator_hint(first_line(text))
        if "\t" in first_line(text):
            columns_hint = (f"; its first line holds tabs but names no column asked for (columns are read from a "
                            f".txt file whose first line names them): check the names, or set "
                            f"{setting('header', False)} and give 0-based indices")
        if text_pair_column is not None:
            raise ValueError(f"{path}: a .txt file holds one text per line, no second text; "
                             "use a TSV/CSV/JSONL file for pairs" + columns_hint)
        if labelled and pattern is None:
            raise ValueError(f"{path}: a .txt file holds one text per line and no label column; set "
                             f"{setting('label_pattern')} to read labels written into the text, or use a "
                             "TSV/CSV/JSONL file" + columns_hint)
        text_column = 0
        columns = [0]
    if labelled and pattern is None:
        columns.extend(label_columns or [label_column])
    width = len(label_columns) if labelled and pattern is None and label_columns else 1  # values of the labels
    with no_garbage_collection():  # many small objects, no cycles: see no_garbage_collection
        rows = read_table(path, columns, header=header, delimiter=delimiter, where=where, what=what, text=text)
        texts, pairs, raw_labels, lines = [], [], [], []
        for at, values in rows:
            text = _text(values[0], at, text_column)
            if pattern is not None:
                match = pattern.fullmatch(text)
                if match is None and labelled:
                    raise ValueError(f"{at}: text {text[:60]!r} does not match label_pattern {pattern.pattern!r}")
                if match is not None:
                    text = match["text"]
                    raw_labels.append(match["label"])
            elif labelled:
                raw_labels.append(values[-width:] if width > 1 else values[-1])
            texts.append(text)
            if text_pair_column is not None:
                pairs.append(_text(values[1], at, text_pair_column))
            lines.append(at)
        pairs = pairs if text_pair_column is not None else None
        if width > 1:  # one 0/1 column per label
            sets = column_sets(raw_labels, lines, label_columns)
            names = list(label_names) if label_names is not None else [str(c) for c in label_columns]
            return ClassificationData(texts, sets, pairs, names, lines, multi_label=True)
        column = "label_pattern" if pattern is not None else label_column
        if labelled and num_labels != 1 and multi_label is not False:  # scores are numbers, never lists
            delimiter, why = detect(raw_labels, label_delimiter, label_names)
            if delimiter is not None or multi_label:
                sets = split_sets(raw_labels, lines, delimiter or label_delimiter or ",")
                labels, names = convert_sets(sets, lines, label_names, num_labels)
                return ClassificationData(texts, labels, pairs, names, lines, True, "" if multi_label else why)
        if labelled and num_labels != 1:
            check_single_labels(raw_labels, lines, column, label_names)
        labels, names = convert_labels(raw_labels, lines, label_names, num_labels) if labelled else (None, None)
    return ClassificationData(texts, labels, pairs, names, lines)


def tokenless(texts: Sequence[str], tokenizer: Any = None) -> list[int]:
    """Indices of the texts that give the model no token: blank ones, and those made only of what
    the tokenizer's cleaning drops (control and format characters, U+FFFD, lone accents).

    A text holding a letter, digit or underscore always gives a token; the few others are
    tokenized to find out (without a tokenizer: those of whitespace and control characters only)."""
    candidates = [i for i, t in enumerate(texts) if _WORD.search(t) is None]
    if not candidates:
        return []
    if tokenizer is None:
        return [i for i in candidates if all(c.isspace() or c == "\ufffd" or unicodedata.category(c)[0] == "C"
                                             for c in texts[i])]
    ids = tokenizer([texts[i] for i in candidates], max_length=3, padding=False, truncation=True,
                    return_tensors=None)["input_ids"]
    return [i for i, row in zip(candidates, ids) if len(row) <= 2]  # [CLS] [SEP] and nothing between


class FirstTextTooLongError(ValueError):
    """A pair whose first text leaves its windows no room for the second; `index`: the pair's (0-based)."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


def _check_window_room(tokenizer, texts: list[str], max_length: int, stride: int) -> None:
    """Windows of pairs run over the second text, the first whole in each: the first text must leave
    more than `stride` tokens of a window to the second (else the tokenizer fails, naming no row)."""
    lengths = map(len, tokenizer(texts, padding=False, truncation=False, return_tensors=None)["input_ids"])
    for i, n in enumerate(lengths):
        room = max_length - n - 1  # n counts [CLS] and [SEP]; the second text ends with [SEP]
        if room <= stride:
            raise FirstTextTooLongError(
                f"pair {i + 1}: its first text holds {n - 2} tokens, which leaves {max(room, 0)} of a window of "
                f"max_length {max_length} to the second; windows (long_text: chunks) run over the second text "
                f"and need more than chunk_stride {stride}: raise max_length, lower chunk_stride or read the "
                f"pairs cut (long_text: truncate)", i)


class ClassificationDataset(Dataset):
    """Tokenized (text[, pair], label) examples; items are dicts of Python lists.

    Item keys: input_ids, token_type_ids, attention_mask (each a list of length T_i <=
    max_length) and labels (an int, a float for regression, or for a label set a list of C
    floats, 1.0 for each label of the text) when labels were given. `truncated` says which texts
    (pairs) were longer than max_length and cut (`bert_kit.data.truncation`).

    stride: windows instead of truncation (long_text: chunks): every window of max_length tokens
    over a long text (of a pair: over the second text), consecutive ones sharing `stride` tokens,
    is an item with its text's label and `document`, the text's index; `windows` counts each
    text's. Nothing is then cut.
    """

    def __init__(self, texts: Sequence[str], labels: Sequence[int] | Sequence[float] | Sequence[list] | None,
                 tokenizer, max_length: int = 128, text_pairs: Sequence[str] | None = None,
                 stride: int | None = None):
        texts = list(texts)
        if labels is not None and len(labels) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text_pairs")
        self.labels = None if labels is None else list(labels)
        self.pad_token_id = getattr(tokenizer, "pad_token_id", 0)
        windows = {} if stride is None else {"stride": stride, "return_overflowing_tokens": True}
        if texts and stride is not None and text_pairs is not None:
            _check_window_room(tokenizer, texts, max_length, stride)
        if texts:
            enc = tokenizer(texts, None if text_pairs is None else list(text_pairs),
                            max_length=max_length, padding=False, truncation=True,
                            return_tensors=None, **windows)
        else:
            enc = {"input_ids": [], "token_type_ids": [], "attention_mask": [], "overflow_to_sample_mapping": []}
        self.encodings = {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
        # the text of each item (one item per text, or per window)
        self.document = enc["overflow_to_sample_mapping"] if stride is not None else None
        self.windows = (np.bincount(self.document, minlength=len(texts)).tolist() if stride is not None
                        else [1] * len(texts))
        # what `truncated` needs, counted when asked for (the server's one-text datasets never ask)
        self._truncation_inputs = (tokenizer, texts, None if text_pairs is None else list(text_pairs), max_length)
        self._truncated: Truncated | None = None

    @property
    def truncated(self) -> Truncated:
        """The texts (pairs) longer than max_length, which were cut (`bert_kit.data.truncation`)."""
        if self._truncated is None and self.document is not None:  # windows: nothing is cut
            self._truncated = Truncated(len(self.windows), self._truncation_inputs[3])
        if self._truncated is None:
            tokenizer, texts, pairs, max_length = self._truncation_inputs
            kept = list(map(len, self.encodings["input_ids"]))
            self._truncated = find_truncated(tokenizer, texts, pairs, max_length, kept,
                                             "texts" if pairs is None else "pairs")
        return self._truncated

    def __len__(self) -> int:
        return len(self.encodings["input_ids"])

    def __getitem__(self, idx: int) -> dict[str, Any]:
        item = {k: v[idx] for k, v in self.encodings.items()}
        text = idx if self.document is None else self.document[idx]
        if self.labels is not None:
            item["labels"] = self.labels[text]
        if self.document is not None:
            item["document"] = text
        return item

    def collate(self, batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """:func:`pad_collate` with this tokenizer's pad id."""
        return pad_collate(batch, pad_token_id=self.pad_token_id)


def pad_collate(batch: list[dict[str, Any]], pad_token_id: int = 0, pad_to_multiple_of: int = 1) -> dict[str, torch.Tensor]:
    """Stack a list of items into tensors, padding sequences to the batch's longest.

    pad_to_multiple_of rounds that length up (e.g. 16), so a compiled model sees a handful of
    shapes instead of one per length and never recompiles after the first pass.

    Sequence fields (input_ids, token_type_ids, attention_mask and per-token labels) become
    (B, T) int64 tensors padded with the pad id / 0 / 0 / -100. Scalar labels become (B,)
    int64, or float32 when any label is a float (regression); label sets (lists of C floats,
    multi-label) (B, C) float32. Other keys with scalar ints (e.g. start_positions) become (B,)
    int64; non-numeric keys and `document` are left out.
    """
    if not batch:
        raise ValueError("cannot collate an empty batch")
    out: dict[str, torch.Tensor] = {}
    lengths = [len(item["input_ids"]) for item in batch]
    max_len = -(-max(lengths) // pad_to_multiple_of) * pad_to_multiple_of
    for key, value in batch[0].items():
        values = [item[key] for item in batch]
        if key in _NOT_BATCHED:
            continue
        if key == "labels" and isinstance(value, list) and value and isinstance(value[0], float):
            out[key] = torch.tensor(values, dtype=torch.float32)  # (B, C) label sets, 1.0 for each label
            continue
        if isinstance(value, (list, tuple)) or (isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 1):
            if key not in _PAD_VALUES:
                continue  # e.g. offset mappings: not a model input
            pad = pad_token_id if _PAD_VALUES[key] is None else _PAD_VALUES[key]
            out[key] = _pad_rows(values, lengths, max_len, pad)
        elif isinstance(value, (int, float)) or torch.is_tensor(value):
            is_float = any(isinstance(v, float) or (torch.is_tensor(v) and v.is_floating_point())
                           for v in values)
            out[key] = torch.tensor([float(v) if is_float else int(v) for v in values],
                                    dtype=torch.float32 if is_float else torch.long)
    return out


def _pad_rows(values: list, lengths: list[int], max_len: int, pad: int) -> torch.Tensor:
    """(B, max_len) int64 of the rows, each padded with `pad` on the right. Lists of ints are read
    in one pass (one tensor op per row would cost more than a small model's training step)."""
    if any(torch.is_tensor(v) for v in values):
        rows = torch.full((len(values), max_len), pad, dtype=torch.long)
        for i, v in enumerate(values):
            rows[i, : len(v)] = torch.as_tensor(v, dtype=torch.long)
        return rows
    flat = np.fromiter(itertools.chain.from_iterable(values), dtype=np.int64, count=sum(lengths))
    rows = np.full((len(values), max_len), pad, dtype=np.int64)
    rows[np.arange(max_len) < np.asarray(lengths)[:, None]] = flat  # row-major: each row's tokens in order
    return torch.from_numpy(rows)


def create_classification_dataloader(texts: Sequence[str], labels, tokenizer,
                                     batch_size: int = 32, max_length: int = 128,
                                     text_pairs: Sequence[str] | None = None,
                                     shuffle: bool = True, num_workers: int = 0,
                                     seed: int | None = None) -> DataLoader:
    """DataLoader of dynamically padded classification batches.

    Batches are dicts: input_ids, token_type_ids, attention_mask (B, T) int64 with T the
    longest row of the batch, and labels (B,) int64 (float32 for regression). ``seed`` fixes
    the shuffling order.
    """
    dataset = ClassificationDataset(texts, labels, tokenizer, max_length=max_length,
                                    text_pairs=text_pairs)
    generator = None
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
    collate: Callable = dataset.collate
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=collate,
                      num_workers=num_workers, generator=generator)
