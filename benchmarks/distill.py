"""Distillation: a 3-layer student of a fine-tuned 6-layer SST-2 classifier, its accuracy and latency.

1. the teacher: `bert-kit finetune` on configs/finetune_sst2.yaml (all-MiniLM-L6-v2, 6 layers), or
   --teacher FOLDER to reuse one;
2. the student: configs/distill_sst2.yaml, the teacher's layers 0, 2 and 4 (DistilBERT's
   initialisation) trained on its soft labels mixed with the gold labels (alpha 0.5, T 2);
3. the same 3-layer start trained on the gold labels alone (alpha 0), for as many steps: what the
   teacher adds;
then each model's dev accuracy and its latency: the forward pass over the dev sentences in batches
of --batch (padded to the longest in the batch, as `predict` runs them), median of --repeats passes,
on the CPU (--threads) and on the GPU where there is one.

    python benchmarks/distill.py --model MINILM --data-dir DATA                         # all of SST-2 (GPU)
    python benchmarks/distill.py --model MINILM --data-dir DATA --max-train 4000 --max-eval 872 --device cpu

One JSON line per model goes to --out; a table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bert_kit.heads import BERTForSequenceClassification  # noqa: E402
from bert_kit.tasks.finetuning import FinetuneConfig, finetune  # noqa: E402
from bert_kit.tokenizer import get_tokenizer  # noqa: E402
from bert_kit.training.runconfig import load_config  # noqa: E402


def train(config: str, overrides: list[str]) -> dict:
    return finetune(load_config(FinetuneConfig, ROOT / "configs" / config, overrides))


def latency(folder: Path, texts: list[str], batch: int, device: str, repeats: int) -> float:
    """Median seconds of one pass of the model over `texts` (batches of `batch`, padded per batch)."""
    model = BERTForSequenceClassification.from_pretrained(folder).to(device).eval()
    tokenizer = get_tokenizer(folder)
    batches = []
    for start in range(0, len(texts), batch):  # padded to the longest of the batch
        enc = tokenizer(texts[start:start + batch], max_length=128)
        batches.append((enc["input_ids"].to(device), enc["attention_mask"].to(device)))
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):  # the first pass warms up
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for ids, mask in batches:
                model(ids, mask)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--teacher", type=Path, help="a fine-tuned SST-2 folder to distil (default: fine-tune one)")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--max-train", type=int, default=None)
    parser.add_argument("--max-eval", type=int, default=None)
    parser.add_argument("--device", default="auto", help="where the models train")
    parser.add_argument("--batch", type=int, default=32, help="sentences per batch when timing")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads when timing (default: torch's)")
    parser.add_argument("--set", nargs="*", default=[], help="more overrides of the student runs (key=value)")
    parser.add_argument("--out", type=Path, default=Path("distill_benchmark.jsonl"))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="distill_"))
    data = [f"train_file={args.data_dir / 'sst2' / 'train.tsv'}", f"validation_file={args.data_dir / 'sst2' / 'dev.tsv'}",
            f"device={args.device}", f"epochs={args.epochs}", "eval_every=0", "report_to=[]"]
    data += [f"max_train_examples={args.max_train}"] if args.max_train else []
    data += [f"max_eval_examples={args.max_eval}"] if args.max_eval else []
    rows = []
    if args.teacher is None:
        teacher = train("finetune_sst2.yaml", [f"model={args.model}", f"output_dir={work / 'teacher'}", *data])
        rows.append({"model": "teacher", "accuracy": teacher["best_value"], "train_time_s": teacher["train_time_s"]})
        args.teacher = work / "teacher"
    student = train("distill_sst2.yaml", [f"distill.teacher={args.teacher}", f"model={args.teacher}",
                                          f"output_dir={work / 'student'}", *data, *args.set])
    if not rows:
        rows.append({"model": "teacher", "accuracy": student["teacher_metrics"]["accuracy"], "train_time_s": None})
    rows.append({"model": "student (distilled)", "accuracy": student["best_value"],
                 "train_time_s": student["train_time_s"]})
    alone = train("distill_sst2.yaml", [f"distill.teacher={args.teacher}", f"model={args.teacher}", "distill.alpha=0",
                                        f"output_dir={work / 'labels'}", *data, *args.set])
    rows.append({"model": "student (labels only)", "accuracy": alone["best_value"], "train_time_s": alone["train_time_s"]})

    from bert_kit.model_folder import resolve_model

    folders = [resolve_model(args.teacher), work / "student" / "best", work / "labels" / "best"]
    texts = [line.split("\t")[0] for line in (args.data_dir / "sst2" / "dev.tsv").read_text().splitlines()[1:]]
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for row, folder in zip(rows, folders):
        model = BERTForSequenceClassification.from_pretrained(folder)
        row.update(layers=model.config.num_hidden_layers, parameters=sum(p.numel() for p in model.parameters()))
        for device in devices:
            row[f"{device}_s"] = latency(folder, texts, args.batch, device, args.repeats)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps({**row, "train_examples": student["num_train_examples"], "epochs": args.epochs}) + "\n")
    print(f"\nSST-2 dev ({len(texts)} sentences), students of {args.teacher}; {student['num_train_examples']} training "
          f"examples, {args.epochs:g} epoch(s); latency: one pass over dev, batches of {args.batch}, "
          f"{torch.get_num_threads()} CPU threads")
    head = f"{'model':22} {'layers':>6} {'params':>8} {'accuracy':>8}" + "".join(f" {d + ' s':>8} {'speed-up':>8}"
                                                                                 for d in devices)
    print(head)
    for row in rows:
        cells = "".join(f" {row[f'{d}_s']:8.3f} {rows[0][f'{d}_s'] / row[f'{d}_s']:7.2f}x" for d in devices)
        print(f"{row['model']:22} {row['layers']:6d} {row['parameters'] / 1e6:7.1f}M {row['accuracy']:8.4f}{cells}")


if __name__ == "__main__":
    main()
