"""Tokens/s of the whole `bert-kit pretrain` loop (data loading, logging, checks), not only its steps.

`pretrain_throughput.py` times the model's training step with CUDA events; this runs the command
line on WikiText sentence pairs (MLM + NSP) and reads the throughput the run itself logs (real,
non-padding tokens over wall time, every `log_every` steps), for several settings one after the
other, optionally next to another checkout of bert-kit (`--baseline-src`, e.g. an older commit
from `git archive`), so a change to the loop is measured against what it replaces.

    python benchmarks/pretrain_loop.py --data wikitext-2 --tokenizer MINILM \\
        --runs "compile=true" "compile=true cuda_graphs=true" --baseline-src /tmp/old_bert_kit
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


def run_loop(src: Path, overrides: list[str], args: argparse.Namespace, out: Path) -> dict:
    """One `python -m bert_kit pretrain` run from checkout `src`; median tokens/s after warm-up."""
    cmd = [sys.executable, "-m", "bert_kit", "pretrain", "--config", str(REPO / "configs/pretrain_wikitext_mini.yaml"),
           f"model={args.model}", "train_tokenizer=null", f"tokenizer={args.tokenizer.resolve()}",
           f"train_files=[{(args.data / 'train.txt').resolve()}]", f"eval_files=[{(args.data / 'valid.txt').resolve()}]",
           f"batch_size={args.batch}", f"max_steps={args.steps}", "lr=1e-4", "eval_every=0", "eval_batches=4",
           "save_every=100000", f"log_every={args.log_every}", f"num_workers={args.workers}", f"output_dir={out}",
           *overrides]
    proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)})
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train" and r["step"] >= args.skip]
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in train), "windows": len(train),
            "final_loss": train[-1]["loss"], "eval_mlm_loss": results.get("test_mlm_loss")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="folder with train.txt and valid.txt (WikiText-2)")
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--model", default="bert-base-uncased")
    p.add_argument("--runs", nargs="+", default=["compile=true"], help="override sets, one string per run")
    p.add_argument("--baseline-src", type=Path, help="another bert-kit checkout, run with the first override set")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--skip", type=int, default=60, help="windows logged before this step (compilation) are left out")
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()
    plan = [(f"bert-kit {r}", REPO, r.split()) for r in args.runs]
    if args.baseline_src:
        plan.insert(0, (f"baseline {args.runs[0]}", args.baseline_src, args.runs[0].split()))
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, src, overrides) in enumerate(plan):
            r = run_loop(src, overrides, args, Path(tmp) / f"run{i}")
            if "error" in r:
                print(f"  {name:50s} FAILED: {r['error'][:200]}", flush=True)
                continue
            eval_loss = f"{r['eval_mlm_loss']:.3f}" if r["eval_mlm_loss"] is not None else "-"
            print(f"  {name:50s} {r['tokens_per_s'] / 1e3:8.1f}k tokens/s (median of {r['windows']} windows)  "
                  f"loss {r['final_loss']:.3f}  eval MLM loss {eval_loss}", flush=True)


if __name__ == "__main__":
    main()
