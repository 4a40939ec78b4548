"""Checks shared by every layer: ranges of settings, device names, and file errors that name the file.

Settings dataclasses (`BertConfig`, `PretrainConfig`, `FinetuneConfig`) are validated where they
are defined, from one table of rules per class, so a rule moves with its field:

    RULES = {"lr": Range(0, low_open=True), "batch_size": Range(1, integer=True),
             "clip_grad": Range(0, hint="0 turns clipping off")}

    def __post_init__(self):
        check_settings(self, RULES)   # also checks every Literal-typed field against its choices

A bad value raises `ConfigError` naming the key, the value and what is allowed:

    clip_grad=-1.0 is out of range: expected a finite number >= 0 (0 turns clipping off)

The command line exits with code 2 for a `ConfigError` (the command is wrong) and 1 for the
other errors (the run failed: a bad data file, a corrupt model, a full disk). `CorruptFileError`
says that a file exists but cannot be used (truncated, garbage, unsafe to unpickle).

Files: `read_text` and `read_json` name the file and line of a decode error; `writing(path)`
turns a failed write that torch or safetensors report as a RuntimeError (a full disk, say) into
an OSError that names the file. This module imports without torch.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import math
import os
import re
import shutil
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A setting (config key or command-line flag) has a bad value: the command is wrong."""


class ConfigFileNotFoundError(FileNotFoundError, ConfigError):
    """The run config file named on the command line does not exist."""


class CorruptFileError(ValueError):
    """A file exists but cannot be used: empty, truncated, garbage, or unsafe to unpickle."""


# ---- ranges of settings -------------------------------------------------------------------------

@dataclass(frozen=True)
class Range:
    """What a numeric setting may be: bounds (open or closed), integer or not, None allowed or not.

    Lists (e.g. betas) are checked item by item. Every value must be finite: NaN and inf are
    never a meaningful learning rate, epoch count or dropout.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # exclude `low` itself
    high_open: bool = False  # exclude `high` itself
    integer: bool = False
    optional: bool = False  # None is allowed (it stands for a default)
    hint: str = ""  # what a boundary value means, e.g. "0 turns clipping off"

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        lo = None if self.low is None else _number(self.low)
        hi = None if self.high is None else _number(self.high)
        if lo is not None and hi is not None:
            text = f"{kind} in {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"
        elif lo is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {lo}"
        elif hi is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {hi}"
        else:
            text = kind
        if self.optional:
            text += " or null"
        return f"{text} ({self.hint})" if self.hint else text

    def allows(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))

    def check(self, name: str, value: Any) -> None:
        """Raise ConfigError naming `name`, `value` and the allowed range unless the value fits."""
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                self.check(f"{name}[{i}]", item)
            return
        if not self.allows(value):
            if not _is_number(value):
                what = "is not a number"
            elif self.integer and not isinstance(value, int):
                what = "is not an integer"
            else:
                what = "is out of range"
            raise ConfigError(f"{name}={value!r} {what}: expected {self.describe()}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


def positive(integer: bool = False, **kw: Any) -> Range:
    """> 0 for numbers, >= 1 for integers."""
    return Range(1, integer=True, **kw) if integer else Range(0, low_open=True, **kw)


def non_negative(integer: bool = False, **kw: Any) -> Range:
    return Range(0, integer=integer, **kw)


def fraction(low_open: bool = False, high_open: bool = False, **kw: Any) -> Range:
    """A share in [0, 1] (ends open as asked)."""
    return Range(0, 1, low_open=low_open, high_open=high_open, **kw)


@functools.cache
def _choices(cls: type) -> dict[str, tuple]:
    """{field: allowed values} for the Literal-typed fields of dataclass `cls` (Optional included)."""
    hints = typing.get_type_hints(cls)
    found = {}
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name)
        args = typing.get_args(tp)
        if typing.get_origin(tp) is Literal:
            found[f.name] = args
        elif any(typing.get_origin(a) is Literal for a in args):  # Literal[...] | None, bool | Literal[...]
            members = {type(None): (None,), bool: (True, False)}
            if all(typing.get_origin(a) is Literal or a in members for a in args):
                found[f.name] = tuple(v for a in args for v in
                                      (typing.get_args(a) if typing.get_origin(a) is Literal else members[a]))
    return found


def check_choices(cfg: Any) -> None:
    """Every Literal-typed field of dataclass instance `cfg` holds one of its choices."""
    for name, options in _choices(type(cfg)).items():
        value = getattr(cfg, name)
        if value not in options:
            shown = ", ".join(repr(o) for o in options)
            raise ConfigError(f"{name}={value!r} is not a valid choice: expected one of {shown}")


def check_settings(cfg: Any, rules: dict[str, Range]) -> None:
    """Check the fields of dataclass instance `cfg` against `rules` and their Literal choices."""
    for name, rule in rules.items():
        rule.check(name, getattr(cfg, name))
    check_choices(cfg)


_DEVICE = re.compile(r"^(auto|cpu|mps|(cuda|xpu)(:\d+)?)$")


def check_device(device: Any, name: str = "device") -> None:
    """`device` is "auto", "cpu", "cuda", "cuda:N", "mps" (or a torch.device / None for auto)."""
    if device is None or type(device).__name__ == "device":
        return
    if not isinstance(device, str) or not _DEVICE.match(device.strip()):
        raise ConfigError(f"{name}={device!r} is not a device: expected auto, cpu, cuda, cuda:N or mps")


def resolve_device(device: Any = "auto") -> Any:
    """The torch.device to run on: "auto" (or None) is this process's GPU (LOCAL_RANK under
    torchrun) when CUDA is available, else the CPU. A bad name or a missing GPU is a ConfigError."""
    import torch

    if device is None or str(device).strip() == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    check_device(device)
    device = torch.device(device.strip() if isinstance(device, str) else device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={str(device)!r} but CUDA is not available on this machine: use cpu or auto")
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and device.index is not None and device.index >= count:
        raise ConfigError(f"device={str(device)!r} but this machine has {count} CUDA device(s): "
                          f"use cuda:0 to cuda:{count - 1}")
    return device


# ---- files -----------------------------------------------------------------------------------------

def read_text(path: str | Path) -> str:
    """The UTF-8 text of `path` (a byte-order mark is dropped); a decode error names file and line."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise CorruptFileError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at column {column}); "
                               "save the file as UTF-8") from None


def read_json(path: str | Path) -> Any:
    """Parsed JSON of `path`; errors name the file and line."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None


# messages by which torch (C++) and safetensors (Rust) report a failed write
_WRITE_FAILURES = ("PytorchStreamWriter", "inline_container", "file write failed", "os error", "I/O error")


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Make a failed write inside the block an OSError naming `path`.

    Python reports a full disk as OSError(ENOSPC) without the file name; torch.save as a
    RuntimeError ("unexpected pos ..."), safetensors as a SafetensorError ("os error 28").
    """
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise
    except Exception as e:
        message = str(e)
        if not any(s in message for s in _WRITE_FAILURES):
            raise
        found = re.search(r"os error (\d+)", message)
        code = int(found.group(1)) if found else (errno.ENOSPC if _disk_full(path) else errno.EIO)
        raise OSError(code, f"{os.strerror(code)} ({message.strip().splitlines()[0]})", str(path)) from e


def _disk_full(path: str | Path) -> bool:
    """Whether the file system holding `path` has (almost) no space left."""
    folder = Path(path).absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        return False
