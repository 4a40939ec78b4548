"""`bert-kit evaluate`: score a model folder on a task's data file; metrics printed and saved as JSON.

    bert-kit evaluate --task similarity --model models/all-MiniLM-L6-v2 --data sts-test.csv
    bert-kit evaluate --model runs/sst2/best --data ../shared/data/sst2/dev.tsv --output sst2_dev.json

similarity: Pearson and Spearman correlation of the predicted scores with the gold ones. A
bi-encoder (any plain encoder such as all-MiniLM-L6-v2, or a bi-encoder fine-tune) scores a
pair by the cosine of the two mean-pooled sentence vectors; a cross-encoder (regression head,
num_labels=1) by its output on the pair.
classification: accuracy, macro/micro/weighted P/R/F1, MCC, per-class scores, and a
confusion-matrix PNG beside the JSON. token-classification: entity-level P/R/F1 (CoNLL);
qa: SQuAD exact match and F1.

The task, label names and settings of a fine-tuned folder are read from its config.json, so
`--task` may be left out for folders written by `bert-kit finetune`. The JSON goes to --output,
or into the model folder as eval_{task}_{data file name}.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bert_kit.tasks import TASKS, Task, make_task, read_model_metadata, resolve_model_folder

DEFAULT_MAX_LENGTH = {"qa": 384, "similarity": 256}  # others: 128


def _sentence_transformers_settings(folder: Path) -> dict[str, Any]:
    """max_length and pooling from a sentence-transformers folder (all-MiniLM-L6-v2 ships them)."""
    found: dict[str, Any] = {}
    sbert = folder / "sentence_bert_config.json"
    if sbert.is_file():
        found["max_length"] = json.loads(sbert.read_text()).get("max_seq_length")
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file():
        found["pooling"] = "cls" if json.loads(pooling.read_text()).get("pooling_mode_cls_token") else "mean"
    return found


def task_settings(args: argparse.Namespace, folder: Path) -> tuple[str, Any, dict]:
    """(task name, FinetuneConfig-like settings, folder metadata) from the folder and the flags."""
    from bert_kit.finetune import FinetuneConfig

    meta = read_model_metadata(folder)
    task = args.task or meta.get("task")
    if task is None:
        raise ValueError(f"{folder} does not record its task (not written by bert-kit finetune): pass --task")
    if task not in TASKS:
        raise ValueError(f"{folder}/config.json names unknown task {task!r}; expected one of {TASKS}")
    st = _sentence_transformers_settings(folder)
    mode = getattr(args, "similarity_mode", None) or meta.get("similarity_mode")
    if mode is None:  # a regression head on pairs is a cross-encoder; a plain encoder is a bi-encoder
        heads = meta["architectures"] == ["BertForSequenceClassification"]
        mode = "cross-encoder" if heads and len(meta.get("label_names") or []) == 1 else "bi-encoder"
    max_length = args.max_length or meta.get("max_length") or st.get("max_length") or DEFAULT_MAX_LENGTH.get(task, 128)
    settings = FinetuneConfig(
        task=task, model=str(folder), max_length=int(max_length), similarity_mode=mode,
        pooling=getattr(args, "pooling", None) or meta.get("pooling") or st.get("pooling") or "mean",
        doc_stride=meta.get("doc_stride", 128), max_query_length=meta.get("max_query_length", 64),
        squad_train_articles=getattr(args, "split_articles", None), text_column=args.text_column,
        text_pair_column=args.text_pair_column, label_column=getattr(args, "label_column", "label"),
        eval_batch_size=args.batch_size, unpadded=True, device=args.device or "auto")
    return task, settings, meta


def load_task_model(args: argparse.Namespace, verbose: bool = True) -> tuple[Task, Any, Any]:
    """(task, model on its device in eval mode, precision) for a model folder and CLI flags."""
    from bert_kit.precision import resolve_precision
    from bert_kit.tokenizer import get_tokenizer

    folder = resolve_model_folder(args.model)
    if folder is None:
        raise FileNotFoundError(f"model folder not found: {args.model}")
    name, settings, meta = task_settings(args, folder)
    precision = resolve_precision(args.precision, args.device or "auto", verbose=verbose)
    task = make_task(name, settings)
    task.bind(get_tokenizer(folder))
    task.load_metadata(meta)
    model = task.load(folder).to(precision.device).eval()
    return task, model, precision


def summary_line(task: str, metrics: dict[str, Any]) -> str:
    keys = {"classification": ("accuracy", "f1", "mcc", "pearson", "spearman"),
            "token-classification": ("precision", "recall", "f1", "accuracy"),
            "qa": ("exact_match", "f1"), "similarity": ("pearson", "spearman")}[task]
    shown = [f"{k} {metrics[k]:.4f}" for k in keys if isinstance(metrics.get(k), float)]
    return f"{task}: " + ", ".join(shown)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared with `bert-kit predict`."""
    parser.add_argument("--task", choices=TASKS, default=None, help="default: the task recorded in the model folder")
    parser.add_argument("--model", required=True, help="model folder (fine-tuned, or any encoder for similarity)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=None, help="default: the model's fine-tuning length")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if available)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    parser.add_argument("--similarity-mode", choices=("bi-encoder", "cross-encoder"), default=None,
                        help="similarity: cosine of pooled vectors or the regression head (default: from the folder)")
    parser.add_argument("--pooling", choices=("mean", "cls"), default=None, help="bi-encoder pooling (default mean)")
    parser.add_argument("--text-column", default="sentence", help="classification: text column of TSV/CSV/JSONL")
    parser.add_argument("--text-pair-column", default=None, help="classification: second text column")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--data", required=True, help="labelled data file (TSV/CSV/JSONL, CoNLL, SQuAD JSON, STS-B)")
    parser.add_argument("--output", default=None, help="metrics JSON (default: MODEL/eval_{task}_{data}.json)")
    parser.add_argument("--max-examples", type=int, default=None, help="evaluate on the first N examples only")
    parser.add_argument("--label-column", default="label", help="classification: label column")
    parser.add_argument("--split-articles", type=int, default=None,
                        help="qa: evaluate on the articles after the first N (the held-out part of a "
                             "fine-tuning split)")


def run(args: argparse.Namespace) -> int:
    t0 = time.time()
    task, model, precision = load_task_model(args)
    items = task.read_eval(args.data, args.max_examples)
    if not items:
        raise ValueError(f"{args.data}: no examples to evaluate")
    metrics = task.evaluate(model, items, precision)
    result = {"task": task.name, "model": str(args.model), "data": str(args.data), **metrics,
              "max_length": task.s.max_length, "seconds": round(time.time() - t0, 3)}
    if task.name == "similarity":
        result.update(similarity_mode=task.s.similarity_mode, pooling=task.s.pooling)
    out = Path(args.output) if args.output else Path(task.s.model) / f"eval_{task.name}_{Path(args.data).name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(summary_line(task.name, metrics))
    print(f"wrote {out}")
    if task.name == "classification" and "confusion_matrix" in metrics:
        from bert_kit.metrics import plot_confusion_matrix

        png = plot_confusion_matrix(metrics["confusion_matrix"], task.label_names,
                                    out.with_name(out.stem + "_confusion_matrix.png"),
                                    title=f"{Path(args.data).name}: accuracy {metrics['accuracy']:.3f}")
        print(f"wrote {png}")
    return 0
