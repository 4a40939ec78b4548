"""`bert-kit finetune`: fine-tune a model on one of the four tasks (see bert_kit/tasks/finetuning.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import signal

from bert_kit.checks import ConfigError
from bert_kit.cli.errors import check_output_dir, check_output_file
from bert_kit.tasks import TASKS
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.training.checkpoint import load_trainer_state, resolve_checkpoint
from bert_kit.training.distributed import DistributedError, cleanup, is_main
from bert_kit.training.runconfig import add_config_arguments, apply_overrides, config_from_dict, load_config
from bert_kit.training.trainer import NonFiniteLossError



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=TASKS, default=None, help="the task (or `task:` in the config)")
    add_config_arguments(parser, FinetuneConfig)
    parser.add_argument("--output", metavar="JSON", help="also write the results JSON here")
    parser.add_argument("--resume", metavar="CKPT",
                        help='checkpoint folder, run folder, or "latest" (newest in output_dir)')


def load_run_config(args: argparse.Namespace) -> FinetuneConfig:
    """The config file (or, resuming without one, the checkpoint's run config), then overrides and --task."""
    overrides = list(args.overrides)
    if args.task is not None:
        overrides.append(f"task={args.task}")
    if args.config is None and args.resume not in (None, "latest"):
        data = load_trainer_state(resolve_checkpoint(args.resume))["run_config"]
        return config_from_dict(FinetuneConfig, apply_overrides(data, overrides, FinetuneConfig), str(args.resume))
    if args.config is None and not args.overrides:
        raise ConfigError("pass --config FILE (and optional key=value overrides); see bert-kit finetune --help")
    if args.config is not None and args.task is not None:
        from bert_kit.training.runconfig import read_yaml

        in_file = read_yaml(args.config).get("task")
        if in_file is not None and in_file != args.task:
            raise ConfigError(f"--task {args.task} contradicts task: {in_file} in {args.config}")
    return load_config(FinetuneConfig, args.config, overrides)


def run(args: argparse.Namespace) -> int:
    cfg = load_run_config(args)
    check_output_dir(cfg.output_dir, "output_dir")  # before any work, not when the results are written
    check_output_file(args.output, "--output")
    main = True
    try:
        results = finetune(cfg, resume=args.resume)
        main = is_main()  # asked before leaving the group: afterwards every process is "rank 0"
    except (NonFiniteLossError, DistributedError) as e:
        print(f"bert-kit finetune: error: {e}", file=sys.stderr)
        return 1
    finally:
        cleanup()  # leave the process group (torchrun runs)
    if args.output and main:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    if main:
        summary = {k: results[k] for k in ("task", "metric", "best_value", "best_step", "steps", "train_loss",
                                            "best_model", "wall_time_s")}
        print(json.dumps(summary, indent=2))
    if results["stopped"]:
        return 128 + int(signal.Signals[results["stopped"]])  # 130 for SIGINT, 143 for SIGTERM
    return 0
