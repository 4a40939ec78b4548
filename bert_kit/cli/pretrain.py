"""`bert-kit pretrain`: MLM (+ NSP) pretraining from a YAML run config (see bert_kit/tasks/pretraining.py)."""

from __future__ import annotations

import argparse

from bert_kit.cli.common import add_run_arguments, load_run_settings, run_training
from bert_kit.tasks.pretraining_config import PretrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, PretrainConfig)


def run(args: argparse.Namespace) -> int:
    cfg = load_run_settings(args, PretrainConfig, list(args.overrides))  # before torch: a bad setting fails at once
    from bert_kit.tasks.pretraining import pretrain

    return run_training(args, pretrain, cfg, None)
