"""`bert-kit pretrain`: MLM (+ NSP) pretraining from a YAML run config (see bert_kit/tasks/pretraining.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import signal

from bert_kit.checks import ConfigError
from bert_kit.cli.errors import check_output_dir, check_output_file
from bert_kit.tasks.pretraining import PretrainConfig, pretrain
from bert_kit.training.checkpoint import load_trainer_state, resolve_checkpoint
from bert_kit.training.distributed import DistributedError, cleanup, is_main
from bert_kit.training.runconfig import add_config_arguments, config_from_dict, load_config
from bert_kit.training.trainer import NonFiniteLossError



def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, PretrainConfig)
    parser.add_argument("--output", metavar="JSON", help="also write the results JSON here")
    parser.add_argument("--resume", metavar="CKPT",
                        help='checkpoint folder, run folder, or "latest" (newest in output_dir)')


def run(args: argparse.Namespace) -> int:
    if args.config is None and args.resume not in (None, "latest"):
        # resuming without --config: start from the run config stored in the checkpoint
        data = load_trainer_state(resolve_checkpoint(args.resume))["run_config"]
        from bert_kit.training.runconfig import apply_overrides

        cfg = config_from_dict(PretrainConfig, apply_overrides(data, args.overrides, PretrainConfig), str(args.resume))
    elif args.config is None and not args.overrides:
        raise ConfigError("pass --config FILE (and optional key=value overrides); see bert-kit pretrain --help")
    else:
        cfg = load_config(PretrainConfig, args.config, args.overrides)
    check_output_dir(cfg.output_dir, "output_dir")  # before any work, not when the results are written
    check_output_file(args.output, "--output")
    main = True
    try:
        results = pretrain(cfg, resume=args.resume)
        main = is_main()  # asked before leaving the group: afterwards every process is "rank 0"
    except (NonFiniteLossError, DistributedError) as e:
        print(f"bert-kit pretrain: error: {e}", file=sys.stderr)
        return 1
    finally:
        cleanup()  # leave the process group (torchrun runs)
    if args.output and main:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    if main:
        print(json.dumps(results, indent=2))
    if results["stopped"]:
        return 128 + int(signal.Signals[results["stopped"]])  # 130 for SIGINT, 143 for SIGTERM
    return 0
