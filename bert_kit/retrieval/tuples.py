"""Training data of retrieval models: text tuples for an embedding model, candidate lists for a reranker.

An embedding model trains on tuples (`read_tuples`): (anchor, positive) pairs, (anchor,
positive, negative) triplets or (anchor, positive, negative_1, ..., negative_n) n-tuples, from

| source                                  | how                                                           |
| --------------------------------------- | ------------------------------------------------------------- |
| a TSV/CSV/JSONL table                   | `columns` in order, by name or 0-based index (`data.tables`);  |
|                                         | default: every column of the header (JSONL: every key), so    |
|                                         | `bert-kit mine-negatives` output reads as written ("scores"   |
|                                         | and "label" left out)                                         |
| an NLI file (premise, hypothesis, label)| AllNLI's triplets: (premise, an entailed hypothesis, a         |
|                                         | contradicting one); labels as words or as HF's ids 0/1/2      |
| a BEIR folder                           | (query, relevant document) pairs of its qrels/`split`.tsv      |

A reranker trains on a query's candidates with a relevance label each (`read_groups`): rows
(query, passage, label) of a table, grouped by query; a tuple file (the positive labelled 1, the
negatives 0, rows of one (anchor, positive) merged); or a BEIR folder's judged documents (their
grades as labels) with `negatives` documents drawn at random from the corpus (seeded) per query,
or, to train, one group per relevant document (`per_positive`: it, the documents judged 0 and drawn
negatives), so that a query with 40 relevant documents is 40 lists of one positive each.
Every source records "file:line" of its rows (a BEIR folder: the query's first judgment) for errors.
"""

from __future__ import annotations

import csv
import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from bert_kit.data import read_text
from bert_kit.data.tables import Column, first_line, layout_of, read_table, table_layout

NLI_COLUMNS = ("premise", "hypothesis", "label")
NLI_LABELS = {"entailment": "entailment", "contradiction": "contradiction", "neutral": "neutral",
              "0": "entailment", "1": "neutral", "2": "contradiction"}  # HF's snli/mnli ids
NOT_TEXT = ("scores", "score", "label", "labels")  # columns a tuple file may hold besides its texts


@dataclass
class Tuples:
    """Texts by column: columns[0] the anchors, [1] the positives, [2:] negatives; `lines` the
    "file:line" of each row; `names` the columns' names; `source` how they were read."""

    columns: list[list[str]]
    lines: list[str]
    names: list[str]
    source: str


@dataclass
class Groups:
    """A reranker's data: per query its candidate passages and their relevance labels."""

    queries: list[str]
    passages: list[list[str]]
    labels: list[list[float]]
    lines: list[str]  # "file:line" of each query's first row
    source: str = ""
    skipped: dict[str, int] = field(default_factory=dict)


def header_names(path: str | Path, text: str, delimiter: str | None, header: bool | None) -> list[str] | None:
    """The column names of a table: its first JSON record's keys, or its header line (unless
    header is false); None where the file has none (JSON arrays as records, header: false)."""
    if not text.strip():  # else taken for a file without names
        raise ValueError(f"{path}: no rows (the file is empty)")
    layout = layout_of(path, delimiter)
    if layout == "jsonl":
        try:
            record = json.loads(text) if text.lstrip().startswith("[") else json.loads(first_line(text))
        except ValueError:
            return None  # read_table names the bad line
        record = record[0] if isinstance(record, list) and record else record
        return list(record) if isinstance(record, dict) else None
    layout = table_layout(path, text, delimiter, header, ())
    if header is False or layout == "lines":
        return None
    head = first_line(text)
    fields = head.split("\t") if layout == "\t" else next(csv.reader(io.StringIO(head), delimiter=layout))
    return [f.strip() for f in fields]


def check_no_table_settings(folder: Path, split: str, columns: Sequence[Column] | None,
                            where: Mapping[Any, Any] | None) -> None:
    """Refuse columns or where given for a BEIR folder: they pick a table's columns and rows, and
    were ignored (the qrels' pairs read as if they had not been set)."""
    if columns is not None or where:
        given = f"columns {list(columns)}" if columns is not None else f"where {dict(where or {})}"
        raise ValueError(f"{folder} is a BEIR folder, read by its qrels/{split}.tsv: the setting {given} is for "
                         "a table file; leave it out")


def _texts(values: Sequence[Any], at: str, names: Sequence[Any]) -> list[str]:
    for value, name in zip(values, names):
        if not isinstance(value, str):
            raise ValueError(f"{at}: column {name!r} holds {type(value).__name__}, expected a text")
    return list(values)


def read_tuples(path: str | Path, columns: Sequence[Column] | None = None, header: bool | None = None,
                delimiter: str | None = None, where: Mapping[Any, Any] | None = None,
                encoding: str | None = None, split: str = "train") -> Tuples:
    """The (anchor, positive, negatives...) tuples of a table, an NLI file or a BEIR folder (see
    the module docstring); errors name the file and line."""
    path = Path(path)
    if path.is_dir():
        check_no_table_settings(path, split, columns, where)
        from bert_kit.retrieval.beir import read_beir
        from bert_kit.retrieval.mining import pairs_from_beir

        data = read_beir(path, split)
        anchors, positives = pairs_from_beir(data)
        return Tuples([anchors, positives], [f"{path}/qrels/{split}.tsv"] * len(anchors), ["query", "document"],
                      f"BEIR {path.name} {split}: {len(anchors)} (query, relevant document) pairs")
    text = read_text(path, "training tuples file", encoding)
    names = header_names(path, text, delimiter, header)
    if columns is None and names is not None and set(NLI_COLUMNS) <= set(names):
        return nli_triplets(path, text, header, delimiter, where, encoding)
    if columns is None:
        if names is None:
            raise ValueError(f"{path}: name the text columns (anchor, positive, negatives...) with "
                             "embedding.columns: the file has no header line or keys to read them from")
        columns = [n for n in names if n not in NOT_TEXT]
    if len(columns) < 2:
        raise ValueError(f"{path}: a training tuple needs two text columns or more (anchor, positive[, negatives]), "
                         f"got {list(columns)}")
    rows = read_table(path, list(columns), header, delimiter, where, "training tuples file", encoding, text)
    out: list[list[str]] = [[] for _ in columns]
    lines = []
    for at, values in rows:
        for column, value in zip(out, _texts(values, at, columns)):
            column.append(value)
        lines.append(at)
    return Tuples(out, lines, [str(c) for c in columns], f"{path.name}: {len(lines)} rows of {len(columns)} texts "
                                                          f"({', '.join(map(str, columns))})")


def nli_triplets(path: Path, text: str, header: bool | None, delimiter: str | None,
                 where: Mapping[Any, Any] | None, encoding: str | None) -> Tuples:
    """AllNLI's (premise, entailed hypothesis, contradicting hypothesis) triplets: for each premise
    with both, one triplet per entailed hypothesis, the contradicting ones taken in turn."""
    rows = read_table(path, list(NLI_COLUMNS), header, delimiter, where, "NLI file", encoding, text)
    found: dict[str, dict[str, list[str]]] = {}
    first: dict[str, str] = {}
    for at, (premise, hypothesis, label) in rows:
        _texts([premise, hypothesis], at, NLI_COLUMNS)
        kind = NLI_LABELS.get(str(label).strip().lower())
        if kind is None:
            raise ValueError(f"{at}: label {label!r} is not entailment, neutral or contradiction (nor 0, 1, 2)")
        hypotheses = found.setdefault(premise, {"entailment": [], "contradiction": [], "neutral": []})[kind]
        if hypothesis not in hypotheses:
            hypotheses.append(hypothesis)
        first.setdefault(premise, at)
    triplets: list[list[str]] = [[], [], []]
    lines = []
    for premise, kinds in found.items():
        against = kinds["contradiction"]
        for j, entailed in enumerate(kinds["entailment"] if against else []):
            for column, value in zip(triplets, (premise, entailed, against[j % len(against)])):
                column.append(value)
            lines.append(first[premise])
    if not lines:
        raise ValueError(f"{path}: no premise has both an entailed and a contradicting hypothesis: no triplet")
    return Tuples(triplets, lines, ["premise", "entailment", "contradiction"],
                  f"{path.name} (NLI): {len(lines)} (premise, entailment, contradiction) triplets from "
                  f"{len(rows)} pairs")


def read_groups(path: str | Path, columns: Sequence[Column] | None = None, header: bool | None = None,
                delimiter: str | None = None, where: Mapping[Any, Any] | None = None,
                encoding: str | None = None, split: str = "train", negatives: int = 7, seed: int = 0,
                per_positive: bool = False) -> Groups:
    """A reranker's (query, candidates, labels) groups (see the module docstring). columns: a
    table's (query, passage, label); default: those names, or a tuple file's anchor, positive,
    negatives when its header (keys) holds no label. per_positive: a BEIR folder's groups one per
    relevant document (`beir_groups`)."""
    path = Path(path)
    if path.is_dir():
        check_no_table_settings(path, split, columns, where)
        return beir_groups(path, split, negatives, seed, per_positive)
    text = read_text(path, "reranker data file", encoding)
    names = header_names(path, text, delimiter, header) or []
    labelled = columns is not None and len(columns) == 3 or columns is None and "label" in names
    if not labelled:  # a tuple file: the positive is relevant, the others are not
        tuples = read_tuples(path, columns, header, delimiter, where, encoding)
        groups: dict[tuple[str, str], list[str]] = {}
        at: dict[tuple[str, str], str] = {}
        for i, (anchor, positive) in enumerate(zip(tuples.columns[0], tuples.columns[1])):
            negs = groups.setdefault((anchor, positive), [])
            negs.extend(n for n in (c[i] for c in tuples.columns[2:]) if n not in negs and n != positive)
            at.setdefault((anchor, positive), tuples.lines[i])
        return Groups([a for a, _ in groups], [[p, *negs] for (_, p), negs in groups.items()],
                      [[1.0] + [0.0] * len(negs) for negs in groups.values()], list(at.values()),
                      f"{path.name}: {len(groups)} (query, positive, negatives) groups")
    columns = list(columns) if columns is not None else ["query", "passage", "label"]
    rows = read_table(path, columns, header, delimiter, where, "reranker data file", encoding, text)
    by_query: dict[str, tuple[list[str], list[float], str]] = {}
    for at_, (query, passage, label) in rows:
        _texts([query, passage], at_, columns)
        try:
            value = float(label)
        except (TypeError, ValueError):
            raise ValueError(f"{at_}: label {label!r} is not a number (a relevance: 0, 1, a grade, a probability)")
        passages, labels, _ = by_query.setdefault(query, ([], [], at_))
        passages.append(passage)
        labels.append(value)
    return Groups(list(by_query), [p for p, _, _ in by_query.values()], [lab for _, lab, _ in by_query.values()],
                  [a for _, _, a in by_query.values()], f"{path.name}: {len(rows)} (query, passage, label) rows, "
                                                        f"{len(by_query)} queries")


def beir_groups(folder: Path, split: str, negatives: int, seed: int, per_positive: bool = False) -> Groups:
    """Each judged query of a BEIR split with its judged documents (grades as labels) and `negatives`
    unjudged documents drawn from the corpus; per_positive: a group per relevant document instead
    (it, the query's documents judged 0, and negatives drawn for it), as for training."""
    from bert_kit.retrieval.beir import read_beir

    data = read_beir(folder, split)
    text = dict(zip(data.corpus_ids, data.corpus_texts))
    rng = random.Random(seed)
    queries, passages, labels, lines = [], [], [], []

    def drawn(judged: dict) -> list[str]:
        found: list[str] = []
        while len(found) < min(negatives, len(data.corpus_ids) - len(judged)):
            d = data.corpus_ids[rng.randrange(len(data.corpus_ids))]
            if d not in judged and d not in found:
                found.append(d)
        return found

    for q, judged in data.qrels.items():
        docs = [d for d in judged if d in text]
        relevant = [d for d in docs if judged[d] > 0]
        if not relevant:
            continue
        at = f"{folder}/qrels/{split}.tsv: query {q}"
        if per_positive:
            others = [d for d in docs if judged[d] <= 0]
            for d in relevant:
                negs = others + drawn(judged)
                queries.append(data.queries[q])
                passages.append([text[x] for x in [d, *negs]])
                labels.append([float(judged[d])] + [0.0] * len(negs))
                lines.append(at)
        else:
            negs = drawn(judged)
            queries.append(data.queries[q])
            passages.append([text[d] for d in docs + negs])
            labels.append([float(max(judged[d], 0)) for d in docs] + [0.0] * len(negs))
            lines.append(at)
    unit = "relevant document" if per_positive else "query"
    return Groups(queries, passages, labels, lines, f"BEIR {folder.name} {split}: {len(queries)} groups, one a {unit}, "
                                                    f"with the judged documents and {negatives} random negatives")
