"""`bert-kit predict`: run a fine-tuned model over an input file, one JSON object per line out.

    bert-kit predict --model runs/sst2/best --input reviews.txt --output preds.jsonl

- classification: .txt with one text per line (a tab separates a pair), or TSV/CSV/JSONL with
  the text column(s) -> text, label, label_id, probabilities (score for a regression head);
- token-classification: .txt with one sentence per line, or a CoNLL file -> words, tags,
  entities (type, start, end, text);
- qa: JSON Lines {"question", "context"[, "id"]} or SQuAD JSON -> id, question, answer;
- similarity: two tab-separated sentences per line, an STS-B file, or JSON Lines
  {"sentence1", "sentence2"} -> sentence1, sentence2, score.

The task and settings of a folder written by `bert-kit finetune` come from its config.json; the
model work itself (batched, length-sorted, autocast on GPU) is the task's, as in evaluation.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bert_kit.data import parse_jsonl
from bert_kit.embeddings import read_lines
from bert_kit.evaluate import add_common_arguments, load_task_model


# ---- inputs -------------------------------------------------------------------------------------

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


# ---- `bert-kit predict` -------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--input", required=True, help="file to predict on (see the table in the module docs)")
    parser.add_argument("--output", required=True, help="JSON Lines file to write")
    parser.add_argument("--input-format", choices=("auto", "conll", "lines"), default="auto",
                        help="token-classification: CoNLL columns or one sentence per line (default: detect)")


def run(args: argparse.Namespace) -> int:
    t0 = time.time()
    if not Path(args.input).is_file():
        raise FileNotFoundError(f"input file not found: {args.input}")
    task, model, precision = load_task_model(args, verbose=False)
    records = PREDICTORS[task.name](task, model, args.input, precision, args.input_format)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:  # written whole, then renamed: never half a file
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(out)
    print(f"{task.name}: {len(records)} predictions -> {out} ({time.time() - t0:.1f}s on {precision.device})")
    return 0
