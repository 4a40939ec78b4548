"""`bert-kit pretrain`: MLM (+ NSP) pretraining from a YAML run config (see bert_kit/tasks/pretraining.py)."""

from __future__ import annotations

import argparse

from bert_kit.cli.common import add_run_arguments, load_run_settings, run_training
from bert_kit.tasks.pretraining import PretrainConfig, pretrain


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, PretrainConfig)


def run(args: argparse.Namespace) -> int:
    return run_training(args, pretrain, load_run_settings(args, PretrainConfig, list(args.overrides)), None)
