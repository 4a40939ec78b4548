"""What `bert-kit pretrain` and `bert-kit finetune` share: reading their run settings and running them."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any, Callable

from bert_kit.checks import ConfigError
from bert_kit.cli.errors import check_output_dir, check_output_file
from bert_kit.outputs import write_text
from bert_kit.training.runconfig import add_config_arguments, apply_overrides, config_from_dict, load_config


def add_run_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """--config FILE, key=value overrides, --output JSON and --resume CKPT."""
    add_config_arguments(parser, cls)
    parser.add_argument("--output", metavar="JSON", help="also write the results JSON here")
    parser.add_argument("--resume", metavar="CKPT",
                        help='checkpoint folder, run folder, or "latest" (newest in output_dir)')


def load_run_settings(args: argparse.Namespace, cls: type, overrides: list[str]) -> Any:
    """The config file (or, resuming without one, the checkpoint's run config), then overrides."""
    listed = f"`bert-kit {args.command} --help` lists the settings"  # the end of an unknown-key error
    if args.config is None and args.resume not in (None, "latest"):
        # resuming without --config: start from the run config stored in the checkpoint
        from bert_kit.training.checkpoint import load_trainer_state, resolve_checkpoint

        data = load_trainer_state(resolve_checkpoint(args.resume))["run_config"]
        return config_from_dict(cls, apply_overrides(data, overrides, cls, listed), str(args.resume), listed)
    if args.config is None and not overrides:
        raise ConfigError(f"pass --config FILE (and optional key=value overrides); see bert-kit {args.command} --help")
    return load_config(cls, args.config, overrides, listed)


def run_training(args: argparse.Namespace, train: Callable[..., dict], cfg: Any, shown: tuple[str, ...] | None) -> int:
    """Run `train(cfg, resume=...)`, write --output, print the results (the `shown` keys, or all);
    exit 0, 1 for a failed run, 130/143 after SIGINT/SIGTERM."""
    # torch comes with these: the settings were checked before it, so a mistyped key fails at once
    from bert_kit.training.distributed import DistributedError, cleanup, is_main
    from bert_kit.training.run_folder import protected_files
    from bert_kit.training.trainer import NonFiniteLossError

    check_output_dir(cfg.output_dir, "output_dir")  # before any work, not when the results are written
    check_output_file(args.output, "--output", inputs=[args.config, *protected_files(cfg)])
    main = True
    try:
        results = train(cfg, resume=args.resume, started=args.started)
        main = is_main()  # asked before leaving the group: afterwards every process is "rank 0"
    except (NonFiniteLossError, DistributedError) as e:
        print(f"bert-kit {args.command}: error: {e}", file=sys.stderr)
        return 1
    finally:
        cleanup()  # leave the process group (torchrun runs)
    if args.output and main:
        write_text(args.output, json.dumps(results, indent=2) + "\n")
    if main:
        print(json.dumps({k: results.get(k) for k in shown} if shown else results, indent=2))
    from bert_kit.training.results import interrupted

    if interrupted(results):  # (early stopping ends a run as its last step does: 0)
        return 128 + int(signal.Signals[interrupted(results)])  # 130 for SIGINT, 143 for SIGTERM
    return 0
