"""`bert-kit plot`: draw the loss curve of a run folder's metrics.jsonl."""

from __future__ import annotations

import argparse
from pathlib import Path

from bert_kit.cli.errors import check_output_file
from bert_kit.training.progress import METRICS_FILE, PLOT_FILE, plot_losses



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="run folder holding metrics.jsonl")
    parser.add_argument("--output", default=None, help=f"PNG path (default RUN_DIR/{PLOT_FILE})")


def run(args: argparse.Namespace) -> int:
    check_output_file(args.output, "--output", inputs=[Path(args.run_dir) / METRICS_FILE])
    out = plot_losses(args.run_dir, args.output)
    print(out)
    return 0
