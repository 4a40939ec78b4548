"""What the server computes: one `Operation` per endpoint, built around a loaded model folder.

| endpoint         | served for           | one input                       | one output                           |
| ---------------- | -------------------- | ------------------------------- | ------------------------------------ |
| POST /embed      | every folder         | text                            | vector (pooled, unit length)         |
| POST /classify   | classification       | text, or [text, text_pair]      | label, label_id, probabilities       |
|                  |                      |                                 | (score for a regression head)        |
| POST /tag        | token-classification | text (split on spaces) or words | words, tags, entities                |
| POST /answer     | qa                   | {question, context}             | answer (a span of the context)       |
| POST /similarity | similarity           | [sentence1, sentence2]          | score (cosine, or the cross-encoder) |
| POST /fill-mask  | an MLM head          | text with [MASK]                | top-k tokens per mask                |

An operation splits a request into three steps, so the batcher can mix requests: `prepare`
tokenizes one request's inputs on the event loop (one `Item` per input, its token count the
batch cost), `run` computes one batch of items from many requests on the batching thread, and
`respond` shapes one request's outputs as JSON. The model work in `run` is the existing task
code (`Task.logits`, `Task.tag`, `Task.answers`, `Task.scores`, `SentenceEncoder.encode_ids`,
`fill_masks`), so the server answers exactly what `predict`, `embed` and `fill-mask` answer.

Backends: `load_torch` builds these around torch modules, or around an exported folder's ONNX Runtime
session (the same call and outputs, `bert_kit.onnx_runtime.OnnxModel`). Everything above the model call
(HTTP, limits, batching, metrics) only sees `Operation`s, so another runtime (ONNX Runtime for
an exported folder) plugs in as one more loader in `BACKENDS` that returns the same operations
around its own callable (the task code calls `model(input_ids, attention_mask, token_type_ids,
unpadded=...)`, the encoder calls `SentenceEncoder.forward`).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from bert_kit.serving.batcher import Item
from bert_kit.serving.schema import InputError

TEXT = {"type": "string"}
PAIR = {"type": "array", "minItems": 2, "maxItems": 2, "items": TEXT}
NUMBER, INTEGER = {"type": "number"}, {"type": "integer"}
BATCH = 1 << 30  # the task code's own batch size: a dynamic batch is always one forward pass


class Operation:
    """One endpoint: its schemas, and prepare / run / respond (see the module docstring)."""

    path = ""
    summary = ""
    input_schema: dict = TEXT  # one input
    options: dict[str, dict] = {}  # request fields besides "inputs": name -> schema with its default
    output_key = "predictions"  # the response is {output_key: [one output per input]}
    output_schema: dict = {}
    example: Any = "A man is playing a guitar."  # one input: the OpenAPI example and the warm-up batch
    pads_batches = False  # the model computes every input at the batch's longest length

    def request_schema(self) -> dict:
        inputs = {"type": "array", "minItems": 1, "items": self.input_schema}
        return {"type": "object", "required": ["inputs"], "additionalProperties": False,
                "properties": {"inputs": inputs, **self.options}}

    def with_defaults(self, body: dict) -> dict:
        """The request's options, defaults filled in."""
        return {name: body.get(name, schema["default"]) for name, schema in self.options.items()}

    def strings(self, value: Any) -> list[str]:
        """The strings inside one input (for the per-input character limit)."""
        if isinstance(value, str):
            return [value]
        if isinstance(value, dict):
            return [v for v in value.values() if isinstance(v, str)]
        return [v for v in value if isinstance(v, str)]

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        raise NotImplementedError

    def run(self, items: list[Item]) -> list:
        raise NotImplementedError

    def respond(self, outputs: list, options: dict) -> list:
        return outputs

    def __repr__(self) -> str:
        return f"POST {self.path}"


class Embed(Operation):
    path, summary = "/embed", "Sentence embeddings: one pooled vector per text."
    options = {"normalize": {"type": "boolean", "default": True, "description": "scale each vector to unit length"}}
    output_key = "embeddings"
    output_schema = {"type": "array", "items": NUMBER}

    def __init__(self, encoder: Any):
        self.encoder = encoder  # a SentenceEncoder built with normalize=False: `respond` normalises on request
        self.pads_batches = not encoder.unpadded

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        return [Item(len(ids), ids) for ids in self.encoder.tokenize(inputs)]

    def run(self, items: list[Item]) -> list:
        return list(self.encoder.encode_ids([it.data for it in items]).float().cpu())  # B x (H,)

    def respond(self, outputs: list, options: dict) -> list:
        vectors = torch.stack(outputs)  # (n, H)
        if options["normalize"]:
            vectors = F.normalize(vectors, dim=-1)  # as SentenceEncoder(normalize=True)
        return vectors.tolist()


class _TaskOperation(Operation):
    """An operation that runs a fine-tuned folder's `Task` with its model."""

    def __init__(self, task: Any, model: Any, precision: Any):
        self.task, self.model, self.precision = task, model, precision
        self.tokenizer, self.max_length = task.tokenizer, task.s.max_length
        self.pads_batches = getattr(model, "pads_batches", False) or not task.unpadded


class Classify(_TaskOperation):
    path, summary = "/classify", "Sequence classification: label and probabilities of each text or text pair."
    input_schema = {"oneOf": [TEXT, PAIR]}
    output_schema = {"type": "object", "properties": {
        "label": TEXT, "label_id": INTEGER, "score": {**NUMBER, "description": "regression heads only"},
        "probabilities": {"type": "object", "additionalProperties": NUMBER, "description": "by label name"}}}

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        from bert_kit.data.classification import ClassificationDataset

        items = []
        for x in inputs:
            text, pair = (x, None) if isinstance(x, str) else x
            item = ClassificationDataset([text], None, self.tokenizer, self.max_length,
                                         None if pair is None else [pair])[0]
            items.append(Item(len(item["input_ids"]), item))
        return items

    def run(self, items: list[Item]) -> list:
        from bert_kit.tasks.inference import label_record

        logits = self.task.logits(self.model, [it.data for it in items], self.precision)  # (B, C)
        return [label_record(self.task, row) for row in logits]


class Tag(_TaskOperation):
    path, summary = "/tag", "Token classification: one tag per word, and the entities they spell."
    input_schema = {"oneOf": [TEXT, {"type": "array", "minItems": 1, "items": TEXT}]}
    example = "John Smith lives in New York ."
    output_schema = {"type": "object", "properties": {
        "words": {"type": "array", "items": TEXT}, "tags": {"type": "array", "items": TEXT},
        "entities": {"type": "array", "items": {"type": "object", "properties": {
            "type": TEXT, "start": INTEGER, "end": {**INTEGER, "description": "word index, exclusive"},
            "text": TEXT}}}}}

    def _dataset(self, sentences: list[list[str]]) -> Any:
        from bert_kit.data.ner import NERDataset

        return NERDataset([(words, None) for words in sentences], self.tokenizer, self.task.label_names,
                          self.max_length)

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        sentences = []
        for i, x in enumerate(inputs):
            words = x.split() if isinstance(x, str) else list(x)
            if not words:
                raise InputError(f"inputs[{i}]", "has no words")
            blank = next((j for j, w in enumerate(words) if not w.strip()), None)
            if blank is not None:
                raise InputError(f"inputs[{i}][{blank}]", "is a blank word")
            sentences.append(words)
        dataset = self._dataset(sentences)
        return [Item(len(dataset[i]["input_ids"]), words) for i, words in enumerate(sentences)]

    def run(self, items: list[Item]) -> list:
        from bert_kit.tasks.inference import tagged_record

        sentences = [it.data for it in items]
        tags = self.task.tag(self.model, self._dataset(sentences), self.precision)
        return [tagged_record(words, t) for words, t in zip(sentences, tags)]


class Answer(_TaskOperation):
    path, summary = "/answer", "Extractive question answering: the span of the context that answers the question."
    input_schema = {"type": "object", "required": ["question", "context"], "additionalProperties": False,
                    "properties": {"question": TEXT, "context": TEXT}}
    example = {"question": "Where does John live?", "context": "John lives in Paris with his two cats."}
    output_schema = {"type": "object", "properties": {"answer": {**TEXT, "description": "empty when no span fits"}}}

    def __init__(self, task: Any, model: Any, precision: Any):
        super().__init__(task, model, precision)
        self._ids = itertools.count()  # example ids unique across the requests that share a batch

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        from bert_kit.data.squad import prepare_eval_features

        examples = [{"id": str(next(self._ids)), "question": x["question"], "context": x["context"], "answers": []}
                    for x in inputs]
        s = self.task.s  # long contexts become several windows; an item holds all of its example's
        features = prepare_eval_features(examples, self.tokenizer, s.max_length, s.doc_stride, s.max_query_length)
        windows: dict[str, list[dict]] = {ex["id"]: [] for ex in examples}
        for f in features:
            windows[f["example_id"]].append(f)
        return [Item(max(1, sum(len(f["input_ids"]) for f in windows[ex["id"]])), (ex, windows[ex["id"]]))
                for ex in examples]

    def run(self, items: list[Item]) -> list:
        examples = [ex for ex, _ in (it.data for it in items)]
        features = [f for _, fs in (it.data for it in items) for f in fs]
        answers = self.task.answers(self.model, examples, features, self.precision) if features else {}
        return [{"answer": answers.get(ex["id"], "")} for ex in examples]


class Similarity(_TaskOperation):
    path, summary = "/similarity", "Sentence similarity of each pair (bi-encoder cosine or cross-encoder score)."
    input_schema = PAIR
    example = ["A man is eating food.", "Someone is eating a meal."]
    output_key = "scores"
    output_schema = NUMBER

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        enc = [self.tokenizer([p[side] for p in inputs], max_length=self.max_length, padding=False,
                              return_tensors=None)["input_ids"] for side in (0, 1)]
        return [Item(len(a) + len(b), pair) for a, b, pair in zip(enc[0], enc[1], inputs)]

    def run(self, items: list[Item]) -> list:
        scores = self.task.scores(self.model, [it.data[0] for it in items], [it.data[1] for it in items],
                                  self.precision)
        return [float(x) for x in scores]


class FillMask(Operation):
    path, summary = "/fill-mask", "Top-k tokens for every [MASK] in each text (models with an MLM head)."
    options = {"top_k": {"type": "integer", "minimum": 1, "maximum": 100, "default": 5,
                         "description": "predictions per mask"}}
    output_schema = {"type": "array", "description": "one list per [MASK], in order", "items": {
        "type": "array", "items": {"type": "object", "properties": {
            "token": TEXT, "token_id": INTEGER, "score": NUMBER, "sequence": TEXT}}}}

    def __init__(self, model: Any, tokenizer: Any, max_length: int):
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.example = f"paris is the {tokenizer.convert_ids_to_tokens(tokenizer.mask_token_id)} of france."

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        rows = self.tokenizer(inputs, max_length=self.max_length, padding=False, return_tensors=None)["input_ids"]
        mask = self.tokenizer.mask_token_id
        for i, ids in enumerate(rows):
            if mask not in ids:
                token = self.tokenizer.convert_ids_to_tokens(mask)
                raise InputError(f"inputs[{i}]", f"has no {token} token (within the first {self.max_length} tokens)")
        return [Item(len(ids), (ids, options["top_k"])) for ids in rows]

    def run(self, items: list[Item]) -> list:
        from bert_kit.tasks.fill_mask import fill_masks

        k = max(top_k for _, top_k in (it.data for it in items))
        results = fill_masks(self.model, self.tokenizer, [ids for ids, _ in (it.data for it in items)], k)
        return [[row[:top_k] for row in masks] for masks, (_, top_k) in zip(results, (it.data for it in items))]


# ---- loading a folder -------------------------------------------------------------------------

def _has_mlm_head(folder: Path) -> bool:
    """Whether the weights hold an MLM head (cls.predictions.*), without loading them from safetensors."""
    from bert_kit.hf import read_state_dict

    weights = folder / "model.safetensors"
    if weights.is_file():
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as f:
            keys = list(f.keys())
    else:
        keys = list(read_state_dict(folder))
    return any(k.startswith("cls.predictions.") for k in keys)


def load_torch(folder: str | Path, device: str | None = None, precision: str = "auto",
               max_length: int | None = None) -> tuple[dict[str, Any], list[Operation]]:
    """(description, operations) of a model folder, run by PyTorch.

    A folder written by `bert-kit finetune` serves its task (and /embed from its encoder); any other
    BERT folder serves /embed, and /fill-mask when it holds MLM head weights."""
    from bert_kit.embeddings import SentenceEncoder
    from bert_kit.model import BERTModel
    from bert_kit.model_folder import (
        read_model_metadata,
        resolve_model_folder,
        sentence_transformers_settings,
    )
    from bert_kit.tasks.inference import load_task_model
    from bert_kit.tokenizer import get_tokenizer
    from bert_kit.training.precision import resolve_precision

    found = resolve_model_folder(folder)
    if found is None:
        raise FileNotFoundError(f"model folder not found: {folder}")
    meta, st = read_model_metadata(found), sentence_transformers_settings(found)
    info: dict[str, Any] = {"model": str(found), "task": meta.get("task")}
    ops: list[Operation] = []
    if meta.get("onnx"):  # written by `bert-kit export`: ONNX Runtime on the CPU
        return _exported(found, meta, info, max_length)
    if info["task"]:
        flags = argparse.Namespace(model=str(found), task=None, max_length=max_length, device=device,
                                   precision=precision, batch_size=BATCH, text_column="sentence",
                                   text_pair_column=None)
        task, model, prec = load_task_model(flags, verbose=False)
        encoder_model = model if isinstance(model, BERTModel) else model.bert  # /embed shares the weights
        pooling, length = getattr(task.s, "pooling", "mean"), task.s.max_length
        op = {"classification": Classify, "token-classification": Tag, "qa": Answer, "similarity": Similarity}
        ops.append(op[task.name](task, model, prec))
        info.update(labels=task.label_names, device=str(prec.device), precision=str(prec.dtype).removeprefix("torch."))
        if task.name == "similarity":
            info["similarity_mode"] = task.s.similarity_mode
        tokenizer = task.tokenizer
    else:
        prec = resolve_precision(precision, device or "auto", verbose=False)
        pooling = meta.get("pooling") or st.get("pooling") or "mean"
        length = max_length or meta.get("max_length") or st.get("max_length") or 256
        tokenizer = get_tokenizer(found)
        if _has_mlm_head(found):
            from bert_kit.tasks.fill_mask import load_mlm_model

            mlm = load_mlm_model(found, prec.device)
            ops.append(FillMask(mlm, tokenizer, min(length, mlm.config.max_position_embeddings)))
            encoder_model = mlm.bert
        else:
            encoder_model = BERTModel.from_pretrained(found)
        info.update(device=str(prec.device), precision="float32")
    encoder = SentenceEncoder(encoder_model, tokenizer, pooling, normalize=False, max_length=length,
                              device=prec.device)
    info.update(max_length=length, pooling=pooling, hidden_size=encoder.dim)
    return info, [Embed(encoder), *ops]


def _exported(folder: Path, meta: dict, info: dict[str, Any], max_length: int | None) -> tuple[dict, list[Operation]]:
    """(description, operations) of an exported folder: its task, or /embed for an exported encoder."""
    from bert_kit.embeddings import SentenceEncoder
    from bert_kit.tasks.inference import load_task_model

    info.update(device="cpu", precision=meta["onnx"].get("precision", "fp32"), backend="onnx")
    if info["task"]:
        flags = argparse.Namespace(model=str(folder), task=None, max_length=max_length, device="cpu", precision="fp32",
                                   batch_size=BATCH, text_column="sentence", text_pair_column=None)
        task, model, prec = load_task_model(flags, verbose=False)
        op = {"classification": Classify, "token-classification": Tag, "qa": Answer, "similarity": Similarity}
        info.update(labels=task.label_names, max_length=task.s.max_length)
        if task.name == "similarity":
            info["similarity_mode"] = task.s.similarity_mode
        return info, [op[task.name](task, model, prec)]
    encoder = SentenceEncoder.from_pretrained(folder, normalize=False, max_length=max_length)
    info.update(max_length=encoder.max_length, pooling=encoder.pooling, hidden_size=encoder.dim)
    return info, [Embed(encoder)]


# backend name -> loader(folder, device, precision, max_length) -> (description, operations)
BACKENDS: dict[str, Callable[..., tuple[dict[str, Any], list[Operation]]]] = {"torch": load_torch}
