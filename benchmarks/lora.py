"""LoRA beside full fine-tuning: accuracy, peak memory, step time and the size of what is saved.

Both variants are `bert-kit finetune` on configs/finetune_sst2.yaml (SST-2 from all-MiniLM-L6-v2,
the same data, batch, epochs and seed), each in a process of its own so that its peak memory is
its own: `full` trains every weight, `lora` the adapters of configs/finetune_sst2_lora.yaml
(rank 8 on query and value, the head whole; lr: auto is 2e-3, 20x the full fine-tune's). Step
time is the loop's own (train_time_s / steps, without start-up and evaluations); peak memory is
torch.cuda.max_memory_allocated on a GPU, the process's peak RSS on a CPU; the saved size is the
model folder's weights file (model.safetensors, or adapter_model.safetensors).

    python benchmarks/lora.py --model MINILM --data-dir DATA                      # the whole of SST-2 (GPU)
    python benchmarks/lora.py --model MINILM --data-dir DATA --max-train 2000 --max-eval 300 --device cpu

One JSON line per variant goes to --out; a table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {"full": "finetune_sst2.yaml", "lora": "finetune_sst2_lora.yaml"}


def run_variant(args: argparse.Namespace) -> dict:
    """One fine-tune, in this process; its figures."""
    import torch

    from bert_kit.tasks.finetuning import FinetuneConfig, finetune
    from bert_kit.training.runconfig import load_config

    out = Path(args.work) / args.variant
    overrides = [f"model={args.model}", f"train_file={args.data_dir / 'sst2' / 'train.tsv'}",
                 f"validation_file={args.data_dir / 'sst2' / 'dev.tsv'}", f"output_dir={out}", f"device={args.device}",
                 f"epochs={args.epochs}", "report_to=[]", "eval_every=0", "overwrite=true", *args.set]
    if args.max_train:
        overrides.append(f"max_train_examples={args.max_train}")
    if args.max_eval:
        overrides.append(f"max_eval_examples={args.max_eval}")
    cfg = load_config(FinetuneConfig, ROOT / "configs" / CONFIGS[args.variant], overrides)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    results = finetune(cfg)
    weights = next(f for f in (out / "best" / "model.safetensors", out / "best" / "adapter_model.safetensors")
                   if f.is_file())
    peak = (torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    trained = results.get("lora_trainable_parameters")
    return {"variant": args.variant, "accuracy": results["best_value"], "steps": results["steps"],
            "step_ms": 1000 * results["train_time_s"] / max(1, results["steps"]),
            "examples_per_s": results["examples_per_second"], "wall_time_s": results["wall_time_s"],
            "peak_memory_mb": peak / 2**20, "memory_kind": "cuda allocated" if cuda else "process RSS",
            "saved_mb": weights.stat().st_size / 2**20, "saved_file": weights.name,
            "trainable_parameters": trained, "lr": cfg.lr, "device": str(results["precision"]),
            "num_train_examples": results["num_train_examples"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--variants", default="full,lora")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-train", type=int, default=None)
    parser.add_argument("--max-eval", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--set", nargs="*", default=[], help="more overrides for both variants (key=value)")
    parser.add_argument("--out", type=Path, default=Path("lora_benchmark.jsonl"))
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # the child's one variant
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for variant in args.variants.split(","):
            command = [sys.executable, __file__, "--variant", variant, "--work", work, "--model", args.model,
                       "--data-dir", str(args.data_dir), "--epochs", str(args.epochs), "--device", args.device,
                       *(["--max-train", str(args.max_train)] if args.max_train else []),
                       *(["--max-eval", str(args.max_eval)] if args.max_eval else []),
                       *(["--set", *args.set] if args.set else [])]
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print(f"\nSST-2 from {args.model}, {rows[0]['num_train_examples']} training examples, {args.epochs:g} epoch(s), "
          f"{rows[0]['device']}")
    print(f"{'variant':8} {'accuracy':>8} {'step ms':>8} {'ex/s':>8} {'peak MB':>9} {'saved MB':>9} {'trained':>10}")
    for r in rows:
        trained = f"{r['trainable_parameters']:,}" if r["trainable_parameters"] else "all"
        print(f"{r['variant']:8} {r['accuracy']:8.4f} {r['step_ms']:8.1f} {r['examples_per_s']:8.0f} "
              f"{r['peak_memory_mb']:9.0f} {r['saved_mb']:9.2f} {trained:>10}")
    print(f"(peak memory: {rows[0]['memory_kind']})")


if __name__ == "__main__":
    main()
