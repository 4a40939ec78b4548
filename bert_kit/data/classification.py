"""Sequence classification data: file reader, dataset and a dynamically padded loader.

A file (TSV/CSV with a header, or JSON Lines) becomes texts, optional second texts and
labels; :class:`ClassificationDataset` tokenizes them once up front ([CLS] a [SEP] (b [SEP])),
and :func:`pad_collate` pads each batch only to its own longest row, which keeps short-sentence
tasks such as SST-2 cheap. Labels are ints for classification and floats for regression
(STS-B); the collate turns them into int64 / float32 tensors accordingly.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from bert_kit.data import parse_jsonl

# fields padded by pad_collate and the value each is padded with (None = the pad token id)
_PAD_VALUES = {"input_ids": None, "token_type_ids": 0, "attention_mask": 0, "labels": -100}


class ClassificationData(NamedTuple):
    """What :func:`read_classification_file` returns."""

    texts: list[str]
    labels: list[int] | list[float] | None  # None when no label column was asked for
    text_pairs: list[str] | None  # second sentences, None without a pair column
    label_names: list[str] | None  # names of label ids 0..K-1 when the file has string labels


def _convert_labels(raw: list[Any], where: list[str], label_names: Sequence[str] | None):
    """Turn raw label values into ints (all integral), floats, or ids of string names."""
    if label_names is not None:
        index = {name: i for i, name in enumerate(label_names)}
        out = []
        for value, loc in zip(raw, where):
            if str(value) not in index:
                raise ValueError(f"{loc}: label {value!r} is not one of {list(label_names)}")
            out.append(index[str(value)])
        return out, list(label_names)
    numbers = []
    for value in raw:
        if isinstance(value, bool) or value is None:
            numbers = None
            break
        try:
            numbers.append(float(value))
        except (TypeError, ValueError):
            numbers = None  # at least one non-numeric label: treat all as names
            break
    if numbers is not None:
        if all(x.is_integer() for x in numbers):
            return [int(x) for x in numbers], None
        return numbers, None
    # sorted names give the same ids for every split of a data set
    names = sorted({str(v) for v in raw})
    return _convert_labels(raw, where, names)


def _read_delimited(path: Path, delimiter: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and (line number, fields) rows of a TSV or CSV file."""
    with open(path, encoding="utf-8", newline="") as f:
        if delimiter == "\t":
            # GLUE-style TSV: quotes are literal characters, so split on tabs only
            lines = [(i, line.rstrip("\r\n").split("\t")) for i, line in enumerate(f, start=1)]
        else:
            reader = csv.reader(f, delimiter=delimiter)
            lines = []
            for fields in reader:
                lines.append((reader.line_num, fields))
    lines = [(i, fields) for i, fields in lines if fields and fields != [""]]  # skip blank lines
    if not lines:
        raise ValueError(f"{path}: file is empty (expected a header line)")
    header = lines[0][1]
    for i, fields in lines[1:]:
        if len(fields) != len(header):
            raise ValueError(f"{path}:{i}: row has {len(fields)} fields but the header has "
                             f"{len(header)} ({header})")
    return header, lines[1:]


def read_classification_file(path: str | Path, text_column: str = "sentence",
                             label_column: str | None = "label",
                             text_pair_column: str | None = None, delimiter: str | None = None,
                             label_names: Sequence[str] | None = None) -> ClassificationData:
    """Read a classification / regression file into a :class:`ClassificationData` tuple.

    Format by extension: ``.jsonl``/``.json`` -> JSON Lines (one object per line), ``.csv`` ->
    comma separated, anything else -> tab separated; ``delimiter`` overrides (TSV/CSV need a
    header line). Labels become ints when all are integral numbers, floats when numeric, and
    ids of ``label_names`` otherwise (names sorted unless given; pass the training split's
    names to read other splits with the same ids). ``label_column=None`` reads texts only.
    Errors name the file and line of a missing column, a bad row or bad JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"classification file not found: {path}")
    columns = [c for c in (text_column, label_column, text_pair_column) if c is not None]
    texts, pairs, raw_labels, where = [], [], [], []
    if delimiter is None and path.suffix.lower() in (".jsonl", ".json"):
        with open(path, encoding="utf-8") as f:
            for i, row in parse_jsonl(f, path):
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{i}: expected a JSON object, got {type(row).__name__}")
                for c in columns:
                    if c not in row:
                        raise KeyError(f"{path}:{i}: missing key {c!r} (keys: {sorted(row)})")
                texts.append(str(row[text_column]))
                if text_pair_column is not None:
                    pairs.append(str(row[text_pair_column]))
                if label_column is not None:
                    raw_labels.append(row[label_column])
                    where.append(f"{path}:{i}")
    else:
        if delimiter is None:
            delimiter = "," if path.suffix.lower() == ".csv" else "\t"
        header, rows = _read_delimited(path, delimiter)
        for c in columns:
            if c not in header:
                raise KeyError(f"{path}:1: header has no column {c!r} (columns: {header})")
        col = {name: header.index(name) for name in columns}
        for i, fields in rows:
            texts.append(fields[col[text_column]])
            if text_pair_column is not None:
                pairs.append(fields[col[text_pair_column]])
            if label_column is not None:
                value = fields[col[label_column]].strip()
                if not value:
                    raise ValueError(f"{path}:{i}: empty label in column {label_column!r}")
                raw_labels.append(value)
                where.append(f"{path}:{i}")
    labels, names = (None, None)
    if label_column is not None:
        labels, names = _convert_labels(raw_labels, where, label_names)
    return ClassificationData(texts, labels, pairs if text_pair_column is not None else None, names)


class ClassificationDataset(Dataset):
    """Tokenized (text[, pair], label) examples; items are dicts of Python lists.

    Item keys: input_ids, token_type_ids, attention_mask (each a list of length T_i <=
    max_length) and labels (an int, or a float for regression) when labels were given.
    """

    def __init__(self, texts: Sequence[str], labels: Sequence[int] | Sequence[float] | None,
                 tokenizer, max_length: int = 128, text_pairs: Sequence[str] | None = None):
        texts = list(texts)
        if labels is not None and len(labels) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text_pairs")
        self.labels = None if labels is None else list(labels)
        self.pad_token_id = getattr(tokenizer, "pad_token_id", 0)
        if texts:
            enc = tokenizer(texts, None if text_pairs is None else list(text_pairs),
                            max_length=max_length, padding=False, truncation=True,
                            return_tensors=None)
        else:
            enc = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
        self.encodings = {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}

    def __len__(self) -> int:
        return len(self.encodings["input_ids"])

    def __getitem__(self, idx: int) -> dict[str, Any]:
        item = {k: v[idx] for k, v in self.encodings.items()}
        if self.labels is not None:
            item["labels"] = self.labels[idx]
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
    int64, or float32 when any label is a float (regression). Other keys with scalar ints
    (e.g. start_positions) become (B,) int64; non-numeric keys are left out.
    """
    if not batch:
        raise ValueError("cannot collate an empty batch")
    out: dict[str, torch.Tensor] = {}
    lengths = [len(item["input_ids"]) for item in batch]
    max_len = -(-max(lengths) // pad_to_multiple_of) * pad_to_multiple_of
    for key, value in batch[0].items():
        values = [item[key] for item in batch]
        if isinstance(value, (list, tuple)) or (torch.is_tensor(value) and value.ndim == 1):
            if key not in _PAD_VALUES:
                continue  # e.g. offset mappings: not a model input
            pad = pad_token_id if _PAD_VALUES[key] is None else _PAD_VALUES[key]
            rows = torch.full((len(batch), max_len), pad, dtype=torch.long)
            for i, v in enumerate(values):
                rows[i, : len(v)] = torch.as_tensor(v, dtype=torch.long)
            out[key] = rows
        elif isinstance(value, (int, float)) or torch.is_tensor(value):
            is_float = any(isinstance(v, float) or (torch.is_tensor(v) and v.is_floating_point())
                           for v in values)
            out[key] = torch.tensor([float(v) if is_float else int(v) for v in values],
                                    dtype=torch.float32 if is_float else torch.long)
    return out


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
