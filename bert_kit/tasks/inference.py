"""Inference with a saved model folder: load it as its task, score it, predict with it.

Used by `bert-kit evaluate` and `bert-kit predict`, and from Python by `TextClassifier`
(`TextClassifier.from_pretrained(folder).predict(texts)`). The task, label names and settings of a
fine-tuned folder are read from its config.json, so the task may be left out for folders
written by `bert-kit finetune`; so are the settings its files were read with (columns, header,
delimiter, label_pattern, encoding), which are the defaults of the flags.

Inputs are read once, whole, from any readable path that is not a folder (a FIFO, /dev/stdin,
`<(command)` too). Inputs that give the model no token (blank, or only control characters) are
scored and flagged on stderr; NaN or inf outputs are an error, never NaN probabilities.

evaluate (similarity): Pearson and Spearman correlation of the predicted scores with the gold
ones. A bi-encoder (any plain encoder such as all-MiniLM-L6-v2, or a bi-encoder fine-tune) scores a
pair by the cosine of the two mean-pooled sentence vectors; a cross-encoder (regression head,
num_labels=1) by its output on the pair. classification: accuracy, macro/micro/weighted P/R/F1,
MCC, per-class scores. token-classification: entity-level P/R/F1 (CoNLL); qa: SQuAD EM and F1.

predict, input files per task:
- classification: .txt with one text per line (a tab separates a pair), or TSV/CSV/JSONL with
  the text column(s) (--header, --delimiter, --where, --label-pattern as for fine-tuning) ->
  text, label, label_id, probabilities (score for a regression head), truncated; a multi-label
  head: labels, label_ids (those whose probability reaches their threshold) and the sigmoid
  probabilities; a folder fine-tuned with long_text: chunks (or --long-text chunks): windows, the
  number of windows each text took;
- token-classification: .txt with one sentence per line, or a CoNLL file -> words, tags,
  entities (type, start, end, text);
- qa: JSON Lines {"question", "context"[, "id"]} or SQuAD JSON -> id, question, answer;
- similarity: two tab-separated sentences per line, an STS-B file, JSON Lines
  {"sentence1", "sentence2"}, or any pair file with --text-column and --text-pair-column
  -> sentence1, sentence2, score, truncated.
`truncated` is true for a row longer than max_length, cut to its first max_length tokens; how
many were cut, and by how much, is said on one line before the predictions (so does `evaluate`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bert_kit.data import parse_jsonl, read_lines, read_text, setting
from bert_kit.data.tables import parse_where, table_layout
from bert_kit.model_folder import (default_max_length, model_positions, read_model_metadata, resolve_model,
                                   sentence_transformers_settings)
from bert_kit.onnx_export import onnx_folder
from bert_kit.tasks import TASKS, make_task
from bert_kit.tasks.base import Task, flag_empty_texts

# the head each task runs (similarity: a plain encoder or a regression head, either)
HEADS = {"classification": "BertForSequenceClassification", "token-classification": "BertForTokenClassification",
         "qa": "BertForQuestionAnswering"}
# how files are read, and the default of each flag when the folder records none (Task.metadata);
# word_column and tag_column are the ner group's settings
READ_DEFAULTS = {"text_column": "sentence", "text_pair_column": None, "label_column": "label", "header": None,
                 "delimiter": None, "label_pattern": None, "word_column": 0, "tag_column": -1, "encoding": "utf-8",
                 "label_delimiter": None, "label_columns": None}
NER_COLUMNS = ("word_column", "tag_column")
LABEL_SETS = ("label_delimiter", "label_columns")  # the classification group's reading settings


def read_settings(args: argparse.Namespace, folder: Path, meta: dict) -> dict[str, Any]:
    """How to read the data files: each flag given, else what the folder was fine-tuned with (said
    on stderr when it is not the default), else the default."""
    recorded = meta.get("data") if isinstance(meta.get("data"), dict) else {}
    chosen, from_folder = {}, []
    for key, default in READ_DEFAULTS.items():
        flag = getattr(args, key, None)
        chosen[key] = flag if flag is not None else recorded.get(key, default)
        if flag is None and key in recorded and recorded[key] != default:
            from_folder.append(setting(key, repr(recorded[key]) if isinstance(recorded[key], str) else recorded[key]))
    if from_folder and hasattr(args, "setting_flags"):  # a command that reads files (evaluate, predict) says so
        print(f"{folder}: reading files as it was fine-tuned: {', '.join(from_folder)} (a flag overrides each)",
              file=sys.stderr)
    return chosen


def task_settings(args: argparse.Namespace, folder: Path) -> tuple[str, Any, dict]:
    """(task name, FinetuneConfig-like settings, folder metadata) from the folder and the flags."""
    from bert_kit.tasks.finetuning import FinetuneConfig

    meta = read_model_metadata(folder)
    task = args.task or meta.get("task")
    if task is None:
        raise ValueError(f"{folder} does not record its task (not written by bert-kit finetune): pass --task")
    if task not in TASKS:
        raise ValueError(f"{folder}/config.json names unknown task {task!r}; expected one of {TASKS}")
    needed, held = HEADS.get(task), meta["architectures"]
    if needed and held and needed not in held:  # before its settings are checked against the wrong task
        what = f"an exported {held[0]} graph" if meta.get("onnx") else f"a {held[0]}"
        raise ValueError(f"{folder} holds {what}, but task {task} runs {needed}: fine-tune one with "
                         f"bert-kit finetune --task {task}")
    st = sentence_transformers_settings(folder)
    mode = getattr(args, "similarity_mode", None) or meta.get("similarity_mode")
    if mode is None:  # a regression head on pairs is a cross-encoder; a plain encoder is a bi-encoder
        heads = meta["architectures"] == ["BertForSequenceClassification"]
        mode = "cross-encoder" if heads and len(meta.get("label_names") or []) == 1 else "bi-encoder"
    # the length it was fine-tuned with, else its sentence-transformers length, else its positions
    max_length = args.max_length or default_max_length(folder)
    positions = model_positions(folder)
    if max_length > positions:
        raise ValueError(f"{setting('max_length', max_length)} exceeds the {positions} positions of {folder}")
    where = parse_where(getattr(args, "where", None))
    reading = read_settings(args, folder, meta)
    similarity = {"mode": mode, "score_range": getattr(args, "score_range", None) or meta.get("score_range"),
                  "pooling": getattr(args, "pooling", None) or meta.get("pooling") or st.get("pooling") or "mean"}
    qa = {"doc_stride": meta.get("doc_stride", 128), "max_query_length": meta.get("max_query_length", 64),
          "train_articles": getattr(args, "split_articles", None),
          "skip_bad_answers": getattr(args, "skip_bad_answers", False)}
    classification = {**{k: reading.pop(k) for k in LABEL_SETS}, **long_text_settings(args, meta, task)}
    settings = FinetuneConfig(
        task=task, model=str(folder), max_length=int(max_length), similarity=similarity, qa=qa,
        ner={k: reading.pop(k) for k in NER_COLUMNS}, classification=classification, validation_where=where,
        **reading, eval_batch_size=args.batch_size or 64, unpadded=True, device=args.device or "auto")
    return task, settings, meta


def long_text_settings(args: argparse.Namespace, meta: dict, task: str) -> dict[str, Any]:
    """How long texts are read: the flags (--long-text, --chunk-stride, --chunk-pooling), else as
    the folder was fine-tuned (its `long_text` record), else truncated; a window's flag for a
    classifier reading truncated is an error."""
    recorded = meta.get("long_text") if isinstance(meta.get("long_text"), dict) else {}
    mode = getattr(args, "long_text", None) or recorded.get("mode") or "truncate"
    stride = getattr(args, "chunk_stride", None)
    flag = "--chunk-stride" if stride is not None else "--chunk-pooling" if getattr(args, "chunk_pooling", None) else ""
    if mode == "truncate" and flag and task == "classification":  # else silently unused
        asked = "--long-text truncate asks" if getattr(args, "long_text", None) else "the model was fine-tuned"
        raise ValueError(f"{flag} sets how long texts are read in windows, but {asked} to cut them to max_length: "
                         "add --long-text chunks to read them in windows")
    return {"long_text": mode, "chunk_stride": stride if stride is not None else recorded.get("stride"),
            "chunk_pooling": getattr(args, "chunk_pooling", None) or recorded.get("pooling") or "mean"}


def load_task_model(args: argparse.Namespace, verbose: bool = True) -> tuple[Task, Any, Any]:
    """(task, model on its device in eval mode, precision) for a model folder and CLI flags."""
    from bert_kit.checks import resolve_device
    from bert_kit.training.precision import resolve_precision
    from bert_kit.tokenizer import get_tokenizer

    folder = resolve_model(args.model)  # a folder, a run folder, or a hub name's local copy
    exported = onnx_folder(folder, getattr(args, "backend", "auto"))
    folder = exported or folder
    name, settings, meta = task_settings(args, folder)
    # an exported graph runs in ONNX Runtime on the CPU, in the precision it was exported in
    device = (args.device or "cpu") if exported else (args.device or "auto")
    if exported:
        import torch

        from bert_kit.model_folder import onnx_metadata
        from bert_kit.training.precision import Precision

        graph = (onnx_metadata(folder) or {}).get("precision", "fp32")  # as exported: fp32 or int8
        asked = "" if args.precision in ("auto", "fp32") else f"; {setting('precision', args.precision)} does not apply"
        precision = Precision(resolve_device(device), torch.float32, f"onnx runs the exported {graph} graph on the "
                                                                     f"cpu{asked}")
        if verbose:
            print(f"precision: {precision}", flush=True)
    else:
        precision = resolve_precision(args.precision, device, verbose=verbose, purpose="inference")
    task = make_task(name, settings)
    task.bind(get_tokenizer(folder))
    task.load_metadata(meta)
    model = load_onnx_task_model(task, folder) if exported else task.load(folder)
    outputs = getattr(model, "num_labels", None)
    if outputs is not None and task.label_names and outputs != len(task.label_names):
        # predictions would pair names with the wrong outputs, probabilities would not sum to 1
        raise ValueError(f"{folder}: the head has {outputs} outputs but config.json names {len(task.label_names)} "
                         f"labels {task.label_names}; give id2label one name per output")
    model = model.to(precision.device).eval()  # (an exported graph refuses a GPU here)
    if not exported:
        from bert_kit.kernels import fast_path

        fast = fast_path.apply(model, precision.device, training=False, dtype=precision.dtype)
        if verbose:
            print(fast, flush=True)
    return task, model, precision


def load_onnx_task_model(task: Task, folder: Path) -> Any:
    """The exported graph of `folder` as the task's model; its head must be the one the task runs."""
    from bert_kit.onnx_runtime import OnnxModel

    model = OnnxModel(folder)
    if model.role != task.role:
        raise ValueError(f"{folder} holds an exported {model.architecture} graph, but the {task.name} task "
                         f"runs {model.architecture.replace(model.role, task.role)}: export a {task.name} model folder")
    return model


def summary_line(task: str, metrics: dict[str, Any]) -> str:
    keys = {"classification": ("accuracy", "f1", "mcc", "f1_samples", "subset_accuracy", "pearson", "spearman"),
            "token-classification": ("precision", "recall", "f1", "accuracy"),
            "qa": ("exact_match", "f1"), "similarity": ("pearson", "spearman"),
            "embedding": ("ndcg@10", "mrr@10", "pearson", "spearman"), "reranker": ("ndcg@10", "mrr@10", "map@100")}[task]
    shown = [f"{k} {metrics[k]:.4f}" for k in keys if isinstance(metrics.get(k), float)]
    return f"{task}: " + ", ".join(shown)


# ---- inputs -------------------------------------------------------------------------------------

def warn_blank_texts(texts: list[str], path: str | Path, unit: str = "line", tokenizer: Any = None) -> list[int]:
    """Print a warning naming the texts of `path` (1-based `unit` numbers) that give no token: blank,
    or (with the tokenizer) only characters its cleaning drops, such as control characters. They
    are still scored (as empty texts, so outputs stay one per input row); returns their numbers."""
    return [i + 1 for i in flag_empty_texts(path, tokenizer, texts, None, unit)]


def read_classification_inputs(task: Any, path: str | Path) -> tuple[list[str], list[str] | None]:
    """Texts (and second texts): a .txt file has one per line, a tab separating a pair (unless
    label_pattern or a delimiter is set, or its first line names the text column, tab separated);
    other files are read by their text column(s)."""
    path, s = Path(path), task.s
    text = read_text(path, "input file", s.encoding)  # once: the input may be a pipe
    columns = [s.text_column, s.text_pair_column, *(s.validation_where or {})]
    if (path.suffix.lower() == ".txt" and s.label_pattern is None and s.delimiter is None
            and table_layout(path, text, None, s.header, columns) == "lines"):
        rows = [line.split("\t", 1) for line in read_lines(path, text=text)]
        if all(len(r) == 2 for r in rows):
            return [r[0] for r in rows], [r[1] for r in rows]
        return ["\t".join(r) for r in rows], None
    data = task._read(path, labelled=False, where=s.validation_where, text=text)
    return data.texts, data.text_pairs


def read_sentences(path: str | Path, fmt: str = "auto", word_column: int = 0,
                   encoding: str | None = None) -> list[list[str]]:
    """Word lists: a CoNLL file (words in `word_column`; -DOCSTART- or a fixed column count gives
    it away) or one whitespace-split sentence per line."""
    from bert_kit.data.ner import read_conll

    text = read_text(path, "input file", encoding)  # once: the input may be a pipe
    lines = read_lines(path, text=text)
    if fmt == "auto":
        head = [ln.split() for ln in lines[:200] if ln.strip()]
        columns = {len(f) for f in head}
        conll = bool(head) and (head[0][0] == "-DOCSTART-" or
                                (len(columns) == 1 and min(columns) >= 2 and "" in lines[:200]))
        fmt = "conll" if conll else "lines"
    if fmt == "conll":
        # the tags (if any) are not read; the tag column only has to differ from the word column
        return [words for words, _ in read_conll(path, tag_column=0 if word_column == -1 else -1,
                                                 word_column=word_column, text=text)]
    return [ln.split() for ln in lines if ln.strip()]


def read_questions(path: str | Path, skip_bad_answers: bool = False, encoding: str | None = None) -> list[dict]:
    """SQuAD JSON, or JSON Lines of {"question", "context"[, "id"]} (texts, unique ids)."""
    from bert_kit.data.squad import read_squad

    path = Path(path)
    if path.suffix == ".json":
        return read_squad(path, skip_bad_answers, encoding)
    examples, seen = [], {}
    for i, row in parse_jsonl(read_lines(path, encoding), path):
        if not isinstance(row, dict) or "question" not in row or "context" not in row:
            raise KeyError(f"{path}:{i}: needs keys 'question' and 'context'")
        for key in ("question", "context"):
            if not isinstance(row[key], str):
                raise ValueError(f"{path}:{i}: {key!r} is {type(row[key]).__name__}, expected a text")
        qid = str(row.get("id", i))
        if qid in seen:
            raise ValueError(f"{path}:{i}: id {qid!r} is already used on line {seen[qid]}; ids must be unique")
        seen[qid] = i
        examples.append({"id": qid, "question": row["question"], "context": row["context"], "answers": []})
    return examples


def read_pairs(task: Any, path: str | Path) -> tuple[list[str], list[str]]:
    """Sentence pairs: the columns of any pair file when text_pair_column is set; else an STS-B
    file, JSON Lines {"sentence1", "sentence2"}, or two tab-separated columns."""
    path = Path(path)
    text = read_text(path, "input file", task and task.s.encoding)  # once: the input may be a pipe
    if task is not None and task.s.text_pair_column is not None:
        s1, s2, _ = task._read(path, where=task.s.validation_where, scored=False, text=text)
        return s1, s2
    lines = read_lines(path, text=text)
    if path.suffix == ".jsonl":
        s1, s2 = [], []
        for i, row in parse_jsonl(lines, path):
            if not isinstance(row, dict) or "sentence1" not in row or "sentence2" not in row:
                raise KeyError(f"{path}:{i}: needs keys 'sentence1' and 'sentence2'")
            if not (isinstance(row["sentence1"], str) and isinstance(row["sentence2"], str)):
                raise ValueError(f"{path}:{i}: 'sentence1' and 'sentence2' must be texts")
            s1.append(row["sentence1"])
            s2.append(row["sentence2"])
        return s1, s2
    if len(lines[0].split("\t")) >= 7:  # genre, file, year, id, score, s1, s2
        s1, s2, _ = task._read(path, text=text)
        return s1, s2
    s1, s2 = [], []
    for i, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}:{i}: expected 2 tab-separated sentences, got {len(fields)} fields "
                             f"(for a file with named columns set {setting('text_column')} and "
                             f"{setting('text_pair_column')})")
        s1.append(fields[0])
        s2.append(fields[1])
    return s1, s2


# ---- predictions --------------------------------------------------------------------------------

def predict_classification(task: Any, model: Any, path: str | Path, precision: Any, fmt: str) -> list[dict]:
    texts, pairs = read_classification_inputs(task, path)
    unit = "line" if Path(path).suffix == ".txt" else "row"
    flag_empty_texts(path, task.tokenizer, texts, pairs, unit)
    labelled, truncated = classify(task, model, precision, texts, pairs)
    task.report_truncated(path, truncated)
    records = []
    for i, labels in enumerate(labelled):
        rec: dict[str, Any] = {"text": texts[i]}
        if pairs is not None:
            rec["text_pair"] = pairs[i]
        records.append({**rec, **labels})
    return records


def classify(task: Any, model: Any, precision: Any, texts: list[str],
             pairs: list[str] | None = None) -> tuple[list[dict[str, Any]], Any]:
    """(a `label_record` per text, with "truncated": cut to max_length, or "windows": how many
    windows it took (long_text: chunks); the `Truncated` rows)."""
    ds = text_dataset(task, texts, pairs)
    items, cut = [ds[i] for i in range(len(ds))], set(ds.truncated.rows)
    logits = task.logits(model, items, precision) if items else []  # (N, C): one row per item
    if items and task.chunks:
        logits, _ = task.pool(logits, items)  # (D, C): one row per text
    windows = [{"windows": n} if task.chunks else {} for n in ds.windows]
    records = [{**label_record(task, row), "truncated": i in cut, **windows[i]} for i, row in enumerate(logits)]
    return records, ds.truncated


def text_dataset(task: Any, texts: list[str], pairs: list[str] | None = None) -> Any:
    """The texts as the model reads them: one item each, cut to max_length, or (long_text: chunks)
    the items of their windows (`ClassificationDataset`)."""
    from bert_kit.data.classification import ClassificationDataset

    return ClassificationDataset(texts, None, task.tokenizer, task.s.max_length, pairs,
                                 stride=task.stride if task.chunks else None)


def label_record(task: Any, row: Any) -> dict[str, Any]:
    """One example's logits (C,) as JSON: score for a regression head; for several labels per text
    labels and label_ids (those whose sigmoid probability reaches their threshold) and the
    probabilities by label name; else label, label_id and the softmax probabilities."""
    if task.regression:
        return {"score": float(row[0])}
    if task.multi_label:
        ids = task.predicted_labels(row)
        probs = dict(zip(task.label_names, (round(p, 6) for p in row.float().sigmoid().tolist())))
        return {"labels": [task.label_names[j] for j in ids], "label_ids": ids, "probabilities": probs}
    best = int(row.argmax())
    probs = dict(zip(task.label_names, (round(p, 6) for p in row.softmax(-1).tolist())))
    return {"label": task.label_names[best], "label_id": best, "probabilities": probs}


def predict_tokens(task: Any, model: Any, path: str | Path, precision: Any, fmt: str) -> list[dict]:
    sentences = read_sentences(path, fmt, task.s.ner.word_column, task.s.encoding)
    flag_empty_texts(path, task.tokenizer, [" ".join(words) for words in sentences], unit="sentence")
    # every word is tagged, however long its sentence (windows: see bert_kit.data.ner)
    return [tagged_record(words, tags) for words, tags in zip(sentences, task.tag_words(model, sentences, precision))]


def tagged_record(words: list[str], tags: list[str]) -> dict[str, Any]:
    """One sentence's words, tags and entities (type, start, end word index exclusive, text) as JSON."""
    from bert_kit.metrics import get_entities

    entities = [{"type": t, "start": a, "end": b + 1, "text": " ".join(words[a: b + 1])}
                for t, a, b in get_entities(tags)]
    return {"words": words, "tags": tags, "entities": entities}


def predict_answers(task: Any, model: Any, path: str | Path, precision: Any, fmt: str) -> list[dict]:
    from bert_kit.data.squad import prepare_eval_features

    examples = read_questions(path, task.s.qa.skip_bad_answers, task.s.encoding)
    task.report_long_questions(path, examples)
    features = prepare_eval_features(examples, task.tokenizer, task.s.max_length, task.s.qa.doc_stride,
                                     task.s.qa.max_query_length)
    answers = task.answers(model, examples, features, precision)
    return [{"id": ex["id"], "question": ex["question"], "answer": answers[ex["id"]]} for ex in examples]


def predict_similarity(task: Any, model: Any, path: str | Path, precision: Any, fmt: str) -> list[dict]:
    s1, s2 = read_pairs(task, path)
    flag_empty_texts(path, task.tokenizer, s1, s2, "pair")
    found = task.truncation(s1, s2)
    task.report_truncated(path, found)
    cut = set(found.rows)
    scores = task.scores(model, s1, s2, precision)
    return [{"sentence1": a, "sentence2": b, "score": float(x), "truncated": i in cut}
            for i, (a, b, x) in enumerate(zip(s1, s2, scores))]


PREDICTORS = {"classification": predict_classification, "token-classification": predict_tokens,
              "qa": predict_answers, "similarity": predict_similarity}


class TextClassifier:
    """A fine-tuned classification folder, to label texts from Python:

        clf = TextClassifier.from_pretrained("runs/finetune_sst2")
        clf.predict(["a great film", "awful"])
        # [{"label": "positive", "label_id": 1, "probabilities": {"negative": 0.02, "positive": 0.98},
        #   "truncated": False}, {"label": "negative", ...}]

    Each result is what `bert-kit predict` writes for a line: label, label_id, probabilities by
    label name (a regression head: score), and truncated (the text was longer than max_length and
    its first max_length tokens were read). The folder may be a run folder (its best/), an
    exported ONNX folder, or a hub name's local copy.
    """

    def __init__(self, task: Task, model: Any, precision: Any):
        self.task, self.model, self.precision = task, model, precision

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str | None = None, max_length: int | None = None,
                        batch_size: int = 64, precision: str = "auto") -> TextClassifier:
        """device: "cpu", "cuda", ... (default: a GPU when there is one); max_length: tokens per
        text (default: the length the folder was fine-tuned with); precision: auto, fp32, bf16, fp16."""
        from bert_kit.checks import PRECISIONS, Range, check_device, choice_error

        check_device(device)
        Range(3, integer=True, optional=True).check("max_length", max_length)
        Range(1, integer=True).check("batch_size", batch_size)
        if precision not in PRECISIONS:
            raise choice_error("precision", precision, PRECISIONS)
        args = argparse.Namespace(model=str(folder), task="classification", max_length=max_length,
                                  batch_size=batch_size, device=device, precision=precision, backend="auto")
        return cls(*load_task_model(args, verbose=False))

    @property
    def labels(self) -> list[str]:
        """The label names, in the order of the model's outputs (["score"] for a regression head)."""
        return list(self.task.label_names)

    def predict(self, texts: str | list[str], text_pairs: str | list[str] | None = None) -> Any:
        """One result per text (and second text, for a model fine-tuned on pairs), in order; a
        single text gives a single result."""
        single = isinstance(texts, str)
        texts = _text_list(texts, "texts")
        pairs = None if text_pairs is None else _text_list(text_pairs, "text_pairs")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} text_pairs")
        records, _ = classify(self.task, self.model, self.precision, texts, pairs)
        return records[0] if single else records

    __call__ = predict


def _text_list(texts: Any, name: str) -> list[str]:
    """`texts` as a list of str: one str, or a list (tuple, ...) of them; anything else is a TypeError."""
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, (bytes, dict)) or not hasattr(texts, "__iter__"):
        raise TypeError(f"{name} must be a str or a list of str, got {type(texts).__name__}")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(t).__name__}")
    return texts
