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

Values from YAML and from overrides are coerced to the field's type (int, float, bool, str,
Literal choices, Optional, list[...], dict). Errors are ValueError / FileNotFoundError that
name the file, the key and what was expected; an unknown key lists the valid ones.
An override `a.b=v` sets key `b` inside the dict-valued field `a`.

String values may name environment variables, `${NAME}` or `${NAME:-default}`, expanded when
the config is built. `${BERT_KIT_DATA}` is the data root (`bert_kit.data.root`; default
./data): the shipped configs name their data files through it, and a file below it that is
missing is an error saying where to get the data.
"""

from __future__ import annotations

import argparse
import ast
import re
import dataclasses
import inspect
import glob
import io
import os
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from bert_kit.checks import (ConfigError, ConfigFileNotFoundError, CorruptFileError, Range, check_device, check_settings,
                             read_text)

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


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Convert `value` to type `tp` or raise ValueError naming `where` (e.g. "run.yaml: lr")."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin is Literal:
        text = value if not isinstance(value, str) else value.strip()
        if text in args:
            return text
        shown = ", ".join(repr(a) for a in args)
        raise ConfigError(f"{where}={value!r} is not a valid choice: expected one of {shown}")
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
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (str, int)) and str(value).strip().lower() in _TRUE | _FALSE:
            return str(value).strip().lower() in _TRUE
        raise ConfigError(f"{where}: expected a boolean (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                number = float(value.replace("_", ""))
            except ValueError:
                number = None
            if number is not None and number.is_integer():
                return int(number)
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads "1e-4" (no dot) as a string
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if origin in (list, tuple) or tp in (list, tuple):
        if isinstance(value, (str, int, float)):
            value = [value]  # a single file name is a one-element list
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args else Any
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping (key: value), got {value!r}")
        return dict(value)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{where}: cannot convert {value!r} to {_type_name(tp)}")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_variables(value: Any, where: str) -> Any:
    """`value` with `${NAME}` / `${NAME:-default}` replaced in every string (lists and dicts too).

    An unset variable without a default is a ValueError naming `where`; `${BERT_KIT_DATA}` falls
    back to the default data root, and a path built on it must exist (FileNotFoundError that says
    where to get the data)."""
    from bert_kit.data.root import DATA_ROOT_VARIABLE, data_root, missing_data_message

    if isinstance(value, list):
        return [expand_variables(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: expand_variables(v, f"{where}.{k}") for k, v in value.items()}
    if not isinstance(value, str) or "${" not in value:
        return value

    def replace(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name == DATA_ROOT_VARIABLE:
            return str(data_root())
        if os.environ.get(name) is not None:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: {value!r} names ${{{name}}}, which is not set in the environment")

    expanded = _VARIABLE.sub(replace, value)
    if "${" + DATA_ROOT_VARIABLE + "}" in value:  # a data file: missing is an error worth explaining
        found = glob.glob(expanded) if any(c in expanded for c in "*?[") else Path(expanded).exists()
        if not found:
            raise FileNotFoundError(missing_data_message(expanded, where))
    return expanded


def config_from_dict(cls: type[T], data: dict[str, Any], source: str = "config") -> T:
    """Build dataclass `cls` from a dict; unknown keys, bad types and bad values (the checks of
    `cls.__post_init__`) raise ConfigError naming `source` and the key. Environment variables in
    string values are expanded first (`expand_variables`)."""
    prefix = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}expected a mapping of settings, got {type(data).__name__}")
    hints = _hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in valid]
    if unknown:
        raise ConfigError(f"{prefix}unknown key(s) {unknown}; valid keys: {', '.join(valid)}")
    values = {k: coerce(expand_variables(v, f"{prefix}{k}"), hints[k], f"{prefix}{k}") for k, v in data.items()}
    try:
        return cls(**values)
    except ValueError as e:  # __post_init__ checks: a bad setting, whatever error class it used
        raise ConfigError(f"{prefix}{e}") from None


def _parse_override(text: str) -> tuple[str, Any]:
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # not YAML: keep the text, coercion decides
    return key, value


def apply_overrides(data: dict[str, Any], overrides: list[str], cls: type) -> dict[str, Any]:
    """Return a copy of `data` with `key=value` strings applied (`a.b=v` sets a nested key)."""
    data = dict(data)
    valid = [f.name for f in dataclasses.fields(cls)]
    for text in overrides:
        key, value = _parse_override(text)
        head, _, rest = key.partition(".")
        if head not in valid:
            raise ConfigError(f"override {text!r}: unknown key {head!r}; valid keys: {', '.join(valid)}")
        if rest:
            inner = data.get(head)
            if inner is None:
                inner = {}
            if isinstance(inner, str):  # e.g. model=bert-mini then model.hidden_dropout_prob=0
                inner = {"preset": inner}
            if not isinstance(inner, dict):
                raise ConfigError(f"override {text!r}: {head} is not a mapping, cannot set {rest!r}")
            inner = dict(inner)
            inner[rest] = value
            value = inner
        data[head] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from `path`; a missing file, bad text or bad YAML give errors naming the file
    (and line). Only plain YAML is read: tags that would build Python objects are refused."""
    data, _ = _read_yaml_lines(path)
    return data


def _read_yaml_lines(path: str | Path) -> tuple[dict[str, Any], dict[str, int]]:
    """(mapping, {top-level key: line number}) of a YAML run config."""
    import yaml

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder: name a YAML file")
    if not path.is_file():
        raise ConfigFileNotFoundError(f"config file not found: {path}")
    try:
        text = read_text(path)
        data = yaml.safe_load(text) or {}
    except CorruptFileError as e:  # not UTF-8
        raise ConfigError(str(e)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"{mark.line + 1}:" if mark is not None else ""
        raise ConfigError(f"{path}:{line} invalid YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    root = yaml.compose(text)
    lines = {k.value: k.start_mark.line + 1 for k, _ in root.value} if root is not None else {}
    return data, lines


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Dataclass `cls` from an optional YAML file, then `key=value` overrides.

    A bad value from the file is reported with its line: `run.yaml:7: clip_grad=-1.0 is out of range ...`.
    """
    data, lines = _read_yaml_lines(path) if path is not None else ({}, {})
    source = str(path) if path is not None else "overrides"
    # check file keys first so the error names the file, not the overrides
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in valid]
    if unknown:
        where = f"{source}:{lines[unknown[0]]}" if unknown[0] in lines else source
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys: {', '.join(valid)}")
    overrides = list(overrides or [])
    merged = apply_overrides(data, overrides, cls)
    overridden = {_parse_override(o)[0].partition(".")[0] for o in overrides}
    try:
        return config_from_dict(cls, merged, "")
    except FileNotFoundError as e:  # a data file the config names (below the data root)
        raise type(e)(f"{source}: {e}") from None
    except ConfigError as e:
        message = str(e)
        key = re.match(r"(\w+)", message)
        if key and key.group(1) in lines and key.group(1) not in overridden:
            raise ConfigError(f"{source}:{lines[key.group(1)]}: {message}") from None
        with_overrides = overrides and path is not None
        raise ConfigError(f"{source} (+ overrides): {message}" if with_overrides else f"{source}: {message}") from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain dict of a dataclass instance (nested containers copied)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> Path:
    """Write the dataclass as YAML, fields in declaration order."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None))
    return path


def help_table(cls: type) -> str:
    """One line per field: name (type, default): help. Used as the CLI epilog."""
    hints, helps = _hints(cls), field_help(cls)
    lines = []
    for f in dataclasses.fields(cls):
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
