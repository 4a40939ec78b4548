"""Environment variables in run settings: `${NAME}` and `${NAME:-default}` in string values,
expanded when a config is built (`runconfig.config_from_dict`); `${BERT_KIT_DATA}` is the data root.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Any

from bert_kit.checks import ConfigError, PlainText

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expand_variables(value: Any, where: str) -> Any:
    """`value` with `${NAME}` / `${NAME:-default}` replaced in every string (lists and dicts too).

    A default may itself hold variables (`${A:-${B:-c}}`), expanded only when it is used. An
    unset variable without a default, or a `${` that starts neither form, is a ConfigError
    naming `where`; `${BERT_KIT_DATA}` falls back to the default data root, and a path built on
    it must exist (FileNotFoundError that says where to get the data)."""
    from bert_kit.data.root import missing_data_message

    if isinstance(value, list):
        return [expand_variables(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: expand_variables(v, f"{where}.{k}") for k, v in value.items()}
    if not isinstance(value, str) or "${" not in value:
        return value
    used_root: list[bool] = []
    expanded = _expand(value, 0, len(value), value, where, used_root)
    if used_root:  # a data file: missing is an error worth explaining
        found = glob.glob(expanded) if any(c in expanded for c in "*?[") else Path(expanded).exists()
        if not found:
            raise FileNotFoundError(missing_data_message(expanded, where))
    return PlainText(expanded) if isinstance(value, PlainText) else expanded


def _expand(text: str, start: int, end: int, value: str, where: str, used_root: list[bool]) -> str:
    """text[start:end] with its variables replaced (`value`, the whole string, for messages)."""
    from bert_kit.data.root import DATA_ROOT_VARIABLE, data_root

    out = []
    i = start
    while (j := text.find("${", i, end)) >= 0:
        out.append(text[i:j])
        name = _NAME.match(text, j + 2, end)
        k = name.end() if name else j + 2
        if name and text.startswith("}", k, end):
            default, i = None, k + 1
        elif name and text.startswith(":-", k, end):
            close = _closing_brace(text, k + 2, end)
            if close is None:
                raise _malformed(value, where)
            default, i = (k + 2, close), close + 1
        else:
            raise _malformed(value, where)
        variable = name.group()
        if variable == DATA_ROOT_VARIABLE:
            used_root.append(True)
            out.append(str(data_root()))
        elif os.environ.get(variable) is not None:
            out.append(os.environ[variable])
        elif default is not None:
            out.append(_expand(text, *default, value, where, used_root))
        else:
            raise ConfigError(f"{where}: {value!r} names ${{{variable}}}, which is not set in the environment")
    out.append(text[i:end])
    return "".join(out)


def _closing_brace(text: str, start: int, end: int) -> int | None:
    """Index of the `}` that closes a `${` whose default starts at `start` (nested `${...}` skipped)."""
    depth, i = 0, start
    while i < end:
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return None


def _malformed(value: str, where: str) -> ConfigError:
    return ConfigError(f"{where}: {value!r} has a '${{' that is not a variable: write ${{NAME}} or ${{NAME:-default}}")
