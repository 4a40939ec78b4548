"""Inference with a saved model folder: load it as its task, score it, predict with it.

Used by `bert-kit evaluate` and `bert-kit predict`. The task, label names and settings of a
fine-tuned folder are read from its config.json, so the task may be left out for folders
written by `bert-kit finetune`.

evaluate (similarity): Pearson and Spearman correlation of the predicted scores with the gold
ones. A bi-encoder (any plain encoder such as all-MiniLM-L6-v2, or a bi-encoder fine-tune) scores a
pair by the cosine of the two mean-pooled sentence vectors; a cross-encoder (regression head,
num_labels=1) by its output on the pair. classification: accuracy, macro/micro/weighted P/R/F1,
MCC, per-class scores. token-classification: entity-level P/R/F1 (CoNLL); qa: SQuAD EM and F1.

predict, input files per task:
- classification: .txt with one text per line (a tab separates a pair), or TSV/CSV/JSONL with
  the text column(s) -> text, label, label_id, probabilities (score for a regression head);
- token-classification: .txt with one sentence per line, or a CoNLL file -> words, tags,
  entities (type, start, end, text);
- qa: JSON Lines {"question", "context"[, "id"]} or SQuAD JSON -> id, question, answer;
- similarity: two tab-separated sentences per line, an STS-B file, or JSON Lines
  {"sentence1", "sentence2"} -> sentence1, sentence2, score.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bert_kit.data import parse_jsonl, read_lines
from bert_kit.model_folder import default_max_length, read_model_metadata, resolve_model, sentence_transformers_settings
from bert_kit.tasks import TASKS, make_task
from bert_kit.tasks.base import Task


def task_settings(args: argparse.Namespace, folder: Path) -> tuple[str, Any, dict]:
    """(task name, FinetuneConfig-like settings, folder metadata) from the folder and the flags."""
    from bert_kit.tasks.finetuning import FinetuneConfig

    meta = read_model_metadata(folder)
    task = args.task or meta.get("task")
    if task is None:
        raise ValueError(f"{folder} does not record its task (not written by bert-kit finetune): pass --task")
    if task not in TASKS:
        raise ValueError(f"{folder}/config.json names unknown task {task!r}; expected one of {TASKS}")
    st = sentence_transformers_settings(folder)
    mode = getattr(args, "similarity_mode", None) or meta.get("similarity_mode")
    if mode is None:  # a regression head on pairs is a cross-encoder; a plain encoder is a bi-encoder
        heads = meta["architectures"] == ["BertForSequenceClassification"]
        mode = "cross-encoder" if heads and len(meta.get("label_names") or []) == 1 else "bi-encoder"
    # the length it was fine-tuned with, else its sentence-transformers length, else its positions
    max_length = args.max_length or default_max_length(folder)
    positions = json.loads((folder / "config.json").read_text()).get("max_position_embeddings", 512)
    if max_length > positions:
        raise ValueError(f"--max-length {max_length} exceeds the {positions} positions of {folder}")
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
    from bert_kit.training.precision import resolve_precision
    from bert_kit.tokenizer import get_tokenizer

    folder = resolve_model(args.model)  # a folder, a run folder, or a hub name's local copy
    name, settings, meta = task_settings(args, folder)
    precision = resolve_precision(args.precision, args.device or "auto", verbose=verbose, purpose="inference")
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


# ---- inputs -------------------------------------------------------------------------------------

def warn_blank_texts(texts: list[str], path: str | Path, unit: str = "line") -> list[int]:
    """Print a warning naming the blank texts of `path` (1-based `unit` numbers), which are still
    scored (as empty texts, so outputs stay one per input row); returns their numbers."""
    blank = [i for i, t in enumerate(texts, start=1) if not t.strip()]
    if blank:
        shown = ", ".join(map(str, blank[:10])) + (", ..." if len(blank) > 10 else "")
        print(f"warning: {path}: {len(blank)} blank {unit}(s) ({unit} {shown}) scored as empty texts; "
              "their outputs say nothing about your data (remove them to skip them)", file=sys.stderr)
    return blank


def read_classification_inputs(task: Any, path: str | Path) -> tuple[list[str], list[str] | None]:
    """Texts (and second texts): .txt has one per line, a tab separating a pair; else the text columns."""
    path = Path(path)
    if path.suffix == ".txt":
        rows = [line.split("\t", 1) for line in read_lines(path)]
        if all(len(r) == 2 for r in rows):
            return [r[0] for r in rows], [r[1] for r in rows]
        return ["\t".join(r) for r in rows], None
    data = task._read(path, labelled=False)
    return data.texts, data.text_pairs


def read_sentences(path: str | Path, fmt: str = "auto") -> list[list[str]]:
    """Word lists: a CoNLL file (first column; -DOCSTART- or a fixed column count gives it away)
    or one whitespace-split sentence per line."""
    from bert_kit.data.ner import read_conll

    lines = read_lines(path)
    if fmt == "auto":
        head = [ln.split() for ln in lines[:200] if ln.strip()]
        columns = {len(f) for f in head}
        conll = bool(head) and (head[0][0] == "-DOCSTART-" or
                                (len(columns) == 1 and min(columns) >= 2 and "" in lines[:200]))
        fmt = "conll" if conll else "lines"
    if fmt == "conll":
        return [words for words, _ in read_conll(path)]
    return [ln.split() for ln in lines if ln.strip()]


def read_questions(path: str | Path) -> list[dict]:
    """SQuAD JSON, or JSON Lines of {"question", "context"[, "id"]}."""
    from bert_kit.data.squad import read_squad

    path = Path(path)
    if path.suffix == ".json":
        return read_squad(path)
    examples = []
    for i, row in parse_jsonl(read_lines(path), path):
        if not isinstance(row, dict) or "question" not in row or "context" not in row:
            raise KeyError(f"{path}:{i}: needs keys 'question' and 'context'")
        examples.append({"id": str(row.get("id", i)), "question": row["question"], "context": row["context"],
                         "answers": []})
    return examples


def read_pairs(task: Any, path: str | Path) -> tuple[list[str], list[str]]:
    """Sentence pairs: an STS-B file, JSON Lines {"sentence1", "sentence2"}, or two tab-separated columns."""
    path = Path(path)
    lines = read_lines(path)
    if path.suffix == ".jsonl":
        s1, s2 = [], []
        for i, row in parse_jsonl(lines, path):
            if not isinstance(row, dict) or "sentence1" not in row or "sentence2" not in row:
                raise KeyError(f"{path}:{i}: needs keys 'sentence1' and 'sentence2'")
            s1.append(row["sentence1"])
            s2.append(row["sentence2"])
        return s1, s2
    if len(lines[0].split("\t")) >= 7:  # genre, file, year, id, score, s1, s2
        s1, s2, _ = task._read(path)
        return s1, s2
    s1, s2 = [], []
    for i, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}:{i}: expected 2 tab-separated sentences, got {len(fields)} fields")
        s1.append(fields[0])
        s2.append(fields[1])
    return s1, s2


# ---- predictions --------------------------------------------------------------------------------

def predict_classification(task: Any, model: Any, path: str | Path, precision: Any, fmt: str) -> list[dict]:
    from bert_kit.data.classification import ClassificationDataset

    texts, pairs = read_classification_inputs(task, path)
    unit = "line" if Path(path).suffix == ".txt" else "row"
    warn_blank_texts(texts, path, unit)
    ds = ClassificationDataset(texts, None, task.tokenizer, task.s.max_length, pairs)
    logits = task.logits(model, [ds[i] for i in range(len(ds))], precision)  # (N, C)
    records = []
    for i, row in enumerate(logits):
        rec: dict[str, Any] = {"text": texts[i]}
        if pairs is not None:
            rec["text_pair"] = pairs[i]
        if task.regression:
            rec["score"] = float(row[0])
        else:
            best = int(row.argmax())
            probs = dict(zip(task.label_names, (round(p, 6) for p in row.softmax(-1).tolist())))
            rec.update(label=task.label_names[best], label_id=best, probabilities=probs)
        records.append(rec)
    return records


def predict_tokens(task: Any, model: Any, path: str | Path, precision: Any, fmt: str) -> list[dict]:
    from bert_kit.metrics import get_entities

    sentences = read_sentences(path, fmt)
    dataset = task._dataset([(words, None) for words in sentences])
    records = []
    for words, tags in zip(sentences, task.tag(model, dataset, precision)):
        entities = [{"type": t, "start": a, "end": b + 1, "text": " ".join(words[a: b + 1])}
                    for t, a, b in get_entities(tags)]
        records.append({"words": words, "tags": tags, "entities": entities})
    return records


def predict_answers(task: Any, model: Any, path: str | Path, precision: Any, fmt: str) -> list[dict]:
    from bert_kit.data.squad import prepare_eval_features

    examples = read_questions(path)
    features = prepare_eval_features(examples, task.tokenizer, task.s.max_length, task.s.doc_stride,
                                     task.s.max_query_length)
    answers = task.answers(model, examples, features, precision)
    return [{"id": ex["id"], "question": ex["question"], "answer": answers[ex["id"]]} for ex in examples]


def predict_similarity(task: Any, model: Any, path: str | Path, precision: Any, fmt: str) -> list[dict]:
    s1, s2 = read_pairs(task, path)
    scores = task.scores(model, s1, s2, precision)
    return [{"sentence1": a, "sentence2": b, "score": float(x)} for a, b, x in zip(s1, s2, scores)]


PREDICTORS = {"classification": predict_classification, "token-classification": predict_tokens,
              "qa": predict_answers, "similarity": predict_similarity}
