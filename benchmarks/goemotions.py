"""Multi-label fine-tuning: `bert-kit finetune` on GoEmotions beside a `transformers` loop, same recipe.

GoEmotions (28 emotions, 43,410 / 5,426 / 5,427 Reddit comments, one or more labels each) is read
as distributed (`text \\t 8,20 \\t id`, no header, emotions.txt naming the ids). Each side is its own
process (or two), launched as a user launches it and timed from launch to exit, as
`benchmarks/finetune_cli.py` times the other fine-tuning comparisons (whose helpers this reuses):
* bert-kit: `python -m bert_kit finetune --config configs/finetune_goemotions.yaml` with only the
  model, data paths and output_dir set (sigmoid outputs, BCE, thresholds tuned per label on dev,
  best/ by dev macro F1), then `python -m bert_kit evaluate --model RUN/best --data test.tsv`;
* hf-loop: `benchmarks/hf_finetune.py --task goemotions`: `AutoModelForSequenceClassification` with
  `problem_type="multi_label_classification"`, the config's lr, batch, epochs, warmup, max_length,
  seed and threshold rule (per label on dev, scikit-learn's F1 over the same grid), the best dev
  epoch kept, its test macro F1.
Printed: test macro F1 of both (target: within 0.5 point), each side's wall time (target: bert-kit
at least 3x faster on one GPU), steady steps/s and the best dev macro F1.

    python benchmarks/goemotions.py --model MINILM --data-dir DATA                 # the full run (GPU)
    python benchmarks/goemotions.py --model MINILM --data-dir DATA --seeds 1,2,3   # each side's mean of 3 seeds
    python benchmarks/goemotions.py --model MINILM --data-dir DATA --limit 400 --epochs 1   # CPU smoke check
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from finetune_cli import ROOT, steady_rate, timed, train_records, warm_up  # noqa: E402

CONFIG = ROOT / "configs" / "finetune_goemotions.yaml"
FILES = ("train.tsv", "dev.tsv", "test.tsv", "emotions.txt")


def data_folder(source: Path, limit: int | None, tmp: Path) -> Path:
    """GoEmotions' folder, or (limit) a copy holding the first `limit` training rows and a quarter as
    many dev and test rows, for a quick check."""
    if limit is None:
        return source
    out = tmp / "goemotions"
    out.mkdir()
    for name in FILES:
        lines = (source / name).read_text(encoding="utf-8").splitlines()
        n = {"train.tsv": limit, "emotions.txt": len(lines)}.get(name, max(limit // 4, 20))
        (out / name).write_text("\n".join(lines[:n]) + ("\n" if name != "emotions.txt" else ""), encoding="utf-8")
    return out


def recipe(epochs: float | None) -> dict:
    """The settings both sides train with, from the shipped config."""
    cfg = yaml.safe_load(CONFIG.read_text())
    return {"lr": cfg["lr"], "batch_size": cfg["batch_size"], "epochs": epochs or cfg["epochs"],
            "max_length": cfg["max_length"], "seed": cfg["seed"], "warmup_fraction": cfg["warmup_fraction"],
            "threshold": cfg["classification"]["threshold"]}


def run_bertkit(args: argparse.Namespace, data: Path, r: dict, tmp: Path) -> dict:
    out = tmp / "bertkit-run"
    cmd = [sys.executable, "-m", "bert_kit", "finetune", "--config", str(CONFIG), f"model={args.model}",
           f"train_file={data / 'train.tsv'}", f"validation_file={data / 'dev.tsv'}",
           f"classification.label_names_file={data / 'emotions.txt'}", f"epochs={r['epochs']}", f"seed={r['seed']}",
           f"output_dir={out}", "overwrite=true", "--output", str(tmp / "bertkit.json"), *args.bertkit_set]
    wall, code = timed(cmd, tmp / "bertkit-finetune.log")
    if code != 0:
        return {"impl": "bert-kit", "error": (tmp / "bertkit-finetune.log").read_text()[-3000:]}
    evaluate = [sys.executable, "-m", "bert_kit", "evaluate", "--model", str(out / "best"), "--data",
                str(data / "test.tsv"), "--output", str(tmp / "bertkit-test.json")]
    eval_wall, code = timed(evaluate, tmp / "bertkit-evaluate.log")
    if code != 0:
        return {"impl": "bert-kit", "error": (tmp / "bertkit-evaluate.log").read_text()[-3000:]}
    results = json.loads((tmp / "bertkit.json").read_text())
    test = json.loads((tmp / "bertkit-test.json").read_text())
    return {"impl": "bert-kit", "wall_s": wall + eval_wall, "finetune_wall_s": wall, "evaluate_wall_s": eval_wall,
            "steps": results["steps"], "steady_steps_per_s": steady_rate(train_records(out)),
            "dev_macro_f1": results["best_value"], "test_macro_f1": test["f1"], "test_micro_f1": test["f1_micro"],
            "timings": results.get("timings")}


def run_hf(args: argparse.Namespace, data: Path, r: dict, tmp: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "hf_finetune.py"), "--impl", "loop", "--task", "goemotions",
           "--model", str(args.model), "--data-dir", str(data), "--epochs", str(r["epochs"]), "--lr", str(r["lr"]),
           "--batch-size", str(r["batch_size"]), "--max-length", str(r["max_length"]), "--seed", str(r["seed"]),
           "--warmup-fraction", str(r["warmup_fraction"]), "--threshold", str(r["threshold"])]
    log = tmp / "hf-loop.log"
    wall, code = timed(cmd, log)
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    if code != 0 or not lines:
        return {"impl": "hf-loop", "error": log.read_text()[-3000:]}
    row = json.loads(lines[-1])
    return {"impl": "hf-loop", "wall_s": wall, "steps": row["steps"], "steady_steps_per_s": row["steady_steps_per_s"],
            "dev_macro_f1": row["best"], "test_macro_f1": row["test_macro_f1"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="all-MiniLM-L6-v2 folder")
    p.add_argument("--data-dir", type=Path, required=True, help="the data root (holding goemotions/)")
    p.add_argument("--limit", type=int, default=None, help="train on the first N rows (N/4 dev and test): a quick check")
    p.add_argument("--epochs", type=float, default=None, help="override the config's epochs (quick checks)")
    p.add_argument("--impls", default="bertkit,hf-loop")
    p.add_argument("--seeds", default=None, help="comma-separated seeds, each side trained once per seed and the "
                                                  "means compared (default: the config's seed)")
    p.add_argument("--bertkit-set", nargs="*", default=[], help="extra key=value settings for bert-kit")
    p.add_argument("--out", type=Path, default=None, help="append one JSON line per run here")
    args = p.parse_args()
    base = recipe(args.epochs)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [base["seed"]]
    impls = args.impls.split(",")
    warm_up(impls)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data = data_folder(args.data_dir / "goemotions", args.limit, tmp)
        for seed in seeds:
            r = {**base, "seed": seed}
            for impl in impls:
                row = run_bertkit(args, data, r, tmp) if impl == "bertkit" else run_hf(args, data, r, tmp)
                row.update(recipe=r, limit=args.limit)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    rows_used = f" (first {args.limit} rows)" if args.limit else ""
    print(f"\nGoEmotions{rows_used}, {base['epochs']} epochs, lr {base['lr']}, batch {base['batch_size']}, "
          f"threshold {base['threshold']}")
    print(f"{'impl':<9} {'seed':>5} {'wall s':>8} {'steps/s':>8} {'dev macro F1':>13} {'test macro F1':>14}")
    for row in rows:
        if "error" in row:
            print(f"{row['impl']:<9} failed: {row['error'][-500:]}")
            continue
        rate = f"{row['steady_steps_per_s']:.1f}" if row.get("steady_steps_per_s") else "-"
        print(f"{row['impl']:<9} {row['recipe']['seed']:>5} {row['wall_s']:>8.1f} {rate:>8} "
              f"{100 * row['dev_macro_f1']:>13.2f} {100 * row['test_macro_f1']:>14.2f}")
    ours = [x for x in rows if x["impl"] == "bert-kit" and "wall_s" in x]
    hf = [x for x in rows if x["impl"] == "hf-loop" and "wall_s" in x]
    if ours and hf:
        mean = lambda runs, key: sum(x[key] for x in runs) / len(runs)  # noqa: E731
        if len(seeds) > 1:
            print(f"means over seeds {seeds}: bert-kit {100 * mean(ours, 'test_macro_f1'):.2f}, "
                  f"hf-loop {100 * mean(hf, 'test_macro_f1'):.2f}")
        gap = 100 * (mean(ours, "test_macro_f1") - mean(hf, "test_macro_f1"))
        speed = mean(hf, "wall_s") / mean(ours, "wall_s")
        print(f"bert-kit: {speed:.2f}x faster launch to exit (target >= 3x on one GPU: {'met' if speed >= 3 else 'missed'}); "
              f"test macro F1 {gap:+.2f} points (target within 0.5: {'met' if abs(gap) <= 0.5 else 'missed'})")


if __name__ == "__main__":
    main()
