"""`bert-kit finetune`: fine-tune a model on one of the four tasks (see bert_kit/tasks/finetuning.py)."""

from __future__ import annotations

import argparse

from bert_kit.checks import ConfigError
from bert_kit.cli.common import add_run_arguments, load_run_settings, run_training
from bert_kit.tasks import TASKS
from bert_kit.tasks.finetuning_config import FinetuneConfig
from bert_kit.training.runconfig import read_yaml

SHOWN = ("task", "metric", "best_value", "best_step", "steps", "train_loss", "examples_per_second", "best_model",
         "wall_time_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=TASKS, default=None, help="the task (or `task:` in the config)")
    add_run_arguments(parser, FinetuneConfig)


def load_run_config(args: argparse.Namespace) -> FinetuneConfig:
    """The config file (or, resuming without one, the checkpoint's run config), then overrides and --task."""
    overrides = list(args.overrides)
    if args.task is not None:
        overrides.append(f"task={args.task}")
        in_file = read_yaml(args.config).get("task") if args.config is not None else None
        if in_file is not None and in_file != args.task:
            raise ConfigError(f"--task {args.task} contradicts task: {in_file} in {args.config}")
    return load_run_settings(args, FinetuneConfig, overrides)


def run(args: argparse.Namespace) -> int:
    cfg = load_run_config(args)  # before torch is imported: a bad setting fails at once
    from bert_kit.tasks.finetuning import finetune

    return run_training(args, finetune, cfg, SHOWN)
