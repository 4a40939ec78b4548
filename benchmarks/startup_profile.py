"""Where a small fine-tune's wall time goes, commit against commit, launch to exit.

Runs `python -m bert_kit finetune` on GLUE's RTE files (the shipped SST-2 config with RTE's columns,
as `finetune_cli.py` case "rte" launches it) from the source of each commit in turn, alternating
the commits `--reps` times, so that a machine whose load changes treats them alike. Each commit's
`bert_kit/` and `configs/` come from `git archive`; the rest of the environment is this one.
Prints one JSON line per run (its results.json "timings", and `exit_s`: from results.json to the
process's exit) and the median of each commit. On a CPU, shrink the run to see the fixed costs:

    python benchmarks/startup_profile.py --model MINILM --data-dir DATA --commits f96e6c9,HEAD \\
        --set max_steps=3 max_eval_examples=64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from finetune_cli import COLUMNS  # the settings that read a case's columns (RTE's here)

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["wall_s", "start_s", "first_step_s", "train_s", "eval_s", "save_s", "end_s", "exit_s"]


def source_tree(commit: str, into: Path) -> Path:
    """`bert_kit/` and `configs/` of `commit`, unpacked into `into`."""
    archive = subprocess.run(["git", "archive", commit, "bert_kit", "configs"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return into


def run(tree: Path, args: argparse.Namespace, out: Path) -> dict:
    """One fine-tune from `tree`'s source, timed from launch to exit."""
    cmd = [sys.executable, "-m", "bert_kit", "finetune", "--config", str(tree / "configs" / "finetune_sst2.yaml"),
           f"model={args.model}", f"train_file={args.data_dir / 'glue/RTE/train.tsv'}",
           f"validation_file={args.data_dir / 'glue/RTE/dev.tsv'}", "epochs=3", f"output_dir={out}", "overwrite=true",
           "--output", f"{out}.json", *COLUMNS["rte"], *args.set]
    t0 = time.time()
    done = subprocess.run(cmd, cwd=out.parent, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                          text=True)
    wall = time.time() - t0
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    results = json.loads(Path(f"{out}.json").read_text())
    return {**results["timings"], "wall_s": round(wall, 3), "exit_s": round(wall - results["wall_time_s"], 3),
            "best": results["best_value"], "train_loss": results["train_loss"],
            "loss_curve": (out / "loss_curve.png").is_file()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="all-MiniLM-L6-v2 folder")
    p.add_argument("--data-dir", type=Path, required=True, help="data root holding glue/RTE/")
    p.add_argument("--commits", default="HEAD", help="comma-separated commits (HEAD: the last commit)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--set", nargs="*", default=[], help="extra key=value settings (max_steps=3 ...)")
    args = p.parse_args()
    args.model, args.data_dir = args.model.resolve(), args.data_dir.resolve()  # the runs start elsewhere
    commits = args.commits.split(",")
    rows: dict[str, list[dict]] = {c: [] for c in commits}
    with tempfile.TemporaryDirectory() as d:
        trees = {c: source_tree(c, Path(d) / f"src-{i}") for i, c in enumerate(commits)}
        for rep in range(args.reps):
            for i, commit in enumerate(commits):
                row = run(trees[commit], args, Path(d) / f"run-{i}")
                print(json.dumps({"commit": commit, "rep": rep, **row}), flush=True)
                if "error" not in row:
                    rows[commit].append(row)
    print(f"\nmedians (s)  {'commit':<12}" + "".join(f"{k[:-2]:>11}" for k in KEYS))
    for commit, runs in rows.items():
        if runs:
            print(f"{'':13}{commit:<12}" + "".join(f"{statistics.median(r[k] for r in runs):>11.2f}" for k in KEYS))


if __name__ == "__main__":
    main()
