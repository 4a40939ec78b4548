"""Run settings as dataclasses: YAML in and out, `key=value` overrides, CLI help from comments.

Any dataclass works. A field's help text is its attribute docstring (a string literal on the
line after it) or else the comment on its own line:

    @dataclass
    class RunConfig:
        lr: float = 1e-4  # peak learning rate
        schedule: Literal["linear", "cosine"] = "linear"
        \"\"\"decay after warmup\"\"\"

    cfg = load_config(RunConfig, "run.yaml", ["lr=3e-4", "schedule=cosine"])
    save_config(cfg, "out/run_config.yaml")

Values are typed by the field they set (int, float, bool, str, Literal choices, Optional,
list[...], dict[...]): YAML is read with plain scalars kept as written (`checks.load_yaml`), so
`output_dir: 010` is the folder "010" and `batch_size: 010` the number 10; no YAML 1.1 octal,
sexagesimal, date or yes/no reading. A mapping whose values the type does not name (`model:
{hidden_size: 128}`) reads numbers and true/false as YAML 1.2 does (`checks.resolve_plain`).
Errors are ConfigErrors that name the file (and line), the key and what was expected; an unknown
key or choice gets the nearest valid one (`did you mean epochs?`).

An override `key=value` sets one setting: the value is the text as typed (`text_column=#1 String`),
unless the setting takes a list or mapping and the value starts with `[` or `{` (flow YAML:
`betas=[0.9, 0.98]`, `where={fold: 010}`). An override `a.b=v` sets key `b` inside the
dict-valued field `a`.

Settings that belong to one part of a run are grouped in a dataclass of their own, a field of
the run config (`qa: QASettings`): `qa: {doc_stride: 64}` in YAML, `qa.doc_stride=64` on the
command line, each value typed and checked by the group. A config class that moved flat keys into
groups lists them in `MOVED` (`{"doc_stride": "qa.doc_stride"}`): the old keys keep working, in
files, overrides, saved run configs and Python (`accepts_moved_keys`), with a one-line note. The
keys (groups, moved keys, aliases, unknown keys and their hints) are `config_keys.py`'s.

String values may name environment variables, `${NAME}`, `${NAME:-default}` (the default may
itself be `${OTHER}` or `${OTHER:-...}`), expanded when the config is built; any other `${` is
refused. `${BERT_KIT_DATA}` is the data root (`bert_kit.data.root`; default ./data): the shipped
configs name their data files through it, and a file below it that is missing is an error saying
where to get the data (`config_variables.py`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from bert_kit.checks import (ConfigError, ConfigFileNotFoundError, CorruptFileError, PlainText, Range, check_device,
                             check_settings, choice_error, load_yaml, read_text, resolve_plain)
from bert_kit.training.config_keys import (UnknownKeyError, _shown, is_group, move_old_keys, moved_keys, note_moved,
                                           settings_groups, unknown_keys)
from bert_kit.training.config_variables import expand_variables

T = TypeVar("T")

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


# What the settings every training run has (optimisation, hardware, bookkeeping) may be. Each run
# config's __post_init__ checks them together with its own rules (`check_run_settings`).
def check_run_settings(cfg: Any, rules: dict[str, Range]) -> None:
    """Check a run config: `rules` (for its fields), Literal choices, the device name, two betas
    and a non-empty output_dir. Raises ConfigError naming key, value and range."""
    check_settings(cfg, {k: v for k, v in rules.items() if hasattr(cfg, k)})
    check_device(getattr(cfg, "device", None))
    betas = getattr(cfg, "betas", None)
    if betas is not None and (not isinstance(betas, (list, tuple)) or len(betas) != 2):
        raise ConfigError(f"betas={betas!r} must be two numbers in [0, 1), e.g. [0.9, 0.999]")
    output_dir = getattr(cfg, "output_dir", "x")
    if not isinstance(output_dir, str) or not output_dir.strip():
        raise ConfigError(f"output_dir={output_dir!r} must name a folder")


def field_help(cls: type) -> dict[str, str]:
    """{field name: help text} from attribute docstrings or same-line comments of `cls` and of
    the dataclasses it extends (a field redeclared in a subclass takes the subclass's help)."""
    helps: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            helps.update(_own_field_help(klass))
    return helps


def _own_field_help(cls: type) -> dict[str, str]:
    """field_help of the fields written in `cls`'s own class body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # defined in a REPL: no source, no help
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    body = ast.parse(source).body[0].body  # the class statement's body
    helps: dict[str, str] = {}
    for node, nxt in zip(body, body[1:] + [None]):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            helps[name] = inspect.cleandoc(nxt.value.value)
        elif node.end_lineno in comments:
            helps[name] = comments[node.end_lineno]
    return helps


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    return getattr(tp, "__name__", str(tp))


_INTEGER = re.compile(r"^[-+]?[0-9]+$")


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert `value` to type `tp` or raise ConfigError naming `where` (e.g. "run.yaml: lr").

    Text (PlainText from YAML, str from overrides) becomes a number or a boolean only where `tp`
    asks for one; a field typed Any or a bare dict/list reads its plain scalars as YAML 1.2 does."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return resolve_plain(value)
    if origin is Literal:
        text = str(value).strip() if isinstance(value, str) else value
        if text in args:
            return text
        raise choice_error(where, str(value) if isinstance(value, str) else value, args)
    if origin in (Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("null", "none", "~")):
            if type(None) in args:
                return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # Optional[X]: X's own message ("expected an integer, got 'ten'")
            return coerce(value, options[0], where)
        for arg in options:
            try:
                return coerce(value, arg, where)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {_shown(value)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (str, int)) and str(value).strip().lower() in _TRUE | _FALSE:
            return str(value).strip().lower() in _TRUE
        raise ConfigError(f"{where}: expected a boolean (true/false), got {_shown(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and len(value) < 100:  # decimal only: 010 is 10, 0x1F is refused
            text = value.strip().replace("_", "")
            if _INTEGER.match(text):
                return int(text)
            try:
                number = float(text)  # 6e0, 1.0e3
            except ValueError:
                number = None
            if number is not None and number.is_integer():
                return int(number)
        raise ConfigError(f"{where}: expected an integer, got {_shown(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and len(value) < 100:
            number = resolve_plain(PlainText(value.strip()))  # YAML's .inf and .nan too
            if isinstance(number, (int, float)) and not isinstance(number, bool):
                return float(number)
            try:
                return float(value.strip())  # 1e-4, 3.0, nan (refused by the ranges, with the key)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {_shown(value)}")
    if tp is str:
        if isinstance(value, str):
            return str(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: expected a string, got {_shown(value)}")
    if origin in (list, tuple) or tp in (list, tuple):
        if isinstance(value, (str, int, float)):
            value = [value]  # a single file name is a one-element list
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {_shown(value)}")
        item = args[0] if args else Any
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping (key: value), got {_shown(value)}")
        if not args:
            return resolve_plain(dict(value))
        return {coerce(k, args[0], f"{where} key"): coerce(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if is_group(tp):
        return build_group(tp, value, where)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{where}: cannot convert {_shown(value)} to {_type_name(tp)}")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build_group(tp: type, value: Any, where: str) -> Any:
    """Group `tp` from a mapping (YAML, an override, a Python dict), typed and checked; an instance
    is kept. `where` names it in errors ("run.yaml: qa"); the group's own checks name `qa.key`."""
    if isinstance(value, tp):
        return value
    if value is None:
        return tp()
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping (key: value), got {_shown(value)}")
    hints, valid = _hints(tp), [f.name for f in dataclasses.fields(tp)]
    unknown = [k for k in value if k not in valid]
    if unknown:
        source, _, name = where.rpartition(": ")  # "run.yaml: qa", or "qa"
        error = unknown_keys(unknown, valid, f"{name} takes {', '.join(valid)}", group=name)
        raise UnknownKeyError(f"{source}: {error}" if source else str(error))
    return tp(**{str(k): coerce(expand_variables(v, f"{where}.{k}"), hints[k], f"{where}.{k}")
                 for k, v in value.items()})


def _settings_help(cls: type, settings_help: str | None) -> str:
    return settings_help if settings_help is not None else f"the settings are the fields of {cls.__name__}"


def config_from_dict(cls: type[T], data: dict[str, Any], source: str = "config",
                     settings_help: str | None = None) -> T:
    """Build dataclass `cls` from a dict; unknown keys, bad types and bad values (the checks of
    `cls.__post_init__`) raise ConfigError naming `source` and the key. Environment variables in
    string values are expanded first (`expand_variables`). `settings_help` says where the valid
    keys are listed (e.g. "bert-kit finetune --help lists the settings")."""
    prefix = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}expected a mapping of settings, got {type(data).__name__}")
    data = move_old_keys(cls, data, source)
    hints = _hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in valid]
    if unknown:
        error = unknown_keys(unknown, valid, _settings_help(cls, settings_help), moved_keys(cls))
        raise UnknownKeyError(f"{prefix}{error}")
    values = {str(k): coerce(expand_variables(v, f"{prefix}{k}"), hints[k], f"{prefix}{k}") for k, v in data.items()}
    try:
        return cls(**values)
    except ValueError as e:  # __post_init__ checks: a bad setting, whatever error class it used
        if isinstance(e, ConfigError):  # kept as it is (InputNotFoundError is a FileNotFoundError too)
            raise (type(e)(f"{prefix}{e}") if prefix else e) from None
        raise ConfigError(f"{prefix}{e}") from None


def _quoted(text: str, limit: int = 60) -> str:
    """repr(text) for a message, cut short: an override may be thousands of characters long."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _split_override(text: str) -> tuple[str, str]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {_quoted(text)} is not of the form key=value")
    return key, raw


def _is_scalar_type(tp: Any) -> bool:
    """str, int, float, bool, Literal, or a union of them (Optional included)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return all(_is_scalar_type(a) for a in typing.get_args(tp))
    return tp in (str, int, float, bool, type(None)) or typing.get_origin(tp) is Literal


def _parse_override(text: str, tp: Any = Any) -> tuple[str, Any]:
    """(key, value) of `key=value`: the value is the text as typed (PlainText, typed later by the
    setting), or flow YAML (`[...]`, `{...}`) for a setting of type `tp` that takes a list or mapping."""
    key, raw = _split_override(text)
    value = raw.strip()
    if value[:1] in ("[", "{") and not _is_scalar_type(tp):
        return key, load_yaml(value, f"override {_quoted(text)}", with_lines=False)
    return key, PlainText(value) if value else ""


def apply_overrides(data: dict[str, Any], overrides: list[str], cls: type,
                    settings_help: str | None = None) -> dict[str, Any]:
    """Return a copy of `data` with `key=value` strings applied (`a.b=v` sets a nested key: a
    setting of group `a`, or a key of mapping `a`). Old flat keys that moved into a group are
    moved, in `data` silently, in the overrides with a note."""
    data = move_old_keys(cls, data, note=False)
    hints, groups, moved = _hints(cls), settings_groups(cls), moved_keys(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    old, spelled = [], {}  # spelled: {setting: the override that set it under another name}
    for text in overrides:
        key, _ = _split_override(text)
        if key in moved:
            old.append(key)
            key = moved[key]
        # one name given twice: the last wins, as with any flag; two names of one setting that
        # disagree are refused, as in a file (`metric_for_best=f1 metric=accuracy`)
        earlier = spelled.get(key)
        if earlier is not None and _split_override(earlier)[0] != _split_override(text)[0] \
                and _parse_override(earlier)[1] != _parse_override(text)[1]:
            raise ConfigError(f"overrides {_quoted(earlier)} and {_quoted(text)} set the same setting {key!r} "
                              "to different values: give one")
        spelled[key] = text
        head, _, rest = key.partition(".")
        if head not in valid:
            error = unknown_keys([head], valid, _settings_help(cls, settings_help), moved)
            raise UnknownKeyError(f"override {_quoted(text)}: {error}")
        if head in groups:
            data[head] = _override_group(data.get(head), groups[head], head, rest, text, settings_help)
            continue
        _, value = _parse_override(text, Any if rest else hints[head])
        if rest:
            inner = data.get(head)
            if inner is None:
                inner = {}
            if isinstance(inner, str):  # e.g. model=bert-mini then model.hidden_dropout_prob=0
                inner = {"preset": inner}
            if not isinstance(inner, dict):
                raise ConfigError(f"override {_quoted(text)}: {head} is not a mapping, cannot set {rest!r}")
            inner = dict(inner)
            inner[rest] = value
            value = inner
        data[head] = value
    if old:
        note_moved(old, moved, "")
    return data


def _override_group(inner: Any, group: type, head: str, rest: str, text: str, settings_help: str | None) -> dict:
    """A group's settings with one override applied: `qa.doc_stride=64` (typed by the group's
    field), or `qa={doc_stride: 64}` (merged into what is set)."""
    inner = {} if inner is None else dataclasses.asdict(inner) if dataclasses.is_dataclass(inner) else inner
    if not isinstance(inner, dict):
        raise ConfigError(f"override {_quoted(text)}: {head} is not a mapping, cannot set {rest!r}")
    hints, names = _hints(group), [f.name for f in dataclasses.fields(group)]
    if not rest:
        _, value = _parse_override(text, dict)
        if not isinstance(value, dict):
            raise ConfigError(f"override {_quoted(text)}: {head} takes a mapping, e.g. {head}={{{names[0]}: ...}}")
        return {**inner, **value}
    if rest not in names:
        error = unknown_keys([rest], names, f"{head} takes {', '.join(names)}", group=head)
        raise UnknownKeyError(f"override {_quoted(text)}: {error}")
    return {**inner, rest: _parse_override(text, hints[rest])[1]}


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from `path`; a missing file, bad text or bad YAML give errors naming the file
    (and line). Only plain YAML is read: tags that would build Python objects are refused, plain
    scalars are PlainText (see `checks.load_yaml`), duplicate keys and alias bombs are refused."""
    data, _ = _read_yaml_lines(path)
    return data


def _read_yaml_lines(path: str | Path) -> tuple[dict[str, Any], dict[str, int]]:
    """(mapping, {top-level key: line number}) of a YAML run config."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder: name a YAML file")
    if not path.is_file():
        raise ConfigFileNotFoundError(f"config file not found: {path}")
    try:
        text = read_text(path)
    except CorruptFileError as e:  # not UTF-8
        raise ConfigError(str(e)) from None
    lines: dict[str, int] = {}
    data = load_yaml(text, str(path), key_lines=lines)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return {str(k) if isinstance(k, PlainText) else k: v for k, v in data.items()}, lines


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                settings_help: str | None = None) -> T:
    """Dataclass `cls` from an optional YAML file, then `key=value` overrides.

    A bad value from the file is reported with its line: `run.yaml:7: clip_grad=-1.0 is out of range ...`.
    `settings_help` ends an unknown-key error (default: "the settings are the fields of CLS").
    """
    data, lines = _read_yaml_lines(path) if path is not None else ({}, {})
    source = str(path) if path is not None else "overrides"
    # check file keys first so the error names the file, not the overrides
    valid, moved = [f.name for f in dataclasses.fields(cls)], moved_keys(cls)
    unknown = [k for k in data if k not in valid and k not in moved]
    if unknown:
        where = f"{source}:{lines[unknown[0]]}" if unknown[0] in lines else source
        raise UnknownKeyError(f"{where}: {unknown_keys(unknown, valid, _settings_help(cls, settings_help), moved)}")
    data = move_old_keys(cls, data, source)
    overrides = list(overrides or [])
    merged = apply_overrides(data, overrides, cls, settings_help)
    overridden = {k for o in overrides for k in (_split_override(o)[0], moved.get(_split_override(o)[0], ""))}
    overridden |= {k.partition(".")[0] for k in overridden}
    old_names = {new: old for old, new in moved.items()}
    try:
        return config_from_dict(cls, merged, "", settings_help)
    except ConfigError as e:
        message = str(e)
        found = re.match(r"unknown keys? '([\w.]+)'", message) or re.match(r"([\w.]+)", message)
        key = found.group(1) if found else ""
        # the line of the key at fault: itself, its group, or the old flat key it was written as
        line_key = next((k for k in (key, old_names.get(key), key.partition(".")[0]) if k in lines), None)
        if line_key is not None and key not in overridden and key.partition(".")[0] not in overridden:
            raise type(e)(f"{source}:{lines[line_key]}: {message}") from None
        with_overrides = overrides and path is not None
        raise type(e)(f"{source} (+ overrides): {message}" if with_overrides else f"{source}: {message}") from None
    except FileNotFoundError as e:  # a data file the config names (below the data root)
        raise type(e)(f"{source}: {e}") from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain dict of a dataclass instance (nested containers copied)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path, note: str = "") -> Path:
    """Write the dataclass as YAML, fields in declaration order; `note` (one line) as a comment
    first, so the file still loads as the run's config."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    comment = f"# {note}\n" if note else ""
    path.write_text(comment + yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None))
    return path


def help_table(cls: type) -> str:
    """One line per field: name (type, default): help. Used as the CLI epilog."""
    hints, helps, groups = _hints(cls), field_help(cls), settings_groups(cls)
    lines = []
    for f in dataclasses.fields(cls):
        if f.name in groups:  # its settings, one by one: qa.doc_stride (int, default 128)
            nested = help_table(groups[f.name]).splitlines()
            lines.extend(re.sub(r"^  (\w)", rf"  {f.name}.\1", line) for line in nested)
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "required"
        lines.append(f"  {f.name} ({_type_name(hints[f.name])}, default {default!r})")
        if f.name in helps:
            lines.extend("      " + line for line in helps[f.name].splitlines())
    return "\n".join(lines)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, required: bool = False) -> None:
    """Add `--config FILE` and positional `key=value` overrides; list every field in --help."""
    parser.add_argument("--config", required=required, metavar="FILE", help="YAML run config")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="override settings of the config file, e.g. lr=3e-4 max_steps=1000 "
                             "(before, between or after the options)")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = f"settings ({cls.__name__}):\n" + help_table(cls)
