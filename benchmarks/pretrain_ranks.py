"""Tokens/s of `bert-kit pretrain` under torchrun beside one GPU, and beside other checkouts.

Runs the 6-minute recipe (`configs/pretrain_cram.yaml`, bert-small) for a short time budget with
`torchrun --nproc_per_node N`, from this checkout and from each `--other NAME=SRC` (another
checkout, e.g. `git archive` of an older commit), then on one GPU, and prints the steady tokens/s
each run logs itself (the median of its train records after the first 30% of its steps: start-up
and compilation left out) and each run's multiple of one GPU.

    python benchmarks/pretrain_ranks.py --corpus CORPUS --tokenizer runs/cram_tokenizer --nproc 4 \\
        --steps 1500 --other ddp=/tmp/before --out results/pretrain_ranks.jsonl

(`/tmp/before`: `git archive 398288a^ bert_kit | tar -x -C /tmp/before`, the code with DDP.)

The runs start their own clocks at launch, so a short budget leaves fewer steps to a run that
compiles longer (with empty compile caches, a minute's budget can end at the first step): `--steps N`
gives every run N steps instead. The figure compared is the rate once compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(src: Path, nproc: int, args: argparse.Namespace, out: Path) -> dict:
    """One pretraining run of checkout `src` on `nproc` GPUs; its steady tokens/s from metrics.jsonl."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    corpus = args.corpus.resolve()
    cmd = [*(launcher if nproc > 1 else [sys.executable]), "-m", "bert_kit", "pretrain",
           "--config", str(REPO / "configs" / "pretrain_cram.yaml"), f"tokenizer={args.tokenizer.resolve()}",
           f"train_files=[{corpus / 'wiki'},{corpus / 'gutenberg'}]", f"eval_files=[{corpus / 'heldout'}]",
           *([f"max_steps={args.steps}", "time_budget=null"] if args.steps else [f"time_budget={args.budget}"]),
           f"output_dir={out}", "overwrite=true", *args.set]
    env = {**os.environ, "PYTHONPATH": str(src), "NCCL_NVLS_ENABLE": "0"}
    # run outside any checkout: `python -m` puts the working directory before PYTHONPATH
    proc = subprocess.run(cmd, cwd=out.parent, capture_output=True, text=True, env=env)
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    last = train[-1]["step"]
    steady = [r["tokens_per_s"] for r in train if r["step"] > 0.3 * last]
    mode = next((line.split("ranks (")[1].rstrip(")") for line in proc.stdout.splitlines() if "ranks (" in line), "")
    return {"steps": last, "tokens_per_s": statistics.median(steady), "windows": len(steady),
            "final_train_loss": train[-1]["loss"], "mode": mode}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help="the shared corpus (wiki/, gutenberg/, heldout/)")
    p.add_argument("--tokenizer", type=Path, required=True, help="the recipe's WordPiece tokenizer folder")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--budget", default="60s", help="each run's time_budget, launch to exit")
    p.add_argument("--steps", type=int, default=0, help="a number of steps instead of the budget (every run as long)")
    p.add_argument("--other", nargs="*", default=[], help="NAME=SRC: another checkout run the same way")
    p.add_argument("--set", nargs="*", default=[], help="extra key=value settings for every run")
    p.add_argument("--out", type=Path, help="append one JSON line per run here")
    args = p.parse_args()
    sides = [("this", REPO)] + [(o.split("=", 1)[0], Path(o.split("=", 1)[1]).resolve()) for o in args.other]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in sides:
            rows.append({"side": name, "gpus": args.nproc, **run(src, args.nproc, args, Path(tmp) / name)})
            print(json.dumps(rows[-1]), flush=True)
        rows.append({"side": "this", "gpus": 1, **run(REPO, 1, args, Path(tmp) / "one")})
        print(json.dumps(rows[-1]), flush=True)
    one = rows[-1].get("tokens_per_s")
    print(f"\n{'side':<10} {'GPUs':>4} {'tokens/s':>10} {'x one GPU':>9}  mode")
    for r in rows:
        rate = r.get("tokens_per_s")
        if rate is None:
            print(f"{r['side']:<10} {r['gpus']:>4}  failed: {r['error']}")
            continue
        multiple = rate / one if one else float("nan")
        print(f"{r['side']:<10} {r['gpus']:>4} {rate / 1e6:>9.3f}M {multiple:>8.2f}x  {r['mode']}")
    if args.out:
        with args.out.open("a") as f:
            for r in rows:
                f.write(json.dumps({**r, "budget": args.budget}) + "\n")


if __name__ == "__main__":
    main()
