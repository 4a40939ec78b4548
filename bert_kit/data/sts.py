"""Semantic textual similarity data: STS-B and any pair file, regression loader, scoring.

The STS-B release files (``sts-{train,dev,test}.csv``) are tab separated without a header:
``genre  filename  year  id  score  sentence1  sentence2`` and, on some rows, two trailing
source notes. Sentences contain literal ``"`` characters, so lines are split on tabs only (a
CSV parser would treat those quotes as field delimiters and merge rows). Scores are in [0, 5].
:func:`read_sts` reads that layout (and GLUE's copy with a header); :func:`read_pair_file`
reads any other pair file, in any layout of `bert_kit.data.tables`, with named (or numbered)
columns and a declared score range, e.g. [1, 5]. A score outside its range is an error naming
the file and line, not a silently stretched target.

Fine-tuning STS-B is regression on sentence pairs: :func:`create_sts_dataloader` reuses the
classification pipeline with float labels, and the model is scored by Pearson / Spearman
correlation between predicted and gold scores.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from torch.utils.data import DataLoader

from bert_kit.data import read_text, setting, split_lines
from bert_kit.data.classification import create_classification_dataloader
from bert_kit.data.tables import Column, read_table
from bert_kit.metrics import pearson, spearman

SCORE_COLUMN, SENTENCE1_COLUMN, SENTENCE2_COLUMN = 4, 5, 6  # 0-based field indices
MAX_SCORE = 5.0
STS_RANGE = (0.0, 5.0)


def check_score(value: Any, at: str, score_range: Sequence[float] = STS_RANGE) -> float:
    """A gold similarity score as a float: a finite number inside `score_range` ([low, high])."""
    if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float)):
        raise ValueError(f"{at}: score {value!r} is not a number")
    try:
        score = float(value)
    except ValueError:
        raise ValueError(f"{at}: score {value!r} is not a number") from None
    if not math.isfinite(score):
        raise ValueError(f"{at}: score {value!r} is not finite")
    low, high = score_range
    if not low <= score <= high:
        raise ValueError(f"{at}: score {value!r} is outside the score range [{low:g}, {high:g}]; "
                         f"declare the file's range with {setting('score_range', ['LOW', 'HIGH'])}")
    return score


def read_sts(path: str | Path, score_range: Sequence[float] = STS_RANGE, encoding: str | None = None,
             text: str | None = None, lines: list[str] | None = None,
             what: str = "STS file") -> tuple[list[str], list[str], list[float]]:
    """Read an STS-B file into (sentences1, sentences2, scores).

    Reads the original release (no header, fields after the 7th ignored) and, when the first
    line is a header naming ``sentence1``, ``sentence2`` and ``score``, the GLUE copy of STS-B.
    A row with too few fields or a score that is not a finite number in ``score_range`` raises
    ValueError naming the file and the line. ``encoding``: the file's codec (default UTF-8);
    ``text``: the file's text when it was read already; ``lines``: a list that receives the
    "file:line" of each pair; ``what``: how errors name the file ("STS file (validation_file)").
    """
    path = Path(path)
    columns = (SCORE_COLUMN, SENTENCE1_COLUMN, SENTENCE2_COLUMN)
    sentences1, sentences2, scores = [], [], []
    if text is None:
        text = read_text(path, what, encoding)
    for i, line in enumerate(split_lines(text), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if i == 1 and {"sentence1", "sentence2", "score"} <= set(fields):
            # GLUE layout: index genre filename year old_index source1 source2 sentence1 ...
            columns = tuple(fields.index(c) for c in ("score", "sentence1", "sentence2"))
            continue
        score_col, s1_col, s2_col = columns
        if len(fields) <= max(columns):
            raise ValueError(f"{path}:{i}: expected at least {max(columns) + 1} "
                             f"tab-separated fields, got {len(fields)}")
        try:
            float(fields[score_col])
        except ValueError:
            raise ValueError(f"{path}:{i}: score {fields[score_col]!r} (field {score_col + 1}) is not a number") from None
        scores.append(check_score(fields[score_col], f"{path}:{i}", score_range))
        sentences1.append(fields[s1_col])
        sentences2.append(fields[s2_col])
        if lines is not None:
            lines.append(f"{path}:{i}")
    if not scores:
        raise ValueError(f"{path}: no sentence pairs (the file is empty)")
    return sentences1, sentences2, scores


def read_pair_file(path: str | Path, sentence1_column: Column, sentence2_column: Column,
                   score_column: Column | None, score_range: Sequence[float] = STS_RANGE,
                   header: bool | None = None, delimiter: str | None = None,
                   where: Mapping[Any, Any] | None = None, encoding: str | None = None, text: str | None = None,
                   lines: list[str] | None = None,
                   what: str = "sentence-pair file") -> tuple[list[str], list[str], list[float] | None]:
    """(sentences1, sentences2, scores) of any pair file (see `bert_kit.data.tables.read_table`).

    Columns by name or 0-based index; ``score_column=None`` reads the pairs only (scores None).
    Every score must be a finite number in ``score_range``; errors name the file and line.
    ``encoding``, ``text``, ``lines`` and ``what`` as for :func:`read_sts`.
    """
    columns = [sentence1_column, sentence2_column] + ([score_column] if score_column is not None else [])
    rows = read_table(path, columns, header=header, delimiter=delimiter, where=where, what=what,
                      encoding=encoding, text=text)
    s1, s2, scores = [], [], []
    for at, values in rows:
        for value, column in zip(values[:2], columns):
            if not isinstance(value, str):
                raise ValueError(f"{at}: column {column!r} holds {type(value).__name__}, expected a sentence")
        s1.append(values[0])
        s2.append(values[1])
        if lines is not None:
            lines.append(at)
        if score_column is not None:
            scores.append(check_score(values[2], at, score_range))
    return s1, s2, scores if score_column is not None else None


def create_sts_dataloader(path_or_data, tokenizer, batch_size: int = 32, max_length: int = 128,
                          shuffle: bool = True, normalize: bool = False) -> DataLoader:
    """Sentence-pair regression loader for an STS-B file or a (s1, s2, scores) tuple.

    Batches: input_ids, token_type_ids, attention_mask (B, T) int64 for ``[CLS] s1 [SEP] s2
    [SEP]`` and labels (B,) float32 (scores divided by 5 when ``normalize``).
    """
    if isinstance(path_or_data, (str, Path)):
        s1, s2, scores = read_sts(path_or_data)
    else:
        s1, s2, scores = path_or_data
    # float labels make the collate emit float32 targets: the regression (MSE) path
    labels = [float(s) / MAX_SCORE if normalize else float(s) for s in scores]
    return create_classification_dataloader(s1, labels, tokenizer, batch_size=batch_size,
                                            max_length=max_length, text_pairs=s2,
                                            shuffle=shuffle)


def evaluate_sts_predictions(predicted: Sequence[float], gold: Sequence[float]
                             ) -> dict[str, float]:
    """Pearson and Spearman correlation of predicted vs gold scores (any common scale)."""
    pred = np.asarray(predicted, dtype=np.float64)
    ref = np.asarray(gold, dtype=np.float64)
    if pred.shape != ref.shape:
        raise ValueError(f"{pred.shape[0]} predictions but {ref.shape[0]} gold scores")
    return {"pearson": pearson(pred, ref), "spearman": spearman(pred, ref)}


def cosine_similarity_scores(embeddings1, embeddings2) -> np.ndarray:
    """Row-wise cosine similarity (N,) of two embedding matrices (N, H), e.g. mean-pooled
    sentence vectors; the zero-shot STS score of a sentence encoder."""
    a = np.asarray(embeddings1, dtype=np.float64)
    b = np.asarray(embeddings2, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"expected two (N, H) matrices of equal shape, got {a.shape} and {b.shape}")
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    # a zero vector (e.g. an all-padding row) scores 0 instead of NaN
    return np.einsum("nh,nh->n", a, b) / np.maximum(norms, 1e-12)
