"""The task-specific parts of fine-tuning, evaluation and prediction, one class per task.

Each `Task` knows how to read its training and validation files, which head to put on the
encoder, its loss, how to score a model on held-out data, and how to turn model outputs into
answers (labels, word tags, spans, scores; `predict.py` reads the prediction input files):

| task                 | files                     | model                          | best/ kept by |
| -------------------- | ------------------------- | ------------------------------ | ------------- |
| classification       | TSV/CSV/JSONL text, label | BERTForSequenceClassification  | accuracy (pearson if num_labels=1) |
| token-classification | CoNLL (word ... tag)      | BERTForTokenClassification     | entity f1     |
| qa                   | SQuAD v1.1 JSON           | BERTForQuestionAnswering       | f1            |
| similarity           | STS-B (score, s1, s2)     | cross-encoder: regression head | spearman      |
|                      |                           | bi-encoder: BERTModel, cosine  |               |

The loop in `finetune.py` is the same for all four; `settings` is a `FinetuneConfig` (or any
object with its fields). Under torchrun every rank evaluates: `Task.outputs` (and the bi-encoder's
scores) run each rank's share of the examples and gather all outputs on every rank, so every
rank computes the same metrics in 1/N of the time. A saved model folder records its task in config.json (`bert_kit` key:
task, max_length, similarity_mode, pooling) and its label names in `id2label`, so `evaluate`
and `predict` need only the folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.data.classification import ClassificationDataset, pad_collate, read_classification_file
from bert_kit.distributed import all_gather_object, rank, world_size
from bert_kit.embeddings import SentenceEncoder, pool
from bert_kit.heads import BERTForQuestionAnswering, BERTForSequenceClassification, BERTForTokenClassification
from bert_kit.metrics import classification_report_from_predictions, pearson, spearman
from bert_kit.model import BERTModel
from bert_kit.training import compute_classification_loss, compute_cosent_loss, compute_cosine_similarity_loss

TASKS = ("classification", "token-classification", "qa", "similarity")


# ---- model folders --------------------------------------------------------------------------------

def resolve_model_folder(source: str | Path) -> Path | None:
    """A folder with config.json: the folder itself, its `best/` or `final/`, or its newest checkpoint.

    Returns None when `source` is not a folder (a preset name or a config file)."""
    path = Path(source)
    if not path.is_dir():
        return None
    for candidate in (path, path / "best", path / "final"):
        if (candidate / "config.json").is_file():
            return candidate
    from bert_kit.checkpoint import latest_checkpoint

    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"{path} holds no config.json (nor best/, final/ or a step-* checkpoint)")
    return found


def locate_model(source: str | Path) -> tuple[str, Path | str]:
    """("folder", path), ("file", path) or ("preset", name); anything else is a FileNotFoundError."""
    from bert_kit.config import PRESETS

    folder = resolve_model_folder(source)
    if folder is not None:
        return "folder", folder
    if Path(source).is_file():
        return "file", Path(source)
    if str(source).strip() in PRESETS:
        return "preset", str(source).strip()
    raise FileNotFoundError(f"model {str(source)!r} is neither a model folder, a config file nor a preset "
                            f"({', '.join(sorted(PRESETS))})")


def build_model(cls: type, source: str | Path, vocab_size: int, **head_args: Any) -> nn.Module:
    """`cls` from a model folder (pretrained weights, new head) or, for a preset name or config
    file, freshly initialised with the tokenizer's vocabulary size."""
    from bert_kit.config import BertConfig

    kind, where = locate_model(source)
    if kind == "folder":
        model = cls.from_pretrained(where, **head_args)
    elif kind == "file":
        model = cls(BertConfig.from_file(where), **head_args)
    else:
        model = cls(BertConfig.from_name(where, vocab_size=vocab_size), **head_args)
    if model.config.vocab_size < vocab_size:
        raise ValueError(f"model vocab_size {model.config.vocab_size} is smaller than the tokenizer's {vocab_size}")
    return model


def freeze_pooler(model: nn.Module) -> nn.Module:
    """Heads that never read the pooled [CLS] output leave the pooler frozen (unchanged when
    saved), so the optimizer and DDP see no parameter that never gets a gradient."""
    encoder = model.bert if hasattr(model, "bert") else model
    encoder.pooler.requires_grad_(False)
    return model


def read_model_metadata(folder: str | Path) -> dict[str, Any]:
    """What a fine-tuned folder's config.json says: the `bert_kit` dict plus label names."""
    d = json.loads((Path(folder) / "config.json").read_text())
    meta = dict(d.get("bert_kit") or {})
    meta["architectures"] = d.get("architectures") or []
    if "id2label" in d:
        meta["label_names"] = [d["id2label"][k] for k in sorted(d["id2label"], key=int)]
    return meta


def write_model_metadata(folder: str | Path, meta: dict[str, Any]) -> None:
    """Merge `meta` into config.json's `bert_kit` dict (ignored by both loaders) and set finetuning_task."""
    path = Path(folder) / "config.json"
    d = json.loads(path.read_text())
    d["bert_kit"] = {**(d.get("bert_kit") or {}), **meta}
    d["finetuning_task"] = meta.get("task")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(d, indent=2) + "\n")
    tmp.replace(path)


# ---- batching ----------------------------------------------------------------------------------

def item_length(item: dict) -> int:
    """Tokens in one example (both sentences for bi-encoder pairs)."""
    return sum(len(v) for k, v in item.items() if k.startswith("input_ids"))


def sorted_batches(items: Sequence[dict], batch_size: int, collate: Callable) -> Iterator[tuple[list[int], dict]]:
    """(indices, batch) over `items` sorted by length, so padding is small at inference."""
    order = sorted(range(len(items)), key=lambda i: -item_length(items[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start: start + batch_size]
        yield chunk, collate([items[i] for i in chunk])


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def encode(model: nn.Module, batch: dict, unpadded: bool, suffix: str = "") -> Any:
    """Call the model on input_ids{suffix}, attention_mask{suffix}, token_type_ids{suffix}."""
    return model(batch["input_ids" + suffix], batch["attention_mask" + suffix],
                 batch.get("token_type_ids" + suffix), unpadded=unpadded)


def shard_and_gather(items: Sequence[Any], fn: Callable[[list], Sequence[Any]]) -> list[Any]:
    """`fn` over this rank's share of `items`; its results for all items, in order, on every rank.

    A single process runs `fn(items)`. With several ranks this is collective (every rank calls it
    with the same items): rank r takes items r, r + N, r + 2N, ... and the shares are padded with
    copies of the first item to equal length, so every rank runs as many batches (FSDP2's forward
    gathers weights from all ranks, so a rank with one batch less would leave the others waiting).
    `fn(list)` returns one result per item; results must be picklable.
    """
    world = world_size()
    if world <= 1 or not items:
        return list(fn(list(items)))
    share = list(items[rank()::world])
    n = len(share)
    share += [items[0]] * (-(-len(items) // world) - n)
    out: list[Any] = [None] * len(items)
    for r, results in enumerate(all_gather_object(list(fn(share))[:n])):
        out[r::world] = results
    return out


def _label_names(meta_names: Sequence[str] | None, n: int) -> list[str]:
    return list(meta_names) if meta_names else [str(i) for i in range(n)]


class Task:
    """Shared behaviour; subclasses fill in data, model, loss, evaluation and prediction."""

    name = ""
    default_metric = ""

    def __init__(self, settings: Any):
        self.s = settings
        self.label_names: list[str] | None = None

    @property
    def metric(self) -> str:
        return getattr(self.s, "metric", None) or self.default_metric

    def collate(self, items: list[dict]) -> dict:
        return pad_collate(items, pad_token_id=self.pad_token_id, pad_to_multiple_of=self.pad_multiple)

    @property
    def pad_multiple(self) -> int:
        """Compiled runs pad lengths to multiples of 16: few shapes, no recompiles."""
        return 16 if getattr(self.s, "compile", False) else 1

    def bind(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id

    def metadata(self) -> dict[str, Any]:
        return {"task": self.name, "max_length": self.s.max_length}

    def load_metadata(self, meta: dict[str, Any]) -> None:
        """Take label names etc. from a saved folder (evaluate / predict)."""
        self.label_names = meta.get("label_names")

    def model_class(self) -> type:
        raise NotImplementedError

    def load(self, folder: str | Path) -> nn.Module:
        """A fine-tuned model for evaluation or prediction; its head must be in the folder."""
        cls = self.model_class()
        try:  # strict: a head that is missing would otherwise be silently random
            return cls.from_pretrained(folder, strict=cls is not BERTModel)
        except ValueError as e:
            raise ValueError(f"{folder} is not a {self.name} model (fine-tune it first: bert-kit finetune "
                             f"--task {self.name}): {e}") from None

    def outputs(self, model: nn.Module, items: Sequence[dict], precision: Any, fn: Callable) -> list:
        """fn(model, device batch) -> tensor (B, ...) for each example, in the order of `items`.

        Under torchrun each rank runs its share and all rows are gathered (`shard_and_gather`):
        every rank must call this, with the same items."""
        return shard_and_gather(items, lambda share: self._outputs(model, share, precision, fn))

    def _outputs(self, model: nn.Module, items: Sequence[dict], precision: Any, fn: Callable) -> list:
        was_training = model.training
        model.eval()
        out: list = [None] * len(items)
        # length-sorted batches pad to about their own length; rows go back to the items' order
        try:
            with torch.inference_mode():
                for idx, batch in sorted_batches(items, self.s.eval_batch_size, self.collate):
                    with precision.autocast():
                        result = fn(model, to_device(batch, precision.device))
                    for row, i in zip(result.float().cpu(), idx):
                        out[i] = row
        finally:
            model.train(was_training)
        return out


# ---- sequence classification ------------------------------------------------------------------------

class ClassificationTask(Task):
    name, default_metric = "classification", "accuracy"

    @property
    def regression(self) -> bool:
        return self.num_labels == 1

    @property
    def metric(self) -> str:
        return getattr(self.s, "metric", None) or ("pearson" if self.regression else "accuracy")

    def _read(self, path: str | Path, labelled: bool = True):
        s = self.s
        data = read_classification_file(path, s.text_column, s.label_column if labelled else None, s.text_pair_column)
        if labelled and data.label_names is not None and self.label_names:  # string labels: ids of our names
            data = read_classification_file(path, s.text_column, s.label_column, s.text_pair_column,
                                            label_names=self.label_names)
        return data

    def read_train(self, path: str | Path) -> list[dict]:
        self.label_names = list(self.s.label_names) if self.s.label_names else None
        data = self._read(path)
        floats = any(isinstance(y, float) for y in data.labels)
        if self.s.num_labels == 1 or floats:  # scores, not classes: one output, MSE loss
            self.num_labels, self.label_names = 1, ["score"]
        else:
            self.num_labels = self.s.num_labels or len(data.label_names or []) or max(data.labels) + 1
            self.label_names = _label_names(self.label_names or data.label_names, self.num_labels)
        return self._dataset(data, path)

    def read_eval(self, path: str | Path, limit: int | None = None) -> list[dict]:
        return self._dataset(self._read(path), path, limit)

    def _dataset(self, data, path, limit: int | None = None) -> list[dict]:
        n = len(data.texts) if limit is None else min(limit, len(data.texts))
        labels = [float(y) for y in data.labels[:n]] if self.regression else list(data.labels[:n])
        if not self.regression:
            # a label the head has no output for would index out of range inside cross-entropy
            bad = [y for y in labels if not 0 <= y < self.num_labels]
            if bad:
                raise ValueError(f"{path}: label {bad[0]} outside the model's {self.num_labels} classes")
        pairs = None if data.text_pairs is None else data.text_pairs[:n]
        ds = ClassificationDataset(data.texts[:n], labels, self.tokenizer, self.s.max_length, pairs)
        return [ds[i] for i in range(len(ds))]

    def model_class(self) -> type:
        return BERTForSequenceClassification

    def build(self, source: str | Path) -> nn.Module:
        model = build_model(BERTForSequenceClassification, source, self.tokenizer.vocab_size,
                            num_labels=self.num_labels, classifier_dropout=self.s.classifier_dropout)
        model.id2label = {str(i): n for i, n in enumerate(self.label_names)}
        return model

    def load_metadata(self, meta: dict[str, Any]) -> None:
        super().load_metadata(meta)
        self.num_labels = len(self.label_names or []) or 2

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        return compute_classification_loss(encode(model, batch, self.s.unpadded), batch["labels"]), {}

    def logits(self, model: nn.Module, items: Sequence[dict], precision: Any) -> torch.Tensor:
        return torch.stack(self.outputs(model, items, precision, lambda m, b: encode(m, b, self.s.unpadded)))

    def evaluate(self, model: nn.Module, items: Sequence[dict], precision: Any) -> dict[str, Any]:
        logits = self.logits(model, items, precision)  # (N, C)
        if self.regression:
            scores, gold = logits[:, 0].numpy(), np.array([it["labels"] for it in items], dtype=np.float64)
            return {"mse": float(np.mean((scores - gold) ** 2)), "pearson": pearson(scores, gold),
                    "spearman": spearman(scores, gold), "num_examples": len(items)}
        gold = torch.tensor([it["labels"] for it in items])
        report = classification_report_from_predictions(gold.numpy(), logits.argmax(-1).numpy(), self.num_labels,
                                                         self.label_names)
        report["loss"] = float(F.cross_entropy(logits, gold))
        return report


# ---- token classification (NER) -----------------------------------------------------------------

class TokenClassificationTask(Task):
    name, default_metric = "token-classification", "f1"

    def _dataset(self, sentences, limit: int | None = None):
        from bert_kit.data.ner import NERDataset

        return NERDataset(sentences[:limit] if limit else sentences, self.tokenizer, self.label_names,
                          self.s.max_length)

    fixed_labels = False  # True once the labels are those of a saved head

    def load_metadata(self, meta: dict[str, Any]) -> None:
        super().load_metadata(meta)
        self.fixed_labels = True

    def read_train(self, path: str | Path) -> list[dict]:
        from bert_kit.data.ner import get_label_list, read_conll

        sentences = read_conll(path, self.s.tag_column)
        self.label_names = list(self.s.label_names) if self.s.label_names else get_label_list(sentences)
        ds = self._dataset(sentences)
        return [ds[i] for i in range(len(ds))]

    def read_eval(self, path: str | Path, limit: int | None = None) -> Any:
        from bert_kit.data.ner import read_conll

        sentences = read_conll(path, self.s.tag_column)[:limit]
        unseen = sorted({t for _, tags in sentences for t in tags} - set(self.label_names))
        if unseen and not self.fixed_labels:  # before the head exists, a validation-only tag joins the set
            self.label_names += unseen
        self.eval_dataset = self._dataset(sentences)
        return [self.eval_dataset[i] for i in range(len(self.eval_dataset))]

    def model_class(self) -> type:
        return BERTForTokenClassification

    def build(self, source: str | Path) -> nn.Module:
        model = build_model(BERTForTokenClassification, source, self.tokenizer.vocab_size,
                            num_labels=len(self.label_names), classifier_dropout=self.s.classifier_dropout)
        model.id2label = {str(i): n for i, n in enumerate(self.label_names)}
        return freeze_pooler(model)

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        # (B, T, C) logits against (B, T) labels; -100 (later sub-tokens, specials, padding) ignored
        return compute_classification_loss(encode(model, batch, self.s.unpadded), batch["labels"]), {}

    def tag(self, model: nn.Module, dataset: Any, precision: Any) -> list[list[str]]:
        """Predicted tags, one per word, for every sentence of an NERDataset."""
        items = [dataset[i] for i in range(len(dataset))]
        logits = self.outputs(model, items, precision, lambda m, b: encode(m, b, self.s.unpadded))
        return [dataset.predictions_to_tags(i, row.argmax(-1)) for i, row in enumerate(logits)]

    def evaluate(self, model: nn.Module, items: Sequence[dict], precision: Any) -> dict[str, Any]:
        from bert_kit.metrics import entity_f1

        predicted = self.tag(model, self.eval_dataset, precision)
        gold = [tags for _, tags in self.eval_dataset.sentences]
        scores = entity_f1(gold, predicted)
        words = sum(len(t) for t in gold)
        # word-level accuracy (every word, "O" included) beside the entity scores
        scores["accuracy"] = sum(p == g for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs)) / max(words, 1)
        scores["num_sentences"] = len(gold)
        return scores


# ---- extractive question answering --------------------------------------------------------------

class QATask(Task):
    name, default_metric = "qa", "f1"

    def _examples(self, path: str | Path, part: str) -> list[dict]:
        """SQuAD examples; with `squad_train_articles` N, train on the first N articles, evaluate on the rest."""
        from bert_kit.data.squad import read_squad, split_by_article

        examples = read_squad(path)
        n = self.s.squad_train_articles
        if n:
            train, held_out = split_by_article(examples, n)
            examples = train if part == "train" else held_out
        return examples

    def read_train(self, path: str | Path) -> list[dict]:
        from bert_kit.data.squad import prepare_train_features

        self.label_names = None
        return prepare_train_features(self._examples(path, "train"), self.tokenizer, self.s.max_length,
                                      self.s.doc_stride, self.s.max_query_length)

    def read_eval(self, path: str | Path, limit: int | None = None) -> list[dict]:
        from bert_kit.data.squad import prepare_eval_features

        self.eval_examples = self._examples(path, "eval")[:limit]
        return prepare_eval_features(self.eval_examples, self.tokenizer, self.s.max_length, self.s.doc_stride,
                                     self.s.max_query_length)

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "doc_stride": self.s.doc_stride, "max_query_length": self.s.max_query_length}

    def model_class(self) -> type:
        return BERTForQuestionAnswering

    def build(self, source: str | Path) -> nn.Module:
        return freeze_pooler(build_model(BERTForQuestionAnswering, source, self.tokenizer.vocab_size))

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        start, end = encode(model, batch, self.s.unpadded)  # (B, T) each
        # mean of the start and end cross-entropies, as BERT; targets are 0 ([CLS]) when the
        # window does not hold the answer
        loss = (F.cross_entropy(start.float(), batch["start_positions"]) +
                F.cross_entropy(end.float(), batch["end_positions"])) / 2
        return loss, {}

    def answers(self, model: nn.Module, examples: list[dict], features: list[dict], precision: Any) -> dict[str, str]:
        from bert_kit.data.squad import postprocess_predictions

        rows = self.outputs(model, features, precision, lambda m, b: torch.stack(encode(m, b, self.s.unpadded), 1))
        return postprocess_predictions(examples, features, [r[0].numpy() for r in rows], [r[1].numpy() for r in rows],
                                       self.s.n_best, self.s.max_answer_length)

    def evaluate(self, model: nn.Module, features: list[dict], precision: Any) -> dict[str, Any]:
        from bert_kit.metrics import squad_evaluate

        scores = squad_evaluate(self.answers(model, self.eval_examples, features, precision), self.eval_examples)
        return {**scores, "num_examples": len(self.eval_examples), "num_features": len(features)}


# ---- sentence similarity ------------------------------------------------------------------------

class SimilarityTask(Task):
    """STS: a cross-encoder (regression head on "[CLS] a [SEP] b [SEP]", MSE on the 0-5 score) or
    a bi-encoder (one encoder, pooled vectors u and v, CosineSimilarityLoss: MSE(cos(u, v), score / 5),
    or with similarity_loss=cosent the CoSENT ranking loss on cos(u, v))."""

    name, default_metric = "similarity", "spearman"
    MAX_SCORE = 5.0

    @property
    def bi_encoder(self) -> bool:
        return self.s.similarity_mode == "bi-encoder"

    def _read(self, path: str | Path, limit: int | None = None) -> tuple[list[str], list[str], list[float]]:
        from bert_kit.data.sts import read_sts

        s1, s2, scores = read_sts(path)
        return s1[:limit], s2[:limit], scores[:limit]

    def _items(self, s1: list[str], s2: list[str], scores: list[float] | None) -> list[dict]:
        if not self.bi_encoder:  # one "[CLS] s1 [SEP] s2 [SEP]" sequence per pair, the score as label
            ds = ClassificationDataset(s1, scores, self.tokenizer, self.s.max_length, s2)
            return [ds[i] for i in range(len(ds))]
        enc = {key: self.tokenizer(texts, max_length=self.s.max_length, padding=False, return_tensors=None)
               for key, texts in (("a", s1), ("b", s2))}
        items = []
        for i in range(len(s1)):
            item = {f"{k}_{side}": enc[side][k][i] for side in "ab" for k in ("input_ids", "attention_mask")}
            if scores is not None:
                item["labels"] = float(scores[i]) / self.MAX_SCORE  # cosine targets in [0, 1]
            items.append(item)
        return items

    def read_train(self, path: str | Path) -> list[dict]:
        self.label_names = ["score"]
        return self._items(*self._read(path))

    def read_eval(self, path: str | Path, limit: int | None = None) -> list[dict]:
        self.eval_pairs = self._read(path, limit)
        return self._items(*self.eval_pairs)

    def collate(self, items: list[dict]) -> dict:
        if not self.bi_encoder:
            return pad_collate(items, self.pad_token_id, self.pad_multiple)
        # all first sentences, then all second ones: (2B, T), one forward pass for both sides
        # (one pass per step also keeps DDP's one-forward-one-backward rule)
        sides = [{"input_ids": it[f"input_ids_{side}"], "attention_mask": it[f"attention_mask_{side}"]}
                 for side in "ab" for it in items]
        out = pad_collate(sides, self.pad_token_id, self.pad_multiple)
        out["token_type_ids"] = torch.zeros_like(out["input_ids"])
        if "labels" in items[0]:
            out["labels"] = torch.tensor([it["labels"] for it in items], dtype=torch.float32)  # (B,)
        return out

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "similarity_mode": self.s.similarity_mode, "pooling": self.s.pooling}

    def model_class(self) -> type:
        return BERTModel if self.bi_encoder else BERTForSequenceClassification

    def build(self, source: str | Path) -> nn.Module:
        if self.bi_encoder:
            return freeze_pooler(build_model(BERTModel, source, self.tokenizer.vocab_size))
        model = build_model(BERTForSequenceClassification, source, self.tokenizer.vocab_size, num_labels=1,
                            classifier_dropout=self.s.classifier_dropout)
        model.id2label = {"0": "score"}
        return model

    def embed_pair(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Pooled vectors u, v (B, H) of both sides of a bi-encoder batch of 2B sentences."""
        vectors = pool(encode(model, batch, self.s.unpadded), batch["attention_mask"], self.s.pooling)  # (2B, H)
        return vectors.chunk(2)

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        if not self.bi_encoder:
            return compute_classification_loss(encode(model, batch, self.s.unpadded), batch["labels"]), {}
        u, v = self.embed_pair(model, batch)
        if self.s.similarity_loss == "cosent":
            return compute_cosent_loss(u, v, batch["labels"]), {}
        return compute_cosine_similarity_loss(u, v, batch["labels"]), {}

    def scores(self, model: nn.Module, s1: list[str], s2: list[str], precision: Any) -> np.ndarray:
        """Predicted similarity of each pair: cosine of pooled vectors, or the regression output."""
        if self.bi_encoder:
            # the SentenceEncoder that embeds after training, so the score is what users get
            encoder = SentenceEncoder(model, self.tokenizer, self.s.pooling, True, self.s.max_length,
                                      precision.device, unpadded=True)
            was_training = model.training
            try:  # under torchrun each rank scores its share of the pairs
                scores = shard_and_gather(list(zip(s1, s2)), lambda pairs: encoder.similarity(
                    [a for a, _ in pairs], [b for _, b in pairs], self.s.eval_batch_size).tolist())
                return np.asarray(scores, dtype=np.float64)
            finally:
                model.train(was_training)
        items = self._items(s1, s2, None)
        rows = self.outputs(model, items, precision, lambda m, b: encode(m, b, self.s.unpadded))
        return torch.stack(rows)[:, 0].double().numpy()

    def evaluate(self, model: nn.Module, items: Sequence[dict], precision: Any) -> dict[str, Any]:
        s1, s2, gold = self.eval_pairs
        predicted = self.scores(model, s1, s2, precision)
        result = {"pearson": pearson(predicted, gold), "spearman": spearman(predicted, gold), "num_examples": len(gold)}
        if not self.bi_encoder:
            result["mse"] = float(np.mean((predicted - np.asarray(gold)) ** 2))
        return result


TASK_CLASSES: dict[str, type[Task]] = {
    "classification": ClassificationTask,
    "token-classification": TokenClassificationTask,
    "qa": QATask,
    "similarity": SimilarityTask,
}


def make_task(name: str, settings: Any) -> Task:
    if name not in TASK_CLASSES:
        raise ValueError(f"task must be one of {TASKS}, got {name!r}")
    return TASK_CLASSES[name](settings)


def write_sentence_transformers_files(folder: str | Path, pooling: str, max_length: int) -> None:
    """modules.json and pooling config so `sentence_transformers.SentenceTransformer(folder)`
    loads a bi-encoder with the same pooling and normalisation as `SentenceEncoder`."""
    folder = Path(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_length,
                                                                  "do_lower_case": False}, indent=2) + "\n")
    (folder / "1_Pooling").mkdir(exist_ok=True)
    hidden = json.loads((folder / "config.json").read_text())["hidden_size"]
    pooling_config = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
                      "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
                      "pooling_mode_mean_sqrt_len_tokens": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2) + "\n")
