"""`bert-kit serve`: a model folder behind HTTP with dynamic batching (needs `pip install bert-kit[serve]`).

Every field of `ServeConfig` is a flag (`max_batch_tokens` -> `--max-batch-tokens`), its comment the help.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from bert_kit.serving.server import ServeConfig
from bert_kit.training.runconfig import field_help

TYPES = {"int": int, "int | None": int, "float": float, "str": str, "str | None": str}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    helps, defaults = field_help(ServeConfig), ServeConfig()
    for f in fields(ServeConfig):
        flag, default = "--" + f.name.replace("_", "-"), getattr(defaults, f.name)
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", help=helps[f.name])
            continue
        shown = f" (default {default})" if default not in (None, "") else ""
        choices = ("auto", "fp32", "bf16", "fp16") if f.name == "precision" else None
        parser.add_argument(flag, type=TYPES[f.type], default=default, required=f.name == "model", choices=choices,
                            help=helps[f.name] + shown)


def run(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as e:
        raise ValueError(f"serving needs {e.name}: pip install 'bert-kit[serve]'") from None
    from bert_kit.serving import serve

    return serve(ServeConfig(**{f.name: getattr(args, f.name) for f in fields(ServeConfig)}))
