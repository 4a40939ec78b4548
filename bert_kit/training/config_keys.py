"""The keys of a run config: groups of settings, the old keys that moved into them and other
names of a setting, and unknown keys named with the nearest valid one.

Settings that belong to one part of a run are grouped in a dataclass of their own, a field of
the run config (`qa: QASettings`, `is_group`, `settings_groups`). A config class that moved flat
keys into groups lists them in `MOVED` (`{"doc_stride": "qa.doc_stride"}`), and other names of
one setting in `ALIASES` (`{"metric_for_best": "metric"}`): `move_old_keys` puts them where they
belong, in files, overrides and saved run configs, with a one-line note for a moved key
(`note_moved`, printed once per process on rank 0); `accepts_moved_keys` lets Python callers
use them too. An unknown key is an `UnknownKeyError` with a hint (`did you mean epochs?`), also
for the names other tools give a setting (`learning_rate`, `num_train_epochs`).

`runconfig.py` reads, types and checks the values; this module knows only the keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import sys
import typing
import warnings
from typing import Any, TypeVar

from bert_kit.checks import ConfigError, resolve_plain

T = TypeVar("T")


def _shown(value: Any, limit: int = 80) -> str:
    """repr(value), cut in the middle when long (a 5,000-digit number); plain text that reads as a
    number is shown as one (`got 1.5`, `got 'ten'`)."""
    text = repr(resolve_plain(value))
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 4:]} ({len(text)} characters)"


def is_group(tp: Any) -> bool:
    """Whether a field's type is a group of settings (a dataclass)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def settings_groups(cls: type) -> dict[str, type]:
    """{field: its dataclass} of the fields of `cls` that group settings (`qa: QASettings`)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if is_group(hints[f.name])}


def moved_keys(cls: type) -> dict[str, str]:
    """{old flat key: "group.key"} of the settings `cls` moved into groups, and {alias: "key"} of
    its `ALIASES`: other names of one setting (`metric_for_best: metric`), taken without a note."""
    return {**getattr(cls, "MOVED", {}), **getattr(cls, "ALIASES", {})}


_noted: set[str] = set()  # the notes this process printed (a glue sweep builds many configs alike)


def moved_message(keys: list[str], moved: dict[str, str]) -> str:
    many = len(keys) > 1
    shown = ", ".join(f"{k} -> {moved[k]}" for k in keys)
    return (f"setting{'s' * many} moved under {'their' if many else 'its'} task: {shown} "
            f"(the old key{'s' * many} still work{'' if many else 's'})")


def note_moved(keys: list[str], moved: dict[str, str], source: str) -> None:
    """One line (rank 0's, once) saying where the old keys now belong (aliases are no old keys)."""
    keys = [k for k in keys if "." in moved[k]]
    if not keys:
        return
    note_once(f"note: {source + ': ' if source else ''}{moved_message(keys, moved)}")


def note_once(line: str) -> None:
    """Print `line` on stderr, on rank 0, once per process."""
    if os.environ.get("RANK", "0") == "0" and line not in _noted:
        _noted.add(line)
        print(line, file=sys.stderr, flush=True)


def move_old_keys(cls: type, data: dict[str, Any], source: str = "", note: bool = True) -> dict[str, Any]:
    """`data` with the old flat keys of `cls.MOVED` put where they belong (`doc_stride: 64` ->
    `qa: {doc_stride: 64}`), saying so in one line (note). An old key and its new place both set
    to different values is an error."""
    moved = moved_keys(cls)
    old = [k for k in data if k in moved]
    if not old:
        return data
    data, prefix = dict(data), f"{source}: " if source else ""
    for key in old:
        if "." not in moved[key]:  # an alias: the setting under its own name
            target, value = moved[key], data.pop(key)
            if target in data and resolve_plain(data[target]) != resolve_plain(value):
                raise ConfigError(f"{prefix}{key}={_shown(value)} and {target}={_shown(data[target])} are the same "
                                  f"setting: keep {target}")
            data[target] = value
            continue
        group, name = moved[key].split(".")
        inner = data.get(group)
        inner = {} if inner is None else dataclasses.asdict(inner) if dataclasses.is_dataclass(inner) else inner
        if not isinstance(inner, dict):
            raise ConfigError(f"{prefix}{group}: expected a mapping (key: value), got {_shown(inner)}")
        value = data.pop(key)
        if name in inner and resolve_plain(inner[name]) != resolve_plain(value):
            raise ConfigError(f"{prefix}{key}={_shown(value)} and {group}.{name}={_shown(inner[name])} are the same "
                              f"setting: keep {group}.{name}")
        data[group] = {**inner, name: value}
    if note:
        note_moved(old, moved, source)
    return data


def accepts_moved_keys(cls: type[T]) -> type[T]:
    """Let `cls(...)` take the old flat keys of `cls.MOVED` as keyword arguments (Python callers),
    with a FutureWarning that names their new places. Apply it above `@dataclass`."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        moved = moved_keys(cls)
        old = [k for k in kwargs if k in moved]
        if old:  # e.g. qa={"doc_stride": 64} (or qa=QASettings(doc_stride=64)) for doc_stride=64
            if any("." in moved[k] for k in old):  # not for an alias (metric_for_best=...)
                warnings.warn(f"{cls.__name__}: {moved_message([k for k in old if '.' in moved[k]], moved)}",
                              FutureWarning, stacklevel=2)
            kwargs = move_old_keys(cls, kwargs, note=False)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def flat_settings(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """A run config dict of `cls` (old flat keys moved first) with its groups spelled out key by key
    (`qa.doc_stride`): what a resume compares, setting by setting."""
    data, groups = move_old_keys(cls, data, note=False), settings_groups(cls)
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in groups and isinstance(value, dict):
            flat.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            flat[key] = value
    return flat


class UnknownKeyError(ConfigError):
    """A key that is not a setting of the run config."""


# names other tools give these settings (transformers' TrainingArguments, mostly)
_SYNONYMS = {"learning_rate": "lr", "num_train_epochs": "epochs", "num_epochs": "epochs", "epoch": "epochs",
             "per_device_train_batch_size": "batch_size", "train_batch_size": "batch_size",
             "per_device_eval_batch_size": "eval_batch_size", "max_seq_length": "max_length",
             "max_seq_len": "max_length", "seq_len": "max_length", "gradient_accumulation_steps": "grad_accum",
             "warmup_ratio": "warmup_fraction", "lr_scheduler_type": "schedule", "max_grad_norm": "clip_grad",
             "model_name_or_path": "model", "output": "output_dir", "eval_steps": "eval_every",
             "save_steps": "save_every", "logging_steps": "log_every", "save_total_limit": "keep_last",
             "adam_epsilon": "eps", "fp16": "precision", "bf16": "precision", "metric_for_best_model": "metric",
             "train_data": "train_file", "eval_file": "validation_file", "dev_file": "validation_file"}

_OTHER_COMMANDS = {"search": "a search: block is read by `bert-kit tune --config FILE --trials N`"}  # not a setting


def _key_hint(key: str, valid: list[str], moved: dict[str, str] | None = None) -> str:
    """ "did you mean epochs?" for a key close to a setting (or to another tool's name for one, or to
    the old name of a setting that moved into a group); which command reads a block of another's."""
    if key in _OTHER_COMMANDS:
        return _OTHER_COMMANDS[key]
    aliases = {**{a: t for a, t in _SYNONYMS.items() if t in valid}, **(moved or {})}
    close = difflib.get_close_matches(str(key), valid + list(aliases), n=1, cutoff=0.6)
    return f"did you mean {aliases.get(close[0], close[0])}?" if close else ""


def unknown_keys(keys: list[str], valid: list[str], settings_help: str = "", moved: dict[str, str] | None = None,
                 group: str = "") -> UnknownKeyError:
    """`unknown key 'epoch' (did you mean epochs?)`, and where the settings are listed; the keys of a
    group are named with it (group "qa": `unknown key 'qa.doc_strid' (did you mean qa.doc_stride?)`)."""
    named = [f"{group}.{k}" if group else str(k) for k in keys]
    choices = [f"{group}.{v}" if group else v for v in valid]
    parts = [f"{n!r} ({hint})" if (hint := _key_hint(n, choices, moved)) else repr(n) for n in named]
    message = f"unknown key{'s' if len(keys) > 1 else ''} {', '.join(parts)}"
    return UnknownKeyError(f"{message}; {settings_help}" if settings_help else message)
