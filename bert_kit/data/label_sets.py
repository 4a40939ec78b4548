"""Label sets: the labels of each text for multi-label classification, in the layouts files hold them.

| layout                          | a row's labels                              | as distributed by            |
| ------------------------------- | ------------------------------------------- | ---------------------------- |
| a JSON list (JSON Lines)        | `["joy", "anger"]`, `[8, 20]`, `[]`          |                              |
| a delimited text                | `joy,anger`, `8,20` (ids), `` (none)         | GoEmotions' TSVs              |
| one 0/1 column per label        | `anger: 0, joy: 1, ...` (`label_columns`)    | SemEval-2018 E-c, Jigsaw      |

A row with no label at all is valid: none of the labels applies. Items are label names, or label
ids 0..K-1 when they are integers (named by `label_names`, or a label-names file such as
GoEmotions' emotions.txt); duplicates within a row count once. `detect` says whether a label
column holds sets: JSON lists, delimited lists in most rows with a label, or lists whose every
item is also found alone as a row's label (`8,20` where `8` and `20` are labels of other rows).
Errors name the file and line.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

LIST_DELIMITERS = (",", ";", "|")  # what separates the labels of a row ("price,quality"), tried in this order
_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL_COMMA = re.compile(r"[+-]?\d*,\d+")  # "0,5": a number as some locales write it, not a list


def _listed(raw: Sequence[Any], delimiter: str, names: set[str]) -> list[int]:
    """Rows whose label is a text holding `delimiter` between non-empty parts (not a label name)."""
    return [i for i, value in enumerate(raw) if isinstance(value, str) and delimiter in value
            and value.strip() not in names and all(part.strip() for part in value.strip().split(delimiter))]


def detect(raw: Sequence[Any], delimiter: str | None = None, label_names: Sequence[str] | None = None
           ) -> tuple[str | None, str]:
    """(the delimiter of the label sets, why they are sets) where the raw labels of a column are
    label sets; (None, "") where they are single labels. JSON lists are sets whatever the
    delimiter; delimited texts are sets in most rows that hold a label (numbers such as "0,5"
    aside), or in fewer where every part of every list is a label found alone in another row."""
    names = {str(n) for n in label_names or ()}
    if any(isinstance(value, list) for value in raw):
        return delimiter or ",", "the labels are JSON lists"
    alone = {value.strip() for value in raw if isinstance(value, str)} | {str(v) for v in raw if type(v) is int}
    labelled = sum(not (isinstance(value, str) and not value.strip()) for value in raw)  # a blank field: no label
    for d in [delimiter] if delimiter else LIST_DELIMITERS:
        listed = _listed(raw, d, names)
        if not listed:
            continue
        plain = [i for i in listed if not (d == "," and _DECIMAL_COMMA.fullmatch(raw[i].strip()))]
        if 2 * len(plain) > labelled:
            return d, f"{len(listed):,} of {len(raw):,} rows hold lists separated by {d!r}"
        if all(part.strip() in alone for i in listed for part in raw[i].split(d)):
            return d, (f"{len(listed):,} of {len(raw):,} rows hold lists separated by {d!r} of labels that other "
                       "rows hold alone")
    return None, ""


def split_sets(raw: Sequence[Any], where: Sequence[str], delimiter: str) -> list[list[Any]]:
    """Each row's items: a JSON list's, a text's parts between `delimiter`s (a blank text: none), or
    a one-item set of a lone JSON number."""
    sets = []
    for value, at in zip(raw, where):
        if isinstance(value, list):
            items = value
        elif isinstance(value, str):
            text = value.strip()
            items = [part.strip() for part in text.split(delimiter)] if text else []
            if any(not item for item in items):
                raise ValueError(f"{at}: label list {value!r} holds an empty label between {delimiter!r}s")
        elif value is None:
            raise ValueError(f"{at}: labels are null (missing); write [] (or an empty field) for a text without labels")
        else:
            items = [value]
        sets.append(items)
    return sets


def _item(item: Any, at: str) -> tuple[str, Any]:
    """("id", int) or ("name", str) of one item of a set."""
    if isinstance(item, bool) or item is None or isinstance(item, (list, dict)):
        raise ValueError(f"{at}: label {json.dumps(item)} in a label list: expected a label name or an integer id")
    if isinstance(item, int):
        return "id", item
    if isinstance(item, float):
        if not item.is_integer():
            raise ValueError(f"{at}: label {item} in a label list is fractional: expected a label name or an id")
        return "id", int(item)
    text = str(item).strip()
    return ("id", int(text)) if _INTEGER.fullmatch(text) else ("name", text)


def convert_sets(sets: Sequence[Sequence[Any]], where: Sequence[str], label_names: Sequence[str] | None = None,
                 num_labels: int | None = None) -> tuple[list[list[int]], list[str] | None]:
    """Items of each row -> (sorted label ids of each row, the label names or None).

    With `label_names` an item is one of the names or an id 0..K-1; else all names (their sorted
    list numbers them: the same ids for every split) or all integer ids (0..num_labels-1 when it is
    given; else up to the largest seen). A name among ids, an id out of range, or two names that
    differ only in case is an error naming the line."""
    index = {str(n): i for i, n in enumerate(label_names)} if label_names is not None else None
    parsed = [[_item(item, at) for item in items] for items, at in zip(sets, where)]
    if index is not None:
        out = []
        for row, at in zip(parsed, where):
            ids = set()
            for kind, value in row:
                if str(value) in index:
                    ids.add(index[str(value)])
                elif kind == "id" and 0 <= value < len(index):
                    ids.add(value)
                else:
                    raise ValueError(f"{at}: label {value!r} is not one of label_names {list(label_names)[:8]}"
                                     f"{' ...' if len(index) > 8 else ''} nor an id 0..{len(index) - 1}")
            out.append(sorted(ids))
        return out, list(label_names)
    kinds = {kind for row in parsed for kind, _ in row}
    if kinds == {"id", "name"}:
        at, value = next((at, v) for row, at in zip(parsed, where) for kind, v in row if kind == "name")
        raise ValueError(f"{at}: label {value!r} is a name but other labels are ids; give label_names (or "
                         "classification.label_names_file) to name the ids")
    if kinds == {"name"}:
        names = sorted({v for row in parsed for _, v in row})
        folded: dict[str, str] = {}
        for name in names:
            if name.casefold() in folded:
                at = next(at for row, at in zip(parsed, where) if any(v == name for _, v in row))
                raise ValueError(f"{at}: label {name!r} differs from label {folded[name.casefold()]!r} only in case, "
                                 "so they would be two labels; write one spelling")
            folded[name.casefold()] = name
        if num_labels is not None and len(names) != num_labels:
            raise ValueError(f"{where[0].rsplit(':', 1)[0]}: {len(names)} label names {names[:10]} but "
                             f"num_labels={num_labels}; give label_names (in id order) to fix the labels")
        ids = {name: i for i, name in enumerate(names)}
        return [sorted({ids[v] for _, v in row}) for row in parsed], names
    for row, at in zip(parsed, where):
        for _, value in row:
            if value < 0 or (num_labels is not None and value >= num_labels):
                top = f"0..{num_labels - 1}" if num_labels is not None else "0 up"
                raise ValueError(f"{at}: label id {value} is outside the label ids {top}")
    return [sorted({v for _, v in row}) for row in parsed], None


def column_sets(rows: Sequence[Sequence[Any]], where: Sequence[str], columns: Sequence[Any]) -> list[list[int]]:
    """The labels of each row of one 0/1 column per label: the indices of its columns that hold 1
    (1, "1", true, 1.0); 0 for the others. Anything else is an error naming the line and column
    (Jigsaw's test labels mark unscored rows -1: leave those rows out)."""
    sets = []
    for values, at in zip(rows, where):
        ids = []
        for j, (value, column) in enumerate(zip(values, columns)):
            text = value.strip() if isinstance(value, str) else value
            if text in (1, "1", True, 1.0, "1.0", "true", "True"):
                ids.append(j)
            elif text not in (0, "0", False, 0.0, "0.0", "false", "False"):
                shown = text if isinstance(text, str) and text else json.dumps(value)
                raise ValueError(f"{at}: label column {column!r} holds {shown}: each label column holds 1 (the label "
                                 "applies) or 0")
        sets.append(ids)
    return sets
