"""Options that several commands share, written once so they read the same everywhere.

Numeric flags are checked where they are defined, with the `Range` rules of the settings
(`bert_kit.checks`): `type=number(positive(integer=True))` turns `--batch-size 0` or
`--batch-size nan` into one usage line naming the flag and the range (exit 2):

    bert-kit embed: error: argument --batch-size: 0 is out of range: expected an integer >= 1
"""

from __future__ import annotations

import argparse
import functools
from typing import Any, Callable

from bert_kit.checks import ConfigError, Range, check_device, non_negative, positive
from bert_kit.data import settings_named_as


def number(rule: Range) -> Callable[[str], int | float]:
    """An argparse `type=` reading an int (`rule.integer`) or a float and checking it against `rule`."""
    kind = "an integer" if rule.integer else "a number"

    def parse(text: str) -> int | float:
        try:
            value = int(text) if rule.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}: expected {rule.describe()}") from None
        problem = rule.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(f"{text} {problem}")
        return value

    parse.__name__ = "integer" if rule.integer else "number"  # argparse's fallback messages name the type
    return parse


COUNT = number(positive(integer=True))  # batch sizes, top-k, examples: an integer >= 1
INDEX = number(non_negative(integer=True))  # a 0-based column
MAX_LENGTH = number(Range(3, integer=True, hint="room for [CLS] text [SEP]"))  # tokens per text
INTEGER = number(Range(integer=True))  # any integer (a column counted from the end: -1)
FINITE = number(Range())  # any finite number
POSITIVE = number(positive())  # a finite number > 0
SEED = number(Range(0, 2**32 - 1, integer=True))

MODEL_HELP = "model folder, run folder, or hub name with a local copy (e.g. sentence-transformers/all-MiniLM-L6-v2)"


def add_model_option(parser: argparse.ArgumentParser, what: str = "") -> None:
    """--model: a folder, a run folder (its best/ or final/), or a hub name's local copy."""
    parser.add_argument("--model", required=True, help=f"{MODEL_HELP}{'; ' + what if what else ''}")


def device_name(text: str) -> str:
    """An argparse `type=` for --device: a device name (auto, cpu, cuda, cuda:N, mps, xpu); whether
    this machine has it is checked when the device is chosen (`bert_kit.checks.resolve_device`)."""
    try:
        check_device(text, "--device")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--device=")) from None
    return text.strip()


def add_device_option(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--device, for every command that runs a model."""
    parser.add_argument("--device", type=device_name, default=default,
                        help="auto, cpu, cuda, cuda:1, mps (default: cuda if available, else cpu)")


def add_table_options(parser: argparse.ArgumentParser, rows: str = "keep only rows with this value") -> None:
    """--header, --delimiter, --where and --encoding: how a TSV/CSV/JSONL input is read (the text column is the
    command's)."""
    parser.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                        help="TSV/CSV: the first line names the columns (default: when a column is given by name)")
    parser.add_argument("--delimiter", default=None, help="field separator (default by extension; tab, comma, ...)")
    parser.add_argument("--where", action="append", metavar="COLUMN=VALUE", help=rows)
    parser.add_argument("--encoding", default=None,
                        help="text encoding of the input, a Python codec name such as latin-1, cp1252 or utf-16 "
                             "(default utf-8, with or without a byte-order mark)")


def name_settings_as_flags(parser: argparse.ArgumentParser) -> None:
    """Record the parser's flags (`text_column` -> `--text-column`), so that `flag_messages` can
    spell settings as this command takes them; call it after the last add_argument."""
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings[:1] and
             a.option_strings[0].startswith("--")}
    if "where" in flags:
        flags["validation_where"] = flags["where"]
    parser.set_defaults(setting_flags=flags)


def flag_messages(run: Callable[[argparse.Namespace], Any]) -> Callable[[argparse.Namespace], Any]:
    """A command's `run` whose messages advise its flags (`--no-header`), not run-config keys
    (`header=false`); see `bert_kit.data.setting`."""
    @functools.wraps(run)
    def with_flags(args: argparse.Namespace) -> Any:
        with settings_named_as(getattr(args, "setting_flags", None) or {}):
            return run(args)

    return with_flags
