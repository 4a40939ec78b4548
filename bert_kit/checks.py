"""Checks shared by every layer: ranges of settings, device names, and file errors that name the file.

Settings dataclasses (`BertConfig`, `PretrainConfig`, `FinetuneConfig`) are validated where they
are defined, from one table of rules per class, so a rule moves with its field:

    RULES = {"lr": Range(0, low_open=True), "batch_size": Range(1, integer=True),
             "clip_grad": Range(0, hint="0 turns clipping off")}

    def __post_init__(self):
        check_settings(self, RULES)   # also checks every Literal-typed field against its choices

A bad value raises `ConfigError` naming the key, the value and what is allowed:

    clip_grad=-1.0 is out of range: expected a finite number >= 0 (0 turns clipping off)

An unknown key or choice gets the nearest valid one (`suggestion`): `did you mean 'cosine'?`.

The command line exits with code 2 when the command or its inputs are wrong (a `ConfigError`, a
missing input, a bad data file, a corrupt model) and 1 when the run itself failed (see
bert_kit/cli/errors.py). `CorruptFileError` says that a file exists but cannot be used
(truncated, garbage, unsafe to unpickle); `InputNotFoundError`, that a file a setting names
does not exist.

Files: `read_text` and `read_json` name the file and line of a decode error; `load_yaml` reads
run settings (plain scalars stay text for the setting's type to decide, duplicate keys, deep
nesting and alias bombs refused); `writing(path)` turns a failed write that torch or safetensors
report as a RuntimeError (a full disk, say) into an OSError that names the file. This module
imports without torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import functools
import glob
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


class InputNotFoundError(FileNotFoundError, ConfigError):
    """A file or folder that a setting or flag names does not exist (the command is wrong)."""


ConfigFileNotFoundError = InputNotFoundError  # the run config file named on the command line


class UnsupportedModelError(ConfigError):
    """config.json describes a model bert-kit does not build (a decoder, relative positions, ...)."""


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
        if not math.isfinite(value) or abs(value) > MAX_INTEGER:  # torch and timers take 64-bit values
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))

    def problem(self, value: Any) -> str | None:
        """Why `value` does not fit ("is out of range: expected an integer >= 1"), or None."""
        if self.allows(value):
            return None
        if not _is_number(value):
            what = "is not a number"
        elif self.integer and not isinstance(value, int):
            what = "is not an integer"
        elif math.isfinite(value) and abs(value) > MAX_INTEGER:
            return f"is out of range: expected {self.describe()}, at most {MAX_INTEGER:.3g} in size"
        else:
            what = "is out of range"
        return f"{what}: expected {self.describe()}"

    def check(self, name: str, value: Any) -> None:
        """Raise ConfigError naming `name`, `value` and the allowed range unless the value fits."""
        if isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                self.check(f"{name}[{i}]", item)
            return
        problem = self.problem(value)
        if problem:
            raise ConfigError(f"{name}={value!r} {problem}")


MAX_INTEGER = 2**63 - 1  # the largest size of a setting: beyond it torch and timers overflow


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


def suggestion(word: Any, options: typing.Iterable[Any], quote: bool = True) -> str:
    """The nearest of `options` to a mistyped `word`, as a hint: "did you mean 'cosine'?", or ""."""
    names = {str(o): o for o in options}
    close = difflib.get_close_matches(str(word), list(names), n=1, cutoff=0.6)
    if not close:  # case slips: 'Linear', 'FP32'
        close = [n for n in names if n.lower() == str(word).strip().lower()][:1]
    if not close:
        return ""
    return f"did you mean {names[close[0]]!r}?" if quote else f"did you mean {close[0]}?"


def choice_error(name: str, value: Any, options: typing.Sequence[Any]) -> ConfigError:
    """`name=value is not a valid choice: expected one of ...; did you mean ...?`"""
    shown = ", ".join(repr(o) for o in options)
    hint = suggestion(value, [o for o in options if isinstance(o, str)]) if isinstance(value, str) else ""
    message = f"{name}={value!r} is not a valid choice: expected one of {shown}"
    return ConfigError(f"{message}; {hint}" if hint else message)


def check_choices(cfg: Any, prefix: str = "") -> None:
    """Every Literal-typed field of dataclass instance `cfg` holds one of its choices; errors name
    the field as `prefix` + its name (a group of settings: "qa.")."""
    for name, options in _choices(type(cfg)).items():
        value = getattr(cfg, name)
        if value not in options:
            raise choice_error(prefix + name, value, options)


def check_settings(cfg: Any, rules: dict[str, Range], prefix: str = "") -> None:
    """Check the fields of dataclass instance `cfg` against `rules` and their Literal choices."""
    for name, rule in rules.items():
        rule.check(prefix + name, getattr(cfg, name))
    check_choices(cfg, prefix)


PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # the precisions a run or an inference may ask for
_DEVICE = re.compile(r"^(auto|cpu|mps|(cuda|xpu)(:\d{1,6})?)$")  # torch cannot parse a 20-digit index


def check_device(device: Any, name: str = "device") -> None:
    """`device` is "auto", "cpu", "cuda", "cuda:N", "mps", "xpu", "xpu:N" (or a torch.device /
    None for auto)."""
    if device is None or type(device).__name__ == "device":
        return
    if not isinstance(device, str) or not _DEVICE.match(device.strip()):
        raise ConfigError(f"{name}={device!r} is not a device: expected auto, cpu, cuda, cuda:N, mps, xpu or xpu:N")


def _available(kind: str) -> bool:
    """Whether this torch build and machine have a device of `kind` ("cuda", "mps", "xpu")."""
    import torch

    if kind == "mps":
        return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    module = getattr(torch, kind, None)
    return bool(module is not None and module.is_available())


def resolve_device(device: Any = "auto") -> Any:
    """The torch.device to run on: "auto" (or None) is this process's GPU (LOCAL_RANK under
    torchrun) when CUDA is available, else the CPU. A bad name, or a device of a kind this
    machine does not have (cuda, mps, xpu) or an index past its count, is a ConfigError."""
    import torch

    if device is None or str(device).strip() == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    check_device(device)
    device = torch.device(device.strip() if isinstance(device, str) else device)
    if device.type == "cpu":
        return device
    name = {"cuda": "CUDA", "mps": "MPS (Apple GPU)", "xpu": "XPU (Intel GPU)"}.get(device.type, device.type)
    if not _available(device.type):
        raise ConfigError(f"device={str(device)!r} but {name} is not available on this machine (or in this torch "
                          "build): use cpu or auto")
    count = getattr(torch, device.type).device_count() if device.type in ("cuda", "xpu") else 1
    if device.index is not None and device.index >= count:
        raise ConfigError(f"device={str(device)!r} but this machine has {count} {name} device(s): "
                          f"use {device.type}:0 to {device.type}:{count - 1}")
    return device


# ---- files -----------------------------------------------------------------------------------------

MAX_SETTINGS_BYTES = 1 << 26  # a settings, config or vocabulary file larger than this is no such file


def read_text(path: str | Path) -> str:
    """The UTF-8 text of `path` (a byte-order mark is dropped); a decode error names file and line.
    For settings, configs and vocabularies: past MAX_SETTINGS_BYTES (/dev/zero) it is refused."""
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read(MAX_SETTINGS_BYTES + 1)
    if len(data) > MAX_SETTINGS_BYTES:
        raise CorruptFileError(f"{path}: more than {MAX_SETTINGS_BYTES >> 20} MB: not a settings, config or "
                               "vocabulary file")
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
    except RecursionError:  # [[[[...]]]] thousands deep: no file we read nests that far
        raise CorruptFileError(f"{path}: JSON nested too deeply to read (thousands of levels)") from None


def check_input_path(setting: str, value: str | Path, folder_ok: bool = False) -> None:
    """Refuse, before any model or data is loaded, a file that a setting names but that is not
    there: `train_file=mydata/trian.csv: file not found (did you mean train.csv?)`. A glob must
    match something; `folder_ok` allows a folder (a corpus folder, a tokenizer folder)."""
    text = str(value)
    if any(c in text for c in "*?["):
        if not glob.glob(text, recursive=True):
            raise InputNotFoundError(f"{setting}={text}: no file matches this pattern")
        return
    path = Path(text)
    if path.is_dir() and not folder_ok:
        raise ConfigError(f"{setting}={text}: is a folder, not a file: name the file in it")
    if path.exists():
        return
    folder = path.parent if str(path.parent) else Path(".")
    hint = ""
    try:
        if folder.is_dir():
            names = [p.name for _, p in zip(range(1000), folder.iterdir())]
            close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.75)
            hint = f" (did you mean {folder / close[0] if str(path.parent) != '.' else close[0]}?)" if close else ""
        else:
            hint = f" (no folder {folder})"
    except OSError:
        pass
    raise InputNotFoundError(f"{setting}={text}: {'folder or file' if folder_ok else 'file'} not found{hint}")


def check_input_file(path: str | Path, flag: str = "--input") -> None:
    """Refuse a missing input or a folder before the model loads; any other path that exists (a
    FIFO, /dev/stdin, `<(command)`) is read once, later, as a file."""
    if Path(path).is_dir():
        raise FileNotFoundError(f"input file is a folder, not a file: {path}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"input file not found: {path} ({flag})")


# ---- YAML -----------------------------------------------------------------------------------------

MAX_YAML_DEPTH = 32  # run settings nest a few levels (model: {...}, phases: [{...}])
MAX_YAML_VALUES = 10_000  # values a document may expand to through anchors and aliases


class PlainText(str):
    """A plain (unquoted) YAML scalar, kept as written: the setting it is given to decides what it
    is (`010` is the text "010" for a folder, the number 10 for a count; see `resolve_plain`)."""


_YAML_INT = re.compile(r"^[-+]?[0-9][0-9_]*$")
_YAML_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?$")
_YAML_SPECIAL = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan,
                 "true": True, "false": False}


def resolve_plain(value: Any) -> Any:
    """`value` with every PlainText read as YAML 1.2 reads it: decimal numbers, true/false, .inf,
    .nan; anything else (010 is 10, but 0x1F, 12:30, yes, 2024-01-01 stay text). For settings
    whose type does not say (a mapping of model fields)."""
    if isinstance(value, list):
        return [resolve_plain(v) for v in value]
    if isinstance(value, dict):
        return {(str(k) if isinstance(k, PlainText) else k): resolve_plain(v) for k, v in value.items()}
    if not isinstance(value, PlainText):
        return value
    text = str(value)
    if len(text) > 100:  # no setting is a 5,000-digit number (and int() refuses those)
        return text
    special = _YAML_SPECIAL.get(text.lower())
    if special is not None:
        return special
    if _YAML_INT.match(text):
        return int(text.replace("_", ""))
    if _YAML_FLOAT.match(text):
        return float(text.replace("_", ""))
    return text


@functools.cache
def _yaml_loader() -> type:
    """A safe loader whose only implicit types are null and merge keys: every other plain scalar
    is PlainText (no YAML 1.1 octals, sexagesimals, dates or yes/no), and a duplicate key is an
    error (YAML forbids them; PyYAML would keep the last)."""
    import yaml

    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers: dict = {}
        source = "YAML"
        with_lines = True

        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            if isinstance(node, yaml.MappingNode):
                seen: dict[str, int] = {}
                for key, _ in node.value:
                    if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                        continue
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        where = f"{self.source}:{line}" if self.with_lines else self.source
                        raise ConfigError(f"{where}: duplicate key {key.value!r} (first on line {seen[key.value]}): "
                                          "keep one")
                    seen[key.value] = line
            return super().construct_mapping(node, deep)

    def plain_or_quoted(loader: Any, node: Any) -> str:
        text = loader.construct_scalar(node)
        return PlainText(text) if node.style is None else text

    Loader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"),
                                 ["~", "n", "N", ""])
    Loader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
    Loader.add_constructor("tag:yaml.org,2002:str", plain_or_quoted)
    return Loader


def load_yaml(text: str, source: str, with_lines: bool = True, key_lines: dict[str, int] | None = None) -> Any:
    """The YAML document in `text`, read safely (tags that build Python objects refused) and with
    plain scalars as PlainText. Errors are ConfigErrors naming `source` (and the line, unless
    `with_lines` is off, e.g. for a one-line `key=value` override): invalid YAML, a duplicate
    key, nesting deeper than MAX_YAML_DEPTH, aliases expanding past MAX_YAML_VALUES values.
    `key_lines`, if given, receives {top-level key: line}."""
    import yaml

    loader_class = _yaml_loader()

    def at(mark: Any) -> str:
        return f"{source}:{mark.line + 1}" if with_lines and mark is not None else source

    try:
        _check_yaml_shape(yaml.parse(text, Loader=loader_class), at)
        loader = loader_class(text)
        loader.source, loader.with_lines = source, with_lines
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(f"{at(mark)}: invalid YAML: {getattr(e, 'problem', None) or e}") from None
    if key_lines is not None and isinstance(node, yaml.MappingNode):
        key_lines.update({k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)})
    return data


def _check_yaml_shape(events: Iterator[Any], at: Any) -> None:
    """Refuse, from the parser's events (before any recursion), nesting deeper than MAX_YAML_DEPTH
    and aliases that expand the document past MAX_YAML_VALUES values (9 levels of 9 aliases of
    the level below are 9**9 values: a 'billion laughs')."""
    import yaml

    sizes: dict[str, int] = {}  # anchor -> values of the node it names, its aliases expanded
    open_nodes: list[list] = []  # [anchor, values so far] of each collection being read
    total = 0
    for event in events:
        if isinstance(event, yaml.CollectionStartEvent):
            open_nodes.append([event.anchor, 1])
            if len(open_nodes) > MAX_YAML_DEPTH:
                raise ConfigError(f"{at(event.start_mark)}: YAML nested more than {MAX_YAML_DEPTH} levels deep: "
                                  "run settings are mappings and lists a few levels deep")
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, n = open_nodes.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, n = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            if any(event.anchor == a for a, _ in open_nodes):
                raise ConfigError(f"{at(event.start_mark)}: the alias *{event.anchor} refers to a node that holds "
                                  "it: a setting cannot contain itself")
            anchor, n = None, sizes.get(event.anchor, 1)
            if total + n > MAX_YAML_VALUES:
                raise ConfigError(f"{at(event.start_mark)}: the alias *{event.anchor} expands this YAML past "
                                  f"{MAX_YAML_VALUES} values: write the settings out instead of nesting aliases")
        else:
            continue
        if anchor is not None:
            sizes[anchor] = n
        if open_nodes:
            open_nodes[-1][1] += n
        total += n if isinstance(event, (yaml.AliasEvent, yaml.ScalarEvent)) else 1


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


def label_map(names: Any) -> dict[int, str]:
    """Label names as {output: name}: from a dict keyed by ints or their text ({"0": "neg"}, as
    config.json holds them) or a list of names; the outputs numbered 0..K-1."""
    if isinstance(names, (list, tuple)):
        names = dict(enumerate(names))
    if not isinstance(names, dict):
        raise ConfigError(f"id2label must map output ids to label names, got {type(names).__name__}")
    out = {}
    for key, name in names.items():
        text = str(key).strip()
        if isinstance(key, bool) or not (text.isascii() and text.isdigit()) or not isinstance(name, str):
            raise ConfigError(f"id2label: {key!r}: {name!r} is not an output id (0, 1, ...) and a label name")
        out[int(text)] = name
    if sorted(out) != list(range(len(out))):
        raise ConfigError(f"id2label must number the outputs 0..{len(out) - 1}, got ids {sorted(out)}")
    return {i: out[i] for i in sorted(out)}
