"""Data: pretraining corpora and masking, and the fine-tuning task readers.

pretraining: corpus.py (readers, token cache, streaming), masking.py (MLM masking and collator),
pretraining.py (MLM / NSP datasets, resumable samplers, loaders).
tasks: classification.py, ner.py, squad.py, sts.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator


def parse_jsonl(lines: Iterable[str], path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) for each non-blank line of a JSON Lines file (an open file or
    a list of lines); bad JSON raises ValueError naming `path` and the line."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
        yield lineno, value


def read_lines(path: str | Path) -> list[str]:
    """One text per line; line i of the file is row i of the output (blank lines included)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines:
        raise ValueError(f"{path}: no lines to embed")
    return lines
