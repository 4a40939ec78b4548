"""The reference side of benchmarks/finetune_cli.py: fine-tuning as a `transformers` user writes it.

Two implementations of the same recipe, each run as its own process:
* `--impl loop`: a plain PyTorch loop over `AutoModelFor...` (SDPA attention), fused AdamW without
  decay on biases and LayerNorm weights, `get_linear_schedule_with_warmup`, gradient clipping,
  bf16 autocast (on a GPU; fp32 on a CPU, as bert-kit), batches shuffled and padded to their longest
  row, evaluation after every epoch;
* `--impl trainer`: `transformers.Trainer` with the same settings (bf16, fused AdamW, linear
  warmup, evaluation every epoch, no checkpoints).
Data is read with small parsers below and tokenised by the model's `AutoTokenizer`; metrics:
SST-2 accuracy, STS-B Spearman (scipy), CoNLL entity F1 (bert_kit.metrics.entity_f1, equal to
seqeval). Prints one JSON object: wall_s (from process start), steps, steady steps/s, the metric.

GoEmotions (`--task goemotions`, the loop only): multi-label, `problem_type="multi_label_classification"`
(sigmoid outputs, BCE); after every epoch each label's threshold is tuned for F1 on the dev set
(scikit-learn's f1_score over the grid 0.05, 0.10, ..., 0.95; or `--threshold 0.5`) and the epoch of
the best dev macro F1 is kept, as `load_best_model_at_end` would; its test macro F1 is reported.
`--data-dir` then names a folder holding train.tsv, dev.tsv, test.tsv (benchmarks/goemotions.py
passes cut copies for `--limit`).

    python benchmarks/hf_finetune.py --impl loop --task sst2 --model MINILM --data-dir DATA
    python benchmarks/hf_finetune.py --impl loop --task goemotions --model MINILM --data-dir DATA/goemotions
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TASKS = {  # task -> (train file, eval file, kind)
    "sst2": ("sst2/train.tsv", "sst2/dev.tsv", "classification"),
    "stsb": ("stsb/sts-train.csv", "stsb/sts-dev.csv", "regression"),
    "conll": ("conll2003/train.txt", "conll2003/valid.txt", "tokens"),
    "rte": ("glue/RTE/train.tsv", "glue/RTE/dev.tsv", "classification"),     # 2,490 pairs
    "mrpc": ("glue/MRPC/train.tsv", "glue/MRPC/dev.tsv", "classification"),  # 3,668 pairs
    "goemotions": ("train.tsv", "dev.tsv", "multi_label"),  # 43,410 comments, 28 emotions (+ test.tsv)
}
GRID = np.round(np.arange(0.05, 0.951, 0.05), 2)  # the thresholds tried for each label


def read_sst2(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [{"text": r["sentence"], "label": int(r["label"])} for r in csv.DictReader(f, delimiter="\t")]


def read_stsb(path: Path) -> list[dict]:
    rows = [ln.rstrip("\n").split("\t") for ln in open(path, encoding="utf-8") if ln.strip()]
    return [{"text": r[5], "text_pair": r[6], "label": float(r[4])} for r in rows]


def read_rte(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [{"text": r["sentence1"], "text_pair": r["sentence2"], "label": int(r["label"] == "not_entailment")}
                for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def read_mrpc(path: Path) -> list[dict]:
    with open(path, encoding="utf-8-sig") as f:
        return [{"text": r["#1 String"], "text_pair": r["#2 String"], "label": int(r["Quality"])}
                for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]


def read_goemotions(path: Path) -> list[dict]:
    """GoEmotions' TSV as distributed: text, comma-separated label ids, comment id (split on tabs)."""
    rows = [ln.rstrip("\n").split("\t") for ln in open(path, encoding="utf-8") if ln.strip()]
    labels = [[0.0] * 28 for _ in rows]
    for row, r in zip(labels, rows):
        for i in r[1].split(","):
            row[int(i)] = 1.0
    return [{"text": r[0], "label": y} for r, y in zip(rows, labels)]


def tuned_thresholds(probs: np.ndarray, gold: np.ndarray, threshold: str) -> np.ndarray:
    """Each label's threshold: the grid's best dev F1 (the one nearest 0.5 of ties), or a fixed one."""
    from sklearn.metrics import f1_score

    if threshold != "tune":
        return np.full(gold.shape[1], float(threshold))
    out = []
    for j in range(gold.shape[1]):
        if not gold[:, j].any():
            out.append(0.5)
            continue
        scores = [f1_score(gold[:, j], probs[:, j] >= t, zero_division=0) for t in GRID]
        best = max(scores)
        out.append(min((t for t, f in zip(GRID, scores) if f == best), key=lambda t: abs(t - 0.5)))
    return np.asarray(out)


def macro_f1(probs: np.ndarray, gold: np.ndarray, thresholds: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(gold, probs >= thresholds[None, :], average="macro", zero_division=0))


def read_conll(path: Path) -> list[dict]:
    sentences, words, tags = [], [], []
    for line in open(path, encoding="utf-8"):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                sentences.append({"words": words, "tags": tags})
            words, tags = [], []
            continue
        words.append(parts[0])
        tags.append(parts[-1])
    if words:
        sentences.append({"words": words, "tags": tags})
    return sentences


def encode(tokenizer, rows: list[dict], kind: str, max_length: int, label_ids: dict | None) -> list[dict]:
    if kind == "tokens":
        enc = tokenizer([r["words"] for r in rows], is_split_into_words=True, truncation=True, max_length=max_length)
        items = []
        for i, r in enumerate(rows):
            word_ids, previous, labels = enc.word_ids(i), None, []
            for w in word_ids:  # the first WordPiece of each word carries its tag
                labels.append(-100 if w is None or w == previous else label_ids[r["tags"][w]])
                previous = w
            items.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                          "attention_mask": enc["attention_mask"][i], "labels": labels})
        return items
    pairs = [r["text_pair"] for r in rows] if "text_pair" in rows[0] else None
    enc = tokenizer([r["text"] for r in rows], pairs, truncation=True, max_length=max_length)
    return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
             "attention_mask": enc["attention_mask"][i], "labels": r["label"]} for i, r in enumerate(rows)]


def build_model(args: argparse.Namespace, kind: str, num_labels: int):
    import transformers as tf

    common = {"attn_implementation": "sdpa", "dtype": torch.float32}  # fp32 master weights, as bert-kit
    if kind == "multi_label":  # sigmoid outputs with BCEWithLogitsLoss
        common["problem_type"] = "multi_label_classification"
    auto = tf.AutoModelForTokenClassification if kind == "tokens" else tf.AutoModelForSequenceClassification
    if args.random_init:  # a bert-base shape with the tokenizer's vocabulary, randomly initialised
        config = tf.BertConfig(vocab_size=len(tf.AutoTokenizer.from_pretrained(args.model)), num_labels=num_labels)
        return auto.from_config(config, **common)
    return auto.from_pretrained(args.model, num_labels=num_labels, **common)


def metric(kind: str, logits: list[np.ndarray], items: list[dict], label_names: list[str] | None) -> float:
    if kind == "classification":
        return float(np.mean([int(l.argmax()) == it["labels"] for l, it in zip(logits, items)]))
    if kind == "regression":
        from scipy.stats import spearmanr

        return float(spearmanr([float(l[0]) for l in logits], [it["labels"] for it in items]).correlation)
    from bert_kit.metrics import entity_f1

    gold, predicted = [], []
    for l, it in zip(logits, items):
        keep = [j for j, y in enumerate(it["labels"]) if y != -100]
        gold.append([label_names[it["labels"][j]] for j in keep])
        predicted.append([label_names[int(l[j].argmax())] for j in keep])
    return float(entity_f1(gold, predicted)["f1"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=("loop", "trainer"), required=True)
    p.add_argument("--task", choices=sorted(TASKS), required=True)
    p.add_argument("--model", required=True, help="HF model folder (its tokenizer is used too)")
    p.add_argument("--random-init", action="store_true", help="a bert-base shape from scratch (speed only)")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--epochs", type=float, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup-fraction", type=float, default=0.1)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threshold", default="tune", help="goemotions: tune (per label on dev) or a number")
    args = p.parse_args()
    if args.task == "goemotions" and args.impl != "loop":
        p.error("--task goemotions runs with --impl loop")

    import transformers as tf

    torch.manual_seed(args.seed)
    train_file, eval_file, kind = TASKS[args.task]
    reader = {"sst2": read_sst2, "stsb": read_stsb, "conll": read_conll, "rte": read_rte, "mrpc": read_mrpc,
              "goemotions": read_goemotions}[args.task]
    train_rows, eval_rows = reader(args.data_dir / train_file), reader(args.data_dir / eval_file)
    label_names = sorted({t for r in train_rows + eval_rows for t in r["tags"]}) if kind == "tokens" else None
    label_ids = {n: i for i, n in enumerate(label_names)} if label_names else None
    num_labels = len(label_names) if kind == "tokens" else {"regression": 1, "multi_label": 28}.get(kind, 2)
    tokenizer = tf.AutoTokenizer.from_pretrained(args.model)
    train_items = encode(tokenizer, train_rows, kind, args.max_length, label_ids)
    eval_items = encode(tokenizer, eval_rows, kind, args.max_length, label_ids)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(args, kind, num_labels).to(device)
    collator = (tf.DataCollatorForTokenClassification(tokenizer) if kind == "tokens"
                else tf.DataCollatorWithPadding(tokenizer))
    steps_per_epoch = math.ceil(len(train_items) / args.batch_size)
    total = int(args.epochs * steps_per_epoch)
    scores, step_times = [], []
    best = {"dev": -1.0}  # multi-label: the epoch of the best dev macro F1 (its weights and thresholds)

    if args.impl == "trainer":
        class Timer(tf.TrainerCallback):
            def on_step_end(self, *a, **k):
                step_times.append(time.time())

        def compute_metrics(pred) -> dict:
            logits = list(pred.predictions)
            return {"score": metric(kind, logits, eval_items, label_names)}

        targs = tf.TrainingArguments(
            output_dir="/tmp/hf_trainer_out", per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=64, learning_rate=args.lr, num_train_epochs=args.epochs,
            warmup_steps=int(args.warmup_fraction * total), weight_decay=0.01, lr_scheduler_type="linear",
            max_grad_norm=1.0, bf16=device == "cuda", optim="adamw_torch_fused" if device == "cuda" else "adamw_torch", eval_strategy="epoch", save_strategy="no",
            logging_steps=100, report_to=[], seed=args.seed, dataloader_num_workers=0, disable_tqdm=True)
        trainer = tf.Trainer(model=model, args=targs, train_dataset=train_items, eval_dataset=eval_items,
                             data_collator=collator, compute_metrics=compute_metrics, callbacks=[Timer()])
        trainer.train()
        scores = [r["eval_score"] for r in trainer.state.log_history if "eval_score" in r]
    else:
        no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
        decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=args.lr, fused=device == "cuda")
        sched = tf.get_linear_schedule_with_warmup(opt, int(args.warmup_fraction * total), total)
        loader = torch.utils.data.DataLoader(train_items, batch_size=args.batch_size, shuffle=True,
                                             collate_fn=collator)
        step = 0
        while step < total:
            model.train()
            for batch in loader:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                    loss = model(**batch).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                step_times.append(time.time())
                if step % 100 == 0:
                    print(f"step {step}/{total} loss {loss.item():.4f}", file=sys.stderr, flush=True)
                if step >= total:
                    break
            # evaluate after every epoch, as the bert-kit run does
            model.eval()
            logits = []
            eval_loader = torch.utils.data.DataLoader(eval_items, batch_size=64, collate_fn=collator)
            with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                for batch in eval_loader:
                    batch = {k: v.to(device) for k, v in batch.items() if k != "labels"}
                    logits += list(model(**batch).logits.float().cpu().numpy())
            if kind == "multi_label":
                probs, gold = 1 / (1 + np.exp(-np.stack(logits))), np.array([it["labels"] for it in eval_items])
                thresholds = tuned_thresholds(probs, gold, args.threshold)
                scores.append(macro_f1(probs, gold, thresholds))
                if scores[-1] > best["dev"]:
                    best = {"dev": scores[-1], "thresholds": thresholds,
                            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
            else:
                scores.append(metric(kind, logits, eval_items, label_names))
            print(f"epoch score {scores[-1]:.4f}", file=sys.stderr, flush=True)

    test = None
    if kind == "multi_label":  # the best dev epoch's weights and thresholds on the test set
        model.load_state_dict(best["state"])
        model.eval()
        test_items = encode(tokenizer, reader(args.data_dir / "test.tsv"), kind, args.max_length, label_ids)
        logits = []
        with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            for batch in torch.utils.data.DataLoader(test_items, batch_size=64, collate_fn=collator):
                batch = {k: v.to(device) for k, v in batch.items() if k != "labels"}
                logits += list(model(**batch).logits.float().cpu().numpy())
        probs = 1 / (1 + np.exp(-np.stack(logits)))
        test = macro_f1(probs, np.array([it["labels"] for it in test_items]), best["thresholds"])
    n = len(step_times)
    a, b = n // 5, n - n // 10  # steady state: between the first 20% and the last 10% of steps
    steady = (b - a) / (step_times[b - 1] - step_times[a]) if b - a > 1 else None
    print(json.dumps({"impl": f"hf-{args.impl}", "task": args.task, "steps": n, "steady_steps_per_s": steady,
                      "scores": scores, "best": max(scores) if scores else None, "final": scores[-1] if scores else None,
                      **({"test_macro_f1": test} if test is not None else {}),
                      "wall_s_inside": time.time() - T_START}))


if __name__ == "__main__":
    main()
