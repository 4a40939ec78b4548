"""Options that several commands share, written once so they read the same everywhere."""

from __future__ import annotations

import argparse

MODEL_HELP = "model folder, run folder, or hub name with a local copy (e.g. sentence-transformers/all-MiniLM-L6-v2)"


def add_model_option(parser: argparse.ArgumentParser, what: str = "") -> None:
    """--model: a folder, a run folder (its best/ or final/), or a hub name's local copy."""
    parser.add_argument("--model", required=True, help=f"{MODEL_HELP}{'; ' + what if what else ''}")


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """--device, for every command that runs a model."""
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available, else cpu)")


def add_table_options(parser: argparse.ArgumentParser, rows: str = "keep only rows with this value") -> None:
    """--header, --delimiter and --where: how a TSV/CSV/JSONL input is read (the text column is the command's)."""
    parser.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                        help="TSV/CSV: the first line names the columns (default: when a column is given by name)")
    parser.add_argument("--delimiter", default=None, help="field separator (default by extension; tab, comma, ...)")
    parser.add_argument("--where", action="append", metavar="COLUMN=VALUE", help=rows)
