"""The reference for `bert-kit glue`: the same model and per-task recipe through `transformers`, run the
way a user runs GLUE today.

Each run is the loop a `transformers` user writes (as benchmarks/hf_finetune.py):
`AutoModelForSequenceClassification` (SDPA attention; one output and MSE for STS-B), AdamW (fused on
CUDA) without decay on biases and LayerNorm weights, `get_linear_schedule_with_warmup`, gradient
clipping at 1.0, bf16 autocast, shuffled batches padded by `DataCollatorWithPadding`; the model
after its last step is scored on each dev file. The files are read as transformers' GLUE
processors read them (tab-separated, no quoting, columns by index, QQP's short lines skipped),
not by bert-kit's readers. The recipe (epochs, batch, max length, warmup, weight decay; lr auto
by the encoder's size), the metrics, the GLUE score and the table are bert-kit's
(`bert_kit.tasks.glue`): one definition for both sides. Runs are spread over the GPUs as
`bert-kit glue` spreads them (one process per GPU, `bert_kit.tasks.glue_runs.run_all`).

    python benchmarks/glue_hf.py --model MINILM --data ../shared/data/glue --output-dir /tmp/glue_hf
    python benchmarks/glue_hf.py --model MINILM --tasks cola,rte --gpus 0,1 --lrs 1e-4,5e-5 --seeds 1,2,3

Writes OUTPUT_DIR/glue_results.json in the format of `bert-kit glue` and prints the same table.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bert_kit.tasks.glue import (TASKS, WARMUP_FRACTION, WEIGHT_DECAY, build_report, find_tasks,  # noqa: E402
                                 markdown_table, task_metrics, task_name)
from bert_kit.tasks.glue_runs import lr_name, run_all, visible_gpus  # noqa: E402

# task -> (text, second text, label) column indices and whether line 1 is a header: transformers' processors
COLUMNS = {"cola": (3, None, 1, False), "sst2": (0, None, 1, True), "mrpc": (3, 4, 0, True), "stsb": (7, 8, -1, True),
           "qqp": (3, 4, 5, True), "mnli": (8, 9, -1, True), "qnli": (1, 2, -1, True), "rte": (1, 2, -1, True),
           "wnli": (1, 2, -1, True)}
ADAM_EPS = 1e-6  # bert-kit's (and BERT's) Adam epsilon, so both sides run one recipe


def read_examples(path: str, name: str) -> list[dict]:
    """{"text", "text_pair", "label"} of a GLUE file, as transformers' GLUE processors read it: csv
    with a tab, no quoting (fields hold literal quotes); a line too short for the columns is skipped
    (QQP's broken pairs)."""
    task, (a, b, y, header) = TASKS[name], COLUMNS[name]
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = [r for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if r]
    examples, needed = [], max(a, b or 0, y if y >= 0 else 0)
    for row in rows[1:] if header else rows:
        if len(row) <= needed:
            continue
        value = row[y]
        if task.regression:
            label: float | int = float(value)
        else:
            label = task.labels.index(value) if value in task.labels else int(value)
        examples.append({"text": row[a], "text_pair": row[b] if b is not None else None, "label": label})
    return examples


def encode(tokenizer: Any, examples: list[dict], max_length: int) -> list[dict]:
    pairs = [e["text_pair"] for e in examples] if examples[0]["text_pair"] is not None else None
    enc = tokenizer([e["text"] for e in examples], pairs, truncation=True, max_length=max_length)
    return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
             "attention_mask": enc["attention_mask"][i], "labels": e["label"]} for i, e in enumerate(examples)]


def hf_execute(run: dict[str, Any], device: str) -> dict[str, Any]:
    """Fine-tune and score one run with transformers; its record as bert-kit glue writes it."""
    import torch
    import transformers as tf

    t0 = time.time()
    task, files, seed, lr = TASKS[run["task"]], run["files"], run["seed"], run["lr"]
    if lr == "auto":  # bert-kit's rule, by the encoder's parameters
        from bert_kit.config import load_hf_config
        from bert_kit.tasks.finetuning import auto_lr

        lr = auto_lr(load_hf_config(run["model"]).num_parameters())
    torch.manual_seed(seed)
    tokenizer = tf.AutoTokenizer.from_pretrained(run["model"])
    train = encode(tokenizer, read_examples(files["train"], task.name)[: run.get("max_train_examples")],
                   task.max_length)
    devs = {split: encode(tokenizer, read_examples(files[split], task.name), task.max_length) for split, _ in task.dev}
    model = tf.AutoModelForSequenceClassification.from_pretrained(
        run["model"], num_labels=1 if task.regression else len(task.labels), attn_implementation="sdpa",
        dtype=torch.float32).to(device)  # fp32 master weights, bf16 autocast: as bert-kit
    cuda = device.startswith("cuda")
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, eps=ADAM_EPS, fused=cuda)
    epochs = run.get("epochs") or task.epochs
    total = max(1, math.ceil(epochs * math.ceil(len(train) / task.batch_size)))
    sched = tf.get_linear_schedule_with_warmup(opt, int(WARMUP_FRACTION * total), total)
    collator = tf.DataCollatorWithPadding(tokenizer)
    loader = torch.utils.data.DataLoader(train, batch_size=task.batch_size, shuffle=True, collate_fn=collator,
                                         generator=torch.Generator().manual_seed(seed))
    step, t_train = 0, time.time()
    model.train()
    while step < total:
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=cuda):
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % 200 == 0:
                print(f"{run['id']}: step {step}/{total} loss {loss.item():.4f}", file=sys.stderr, flush=True)
            if step >= total:
                break
    if cuda:
        torch.cuda.synchronize()
    t_train = time.time() - t_train
    model.eval()
    outputs = {}
    for split, items in devs.items():
        predicted = []
        with torch.inference_mode(), torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=cuda):
            for start in range(0, len(items), 64):
                batch = collator([{k: v for k, v in it.items() if k != "labels"} for it in items[start: start + 64]])
                logits = model(**{k: v.to(device) for k, v in batch.items()}).logits.float()
                predicted += logits[:, 0].tolist() if task.regression else logits.argmax(-1).tolist()
        outputs[split] = (predicted, [it["labels"] for it in items])
    counts = {split: len(items) for split, items in devs.items()}
    return {"task": task.name, "lr": lr, "seed": seed, "metrics": task_metrics(task, outputs),
            "train_examples": len(train), "dev_examples": counts if len(counts) > 1 else next(iter(counts.values())),
            "seconds": round(time.time() - t0, 2), "train_seconds": round(t_train, 3), "steps": step,
            "device": torch.cuda.get_device_name(0) if cuda else device}


def main() -> None:
    t0 = time.time()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF model folder or hub name with a local copy")
    p.add_argument("--data", type=Path, default=None, help="the GLUE folder (default: $BERT_KIT_DATA/glue)")
    p.add_argument("--tasks", default=None)
    p.add_argument("--gpus", default=None, help="e.g. 0,1 or cpu (default: every visible GPU, else the CPU)")
    p.add_argument("--lrs", default="auto")
    p.add_argument("--seeds", default="42")
    p.add_argument("--epochs", type=float, default=None, help="every task's epochs (quick checks)")
    p.add_argument("--max-train-examples", type=int, default=None, help="train on the first N examples (quick checks)")
    p.add_argument("--output-dir", type=Path, required=True, help="glue_results.json goes here")
    args = p.parse_args()

    from importlib.metadata import version

    from bert_kit.data.root import data_root
    from bert_kit.model_folder import resolve_model

    root = args.data or data_root() / "glue"
    wanted = [task_name(t) for t in args.tasks.split(",")] if args.tasks else None
    present, missing = find_tasks(root, wanted)
    folder = resolve_model(args.model)
    lrs = [t.strip() if t.strip() == "auto" else float(t) for t in args.lrs.split(",")]  # auto: in the worker
    seeds = [int(s) for s in args.seeds.split(",")]
    visible = visible_gpus()
    chosen = [] if args.gpus == "cpu" else [int(g) for g in args.gpus.split(",")] if args.gpus else None
    gpus = visible if chosen is None else [visible[g] for g in chosen]
    runs = [{"id": f"{name}/lr{lr_name(lr)}_seed{seed}", "task": name, "lr": lr, "seed": seed, "model": str(folder),
             "files": {k: str(v) for k, v in files.items()}, "epochs": args.epochs,
             "max_train_examples": args.max_train_examples,
             "folder": str(args.output_dir / name / f"lr{lr_name(lr)}_seed{seed}"),
             "cost": files["train"].stat().st_size * (args.epochs or TASKS[name].epochs)}
            for name, files in present.items() for lr in lrs for seed in seeds]
    runs.sort(key=lambda r: -r["cost"])

    def on_event(kind: str, run: dict, where: str, outcome: dict | None) -> None:
        if kind == "done":
            shown = outcome.get("glue", {}).get("metrics") or outcome.get("error")
            print(f"glue_hf: {run['id']} on {where}: {shown}", file=sys.stderr, flush=True)

    outcomes = run_all(runs, gpus, on_event, execute=hf_execute)
    by_task = {name: [] for name in present}
    failed = {}
    for run in runs:
        outcome = outcomes.get(run["id"], {"error": "not run"})
        if "glue" in outcome:
            by_task[run["task"]].append(outcome["glue"])
        else:
            failed[run["task"]] = f"{run['id']}: {outcome.get('error')}"
    report = build_report(str(args.model), str(root), by_task, missing, failed, implementation="transformers",
                          transformers=version("transformers"), lrs=lrs, seeds=seeds,
                          gpus=gpus or "cpu", wall_time_s=round(time.time() - t0, 2))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "glue_results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(markdown_table(report))
    print(f"\nwrote {args.output_dir / 'glue_results.json'}; wall time {time.time() - t0:.1f} s")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
