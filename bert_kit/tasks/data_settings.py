"""Checks of the data settings of a fine-tuning run, called by `FinetuneConfig.__post_init__`.

Each bad value stops the run before anything is read, with an error that names the key, the
value and what is allowed: a column given as "2" on the command line would be looked
up as a header name. Columns are normalised here to an int index or a name. Every file the
run names (train_file, validation_file, a tokenizer folder) must exist before the model loads:
`train_file=mydata/trian.csv: file not found (did you mean mydata/train.csv?)`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bert_kit.checks import ConfigError, InputNotFoundError, check_input_path
from bert_kit.data import check_encoding
from bert_kit.data.tables import column_ref

TABLE_TASKS = ("classification", "similarity", "embedding", "reranker")  # tasks whose files are tables
RETRIEVAL_TASKS = ("embedding", "reranker")  # tasks that also read a BEIR folder as train_file or validation_file
_DELIMITER_NAMES = {"\\t": "\t", "tab": "\t", "comma": ",", "semicolon": ";", "pipe": "|"}


def _check_where(name: str, where: Any) -> dict | None:
    """{column: value or [values]} with columns normalised; None stays None."""
    if where is None:
        return None
    if not isinstance(where, dict) or not where:
        raise ConfigError(f"{name} must be a mapping of column to value, e.g. {{split: train}}, got {where!r}")
    out = {}
    for column, value in where.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if not values or not all(isinstance(v, (str, int, float, bool)) for v in values):
            raise ConfigError(f"{name}: the value of {column!r} must be a value or a list of values, got {value!r}")
        out[column_ref(column, f"{name} key")] = value
    return out


def check_tokenizer_setting(value: str | None) -> None:
    """`tokenizer` names a folder or file that exists, or a hub name with a local copy."""
    from bert_kit.model_folder import TOKENIZER_FILES, find_local_model, is_hub_name, missing_model_message

    if not value or Path(value).exists():
        return
    if not is_hub_name(value):
        check_input_path("tokenizer", value, folder_ok=True)
    elif find_local_model(value, TOKENIZER_FILES) is None:
        raise InputNotFoundError(f"tokenizer={value}: {missing_model_message(value, 'tokenizer')}")


def check_data_settings(cfg: Any) -> None:
    """Validate and normalise (in place) the data fields of a `FinetuneConfig` (the counts and
    label_names were checked by its rules already)."""
    if cfg.label_names is not None:
        names = [str(n) for n in cfg.label_names]
        if len(names) < 2:
            raise ConfigError(f"label_names must name two or more classes, got {names} "
                              "(for regression set num_labels=1 without label_names)")
        cfg.label_names = names

    cfg.text_column = column_ref(cfg.text_column, "text_column")
    cfg.label_column = column_ref(cfg.label_column, "label_column")
    if cfg.text_pair_column is not None:
        cfg.text_pair_column = column_ref(cfg.text_pair_column, "text_pair_column")
        if cfg.text_pair_column == cfg.text_column:
            raise ConfigError(f"text_pair_column and text_column are both {cfg.text_column!r}")
    if cfg.label_pattern is None and cfg.label_column in (cfg.text_column, cfg.text_pair_column):
        raise ConfigError(f"label_column {cfg.label_column!r} is also a text column")
    if cfg.delimiter is not None:
        cfg.delimiter = _DELIMITER_NAMES.get(cfg.delimiter, cfg.delimiter)
        if len(cfg.delimiter) != 1 or cfg.delimiter in "\r\n\"":
            raise ConfigError(f"delimiter must be one character (or tab, comma, semicolon, pipe), got {cfg.delimiter!r}")
    cfg.encoding = check_encoding(cfg.encoding)
    cfg.where = _check_where("where", cfg.where)
    cfg.validation_where = _check_where("validation_where", cfg.validation_where)
    if (cfg.where or cfg.validation_where) and cfg.task not in TABLE_TASKS:
        raise ConfigError(f"where / validation_where filter the rows of TSV/CSV/JSONL files (tasks {TABLE_TASKS}); "
                         f"task {cfg.task} does not read tables")
    if (cfg.where or cfg.validation_where) and cfg.task == "similarity" and cfg.text_pair_column is None:
        raise ConfigError("where / validation_where on a similarity file need its columns: set text_column, "
                         "text_pair_column and label_column (the score)")
    if cfg.label_pattern is not None:
        try:
            pattern = re.compile(cfg.label_pattern)
        except re.error as e:
            raise ConfigError(f"label_pattern {cfg.label_pattern!r} is not a regular expression: {e}") from None
        missing = [g for g in ("label", "text") if g not in pattern.groupindex]
        if missing:
            raise ConfigError(f"label_pattern {cfg.label_pattern!r} has no group named {missing[0]!r}: write "
                             "(?P<label>...) and (?P<text>...)")
        if cfg.task != "classification":
            raise ConfigError(f"label_pattern reads labels of classification files; task {cfg.task} has no such labels")
    # last: a run config with a wrong value and a missing file names the value first
    for key in ("train_file", "validation_file"):
        if getattr(cfg, key):
            check_input_path(key, getattr(cfg, key), folder_ok=cfg.task in RETRIEVAL_TASKS)
    check_tokenizer_setting(cfg.tokenizer)
