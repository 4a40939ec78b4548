"""`bert-kit serve`: a model folder behind HTTP with dynamic batching (needs `pip install bert-kit[serve]`).

Every field of `ServeConfig` is a flag (`max_batch_tokens` -> `--max-batch-tokens`), its comment the help;
`ServeConfig` checks the values (a wrong one is a usage error, exit 2).
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from bert_kit.serving.server import PRECISIONS, ServeConfig
from bert_kit.training.runconfig import field_help

TYPES = {"int": int, "int | None": int, "float": float, "str": str, "str | None": str}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    helps = field_help(ServeConfig)
    for f in fields(ServeConfig):
        flag, default = "--" + f.name.replace("_", "-"), f.default
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", help=helps[f.name])
            continue
        shown = f" (default {default})" if default not in (None, "") else ""
        choices = PRECISIONS if f.name == "precision" else None
        parser.add_argument(flag, type=TYPES[f.type], default=default, required=f.name == "model", choices=choices,
                            help=helps[f.name] + shown)


def run(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as e:
        raise ImportError(f"serving needs {e.name}: pip install 'bert-kit[serve]'") from None  # exit 1
    from bert_kit.serving import serve

    return serve(ServeConfig(**{f.name: getattr(args, f.name) for f in fields(ServeConfig)}))
