"""`bert-kit tune`: a hyperparameter search over a fine-tuning config's `search:` block, with Optuna
(bert_kit/tasks/search.py; `pip install "bert-kit[search]"`).

    bert-kit tune --config configs/tune_sst2.yaml --trials 20
    bert-kit tune --config configs/tune_sst2.yaml --trials 30     # continues the same study to 30
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from bert_kit.cli.errors import check_output_dir
from bert_kit.tasks.finetuning_config import FinetuneConfig
from bert_kit.training.runconfig import add_config_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, FinetuneConfig, required=True)
    parser.add_argument("--trials", type=int, required=True, metavar="N",
                        help="finished trials the study should hold (rerunning the command continues it)")
    parser.add_argument("--study", metavar="DIR", help="study folder (default: the config's output_dir)")
    parser.add_argument("--pruner", choices=("median", "hyperband", "none"), default="median",
                        help="ends trials that trail the others at an evaluation (default median)")


def run(args: argparse.Namespace) -> int:
    from bert_kit.checks import ConfigError
    from bert_kit.tasks.search import read_search

    if args.trials < 1:
        raise ConfigError(f"--trials {args.trials}: expected a number of trials >= 1")
    spec, base = read_search(args.config, args.overrides)  # before torch and optuna: a bad range fails at once
    folder = Path(args.study or base.output_dir)
    check_output_dir(folder, "--study")
    try:
        import optuna  # noqa: F401
    except ModuleNotFoundError:
        raise ImportError('bert-kit tune needs optuna: pip install "bert-kit[search]"') from None
    from bert_kit.tasks.search import tune

    outcome = tune(spec, base, args.trials, folder, args.pruner)
    summary = outcome["summary"]
    print(summary["table"], file=sys.stderr)
    if outcome["stopped"]:
        print(f"interrupted: the study in {folder} resumes with the same command", file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.items() if k != "table"}, indent=2))
    return 128 + int(signal.Signals[outcome["stopped"]]) if outcome["stopped"] else 0
