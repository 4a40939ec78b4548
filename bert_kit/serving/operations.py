"""What the server computes: one `Operation` per endpoint, built around a loaded model folder.

| endpoint         | served for           | one input                       | one output                           |
| ---------------- | -------------------- | ------------------------------- | ------------------------------------ |
| POST /embed      | every folder         | text                            | vector (pooled, unit length)         |
| POST /classify   | classification       | text, or [text, text_pair]      | label, label_id, probabilities       |
|                  |                      |                                 | (score for a regression head; labels |
|                  |                      |                                 | and label_ids for several per text)  |
| POST /tag        | token-classification | text (split on spaces) or words | words, tags, entities                |
| POST /answer     | qa                   | {question, context}             | answer (a span of the context)       |
| POST /similarity | similarity           | [sentence1, sentence2]          | score (cosine, or the cross-encoder) |
| POST /fill-mask  | an MLM head          | text with [MASK]                | top-k tokens per mask                |
| POST /rerank     | reranker             | {query, documents, top_n}       | index, relevance_score (best first)  |

An operation splits a request into three steps, so the batcher can mix requests: `prepare`
tokenizes one request's inputs on the server's preparing thread (one `Item` per input, its token
count the batch cost), `run` computes one batch of items from many requests on the batching
thread, and `respond` shapes one request's outputs as JSON. Every model call is guarded: an
output with NaN or inf raises `NonFiniteOutput` (a 500 that says so), since labels, tags and
spans read from NaN logits would pass for answers. The model work in `run` is the existing task
code (`Task.logits`, `Task.tag`, `Task.answers`, `Task.scores`, `SentenceEncoder.encode_ids`,
`fill_masks`), so the server answers exactly what `predict`, `embed` and `fill-mask` answer.

Backends: `load_torch` builds these around torch modules, or around an exported folder's ONNX Runtime
session (the same call and outputs, `bert_kit.onnx_runtime.OnnxModel`; /embed of an exported head
pools the encoder states its graph also outputs). Tokens per input default to the folder's own
length (`model_folder.default_max_length`) and may not exceed its positions. Everything above the
model call (HTTP, limits, batching, metrics) only sees `Operation`s, so another runtime plugs in
as one more loader in `BACKENDS` that returns the same operations around its own callable (the
task code calls `model(input_ids, attention_mask, token_type_ids, unpadded=...)`, the encoder
calls `SentenceEncoder.forward`).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from bert_kit.serving.batcher import Item
from bert_kit.serving.schema import InputError
from bert_kit.tasks.fill_mask import MAX_MASKS, fill_masks, vocab_size

TEXT = {"type": "string"}
PAIR = {"type": "array", "minItems": 2, "maxItems": 2, "items": TEXT}
NUMBER, INTEGER = {"type": "number"}, {"type": "integer"}
BATCH = 1 << 30  # the task code's own batch size: a dynamic batch is always one forward pass


class NonFiniteOutput(RuntimeError):
    """The model computed NaN or inf: its weights (or its precision) are broken, not the request."""


def guard_finite(*models: Any) -> None:
    """Make every call of each model raise NonFiniteOutput when a float output holds NaN or inf."""
    def check(outputs: Any) -> None:
        for out in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
            if torch.is_tensor(out) and out.is_floating_point() and not bool(torch.isfinite(out).all()):
                raise NonFiniteOutput("the model produced non-finite values (NaN or inf) in its output")

    for model in {id(m): m for m in models if m is not None}.values():
        if isinstance(model, torch.nn.Module):
            model.register_forward_hook(lambda module, args, out: check(out))
        else:  # an exported graph (OnnxModel): every output comes through its run()
            run = model.run

            def checked(*args: Any, run: Callable = run, **kwargs: Any) -> list:
                outs = run(*args, **kwargs)
                check([torch.from_numpy(o) for o in outs])
                return outs

            model.run = checked


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
    limits: dict[str, int] = {}  # the operation's own limits (413 past them), shown in /info and the OpenAPI

    inputs_field = "inputs"  # the request's list of inputs

    def request_schema(self) -> dict:
        inputs = {"type": "array", "minItems": 1, "items": self.input_schema}
        return {"type": "object", "required": [self.inputs_field], "additionalProperties": False,
                "properties": {self.inputs_field: inputs, **self.options}}

    def example_body(self) -> dict:
        """A request with one input (the OpenAPI example)."""
        return {self.inputs_field: [self.example]}

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

    def prepare_many(self, requests: list[tuple[list, dict]]) -> list:
        """`prepare` of several requests' (inputs, options): one item list, or the exception its
        request gets (an InputError naming its field), per request."""
        out: list = []
        for inputs, options in requests:
            try:
                out.append(self.prepare(inputs, options))
            except Exception as e:
                out.append(e)
        return out

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

    def prepare_many(self, requests: list[tuple[list, dict]]) -> list:
        """The texts of all `requests` in one tokenizer call (its fixed cost, ~100 us, paid once)."""
        try:
            rows = self.encoder.tokenize([text for inputs, _ in requests for text in inputs])
        except Exception:  # let each request meet its own error
            return super().prepare_many(requests)
        out, at = [], 0
        for inputs, _ in requests:
            out.append([Item(len(ids), ids) for ids in rows[at: at + len(inputs)]])
            at += len(inputs)
        return out

    def run(self, items: list[Item]) -> list:
        return list(self.encoder.encode_ids([it.data for it in items]).float().cpu().numpy())  # B x (H,) float32

    def respond(self, outputs: list, options: dict) -> np.ndarray:
        """(n, H) float32: the JSON writer (`jsonio`) takes the array as it is, with the model's values."""
        vectors = np.stack(outputs)
        if options["normalize"]:  # as F.normalize in SentenceEncoder(normalize=True)
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.float32(1e-12))
        return vectors


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
        "labels": {"type": "array", "items": TEXT, "description": "several labels per text: those predicted"},
        "label_ids": {"type": "array", "items": INTEGER, "description": "several labels per text"},
        "probabilities": {"type": "object", "additionalProperties": NUMBER,
                          "description": "by label name (softmax; sigmoid per label for several labels per text)"},
        "windows": {**INTEGER, "description": "a model fine-tuned with long_text chunks: the windows the text took"}}}

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        """One item per input: its tokens, or (long_text: chunks) the list of its windows' tokens."""
        from bert_kit.tasks.inference import text_dataset

        items = []
        for x in inputs:
            text, pair = (x, None) if isinstance(x, str) else x
            ds = text_dataset(self.task, [text], None if pair is None else [pair])
            windows = [ds[i] for i in range(len(ds))]
            cost = sum(len(w["input_ids"]) for w in windows)
            items.append(Item(cost, windows if self.task.chunks else windows[0]))
        return items

    def run(self, items: list[Item]) -> list:
        from bert_kit.tasks.inference import label_record

        if not self.task.chunks:
            logits = self.task.logits(self.model, [it.data for it in items], self.precision)  # (B, C)
            return [label_record(self.task, row) for row in logits]
        windows = [{**w, "document": i} for i, it in enumerate(items) for w in it.data]  # every input's windows
        logits, _ = self.task.pool(self.task.logits(self.model, windows, self.precision), windows)  # (B, C)
        return [{**label_record(self.task, row), "windows": len(it.data)} for row, it in zip(logits, items)]


class Tag(_TaskOperation):
    path, summary = "/tag", "Token classification: one tag per word, and the entities they spell."
    input_schema = {"oneOf": [TEXT, {"type": "array", "minItems": 1, "items": TEXT}]}
    example = "John Smith lives in New York ."
    output_schema = {"type": "object", "properties": {
        "words": {"type": "array", "items": TEXT}, "tags": {"type": "array", "items": TEXT},
        "entities": {"type": "array", "items": {"type": "object", "properties": {
            "type": TEXT, "start": INTEGER, "end": {**INTEGER, "description": "word index, exclusive"},
            "text": TEXT}}}}}

    def strings(self, value: Any) -> list[str]:
        # a list of words is one sentence: its characters count together, as those of the same text would
        return [value] if isinstance(value, str) else [" ".join(w for w in value if isinstance(w, str))]

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
        dataset = self.task._dataset([(words, None) for words in sentences])  # a long sentence is several windows
        return [Item(sum(len(dataset[k]["input_ids"]) for k in dataset.windows_of[i]), words)
                for i, words in enumerate(sentences)]

    def run(self, items: list[Item]) -> list:
        from bert_kit.tasks.inference import tagged_record

        sentences = [it.data for it in items]
        tags = self.task.tag_words(self.model, sentences, self.precision)  # every word, however long the sentence
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
        features = prepare_eval_features(examples, self.tokenizer, s.max_length, s.qa.doc_stride, s.qa.max_query_length)
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


class Rerank(_TaskOperation):
    """Documents ranked by relevance to a query, as TEI's and infinity-emb's /rerank answer (their
    `index` and infinity's `relevance_score`): each (query, document) pair is one item of the
    batcher, so the documents of concurrent requests share batches."""

    path, summary = "/rerank", "Rerank documents for a query: a relevance score for each, best first."
    inputs_field, output_key = "documents", "results"
    example = "Paris is the capital and largest city of France."
    example_query = "What is the capital of France?"
    options = {"query": {"type": "string", "description": "the query the documents are scored for"},
               "top_n": {"type": "integer", "minimum": 1, "description": "answer the best n (default: all)"},
               "return_documents": {"type": "boolean", "default": False, "description": "each result with its text"},
               "raw_scores": {"type": "boolean", "default": False,
                              "description": "the logits, not their sigmoid in [0, 1]"}}
    output_schema = {"type": "object", "properties": {
        "index": {**INTEGER, "description": "the document's position in the request"},
        "relevance_score": NUMBER, "document": {**TEXT, "description": "with return_documents only"}}}

    def __init__(self, task: Any, model: Any, precision: Any):
        from bert_kit.retrieval.rerank import Reranker

        super().__init__(task, model, precision)
        self.reranker = Reranker(model, self.tokenizer, self.max_length, precision.device, precision.name)

    def request_schema(self) -> dict:
        schema = super().request_schema()
        schema["required"] = ["query", self.inputs_field]
        return schema

    def example_body(self) -> dict:
        return {"query": self.example_query, "documents": [self.example], "top_n": 1}

    def with_defaults(self, body: dict) -> dict:
        return {"query": body.get("query", self.example_query), "top_n": body.get("top_n"),
                "raw_scores": body.get("raw_scores", False),
                "documents": body.get(self.inputs_field) if body.get("return_documents") else None}

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        ids, types = self.reranker.encode_pairs([options["query"]] * len(inputs), inputs)
        return [Item(len(row), (row, kinds)) for row, kinds in zip(ids, types)]

    def run(self, items: list[Item]) -> list:
        logits = self.reranker.logits_of_ids([it.data[0] for it in items], [it.data[1] for it in items])
        return [float(x) for x in logits]

    def respond(self, outputs: list, options: dict) -> list:
        scores = outputs if options["raw_scores"] else [1 / (1 + np.exp(-x)) for x in outputs]
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[: options["top_n"]]
        documents = options["documents"]
        return [{"index": i, "relevance_score": float(scores[i]), **({"document": documents[i]} if documents else {})}
                for i in order]


class FillMask(Operation):
    path, summary = "/fill-mask", "Top-k tokens for every [MASK] in each text (models with an MLM head)."
    options = {"top_k": {"type": "integer", "minimum": 1, "maximum": 100, "default": 5,
                         "description": "predictions per mask"}}
    # each prediction carries its whole filled-in text: masks x top_k bounds the work and the answer
    limits = {"max_masks_per_input": MAX_MASKS, "max_masks_per_request": 64}
    output_schema = {"type": "array", "description": "one list per [MASK], in order", "items": {
        "type": "array", "items": {"type": "object", "properties": {
            "token": TEXT, "token_id": INTEGER, "score": NUMBER, "sequence": TEXT}}}}

    def __init__(self, model: Any, tokenizer: Any, max_length: int):
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.example = f"paris is the {tokenizer.convert_ids_to_tokens(tokenizer.mask_token_id)} of france."
        top_k = dict(self.options["top_k"])  # no more predictions than the vocabulary has words
        top_k["maximum"] = min(top_k["maximum"], vocab_size(model, tokenizer))
        top_k["default"] = min(top_k["default"], top_k["maximum"])
        self.options = {**self.options, "top_k": top_k}

    def prepare(self, inputs: list, options: dict) -> list[Item]:
        rows = self.tokenizer(inputs, max_length=self.max_length, padding=False, return_tensors=None)["input_ids"]
        mask = self.tokenizer.mask_token_id
        token = self.tokenizer.convert_ids_to_tokens(mask)
        per_input, per_request = self.limits["max_masks_per_input"], self.limits["max_masks_per_request"]
        for i, ids in enumerate(rows):
            if mask not in ids:
                raise InputError(f"inputs[{i}]", f"has no {token} token (within the first {self.max_length} tokens)")
            if ids.count(mask) > per_input:
                raise InputError(f"inputs[{i}]", f"has {ids.count(mask)} {token} tokens; at most {per_input}", 413)
            if ids.count(mask) < inputs[i].count(token):  # predictions for fewer masks than were sent
                raise InputError(f"inputs[{i}]", f"has {inputs[i].count(token) - ids.count(mask)} {token} token(s) "
                                 f"past its first {self.max_length} tokens, where the text is cut")
        total = sum(ids.count(mask) for ids in rows)
        if total > per_request:
            raise InputError("inputs", f"hold {total} {token} tokens; at most {per_request} per request", 413)
        return [Item(len(ids), (ids, options["top_k"])) for ids in rows]

    def run(self, items: list[Item]) -> list:
        k = max(top_k for _, top_k in (it.data for it in items))
        results = fill_masks(self.model, self.tokenizer, [ids for ids, _ in (it.data for it in items)], k)
        return [[row[:top_k] for row in masks] for masks, (_, top_k) in zip(results, (it.data for it in items))]


# ---- loading a folder -------------------------------------------------------------------------

def _has_mlm_head(folder: Path) -> bool:
    """Whether the weights hold an MLM head (cls.predictions.*), without loading them from safetensors."""
    from bert_kit.weight_files import weight_names

    from bert_kit.config import load_hf_config
    from bert_kit.hf_names import holds_mlm_head

    return holds_mlm_head(list(weight_names(folder)), load_hf_config(folder).model_type)


def serve_length(folder: Path, max_length: int | None) -> int:
    """Tokens per input: `max_length`, else the folder's own (`default_max_length`: its fine-tuning
    length, its sentence-transformers length, else its positions); a ConfigError past its positions."""
    from bert_kit.checks import Range
    from bert_kit.config import load_hf_config
    from bert_kit.model_folder import default_max_length

    positions = load_hf_config(folder).max_length
    length = max_length or default_max_length(folder)
    Range(3, positions, integer=True, hint=f"the model in {folder} has {positions} positions").check("max_length",
                                                                                                    length)
    return length


TASK_OPERATIONS: dict[str, type[_TaskOperation]] = {"classification": Classify, "token-classification": Tag,
                                                   "qa": Answer, "similarity": Similarity, "reranker": Rerank}


def load_torch(folder: str | Path, device: str | None = None, precision: str = "auto",
               max_length: int | None = None) -> tuple[dict[str, Any], list[Operation]]:
    """(description, operations) of a model folder, run by PyTorch.

    A folder written by `bert-kit finetune` serves its task (and /embed from its encoder; an embedding
    model /embed alone); any other BERT folder serves /embed, and /fill-mask when it holds MLM head weights."""
    from bert_kit.embeddings import SentenceEncoder
    from bert_kit.families import encoder_of, load_model
    from bert_kit.model_folder import read_model_metadata, resolve_model, sentence_transformers_settings
    from bert_kit.tasks.inference import load_task_model
    from bert_kit.tokenizer import get_tokenizer
    from bert_kit.training.precision import resolve_precision

    found = resolve_model(folder)  # a folder, a run folder, or a hub name's local copy
    meta, st = read_model_metadata(found), sentence_transformers_settings(found)
    info: dict[str, Any] = {"model": str(found), "task": meta.get("task")}
    length = serve_length(found, max_length)
    if meta.get("onnx"):  # written by `bert-kit export`: ONNX Runtime on the CPU
        return _exported(found, meta, info, length)
    ops: list[Operation] = []
    if info["task"] in TASK_OPERATIONS:
        flags = argparse.Namespace(model=str(found), task=None, max_length=length, device=device,
                                   precision=precision, batch_size=BATCH, text_column="sentence",
                                   text_pair_column=None)
        task, model, prec = load_task_model(flags, verbose=False)
        encoder_model = encoder_of(model)  # /embed shares the weights
        pooling = task.s.similarity.pooling
        ops.append(TASK_OPERATIONS[task.name](task, model, prec))
        info.update(labels=task.label_names, device=str(prec.device), precision=str(prec.dtype).removeprefix("torch."))
        if task.name == "similarity":
            info["similarity_mode"] = task.s.similarity.mode
        tokenizer = task.tokenizer
        guard_finite(model, encoder_model)
    else:
        prec = resolve_precision(precision, device or "auto", verbose=False)
        pooling = meta.get("pooling") or st.get("pooling") or "mean"
        tokenizer = get_tokenizer(found)
        if _has_mlm_head(found):
            from bert_kit.tasks.fill_mask import load_mlm_model

            mlm = load_mlm_model(found, prec.device)
            ops.append(FillMask(mlm, tokenizer, length))
            encoder_model = mlm.bert
            guard_finite(mlm)
        else:
            encoder_model = load_model("Model", found)
        guard_finite(encoder_model)
        info.update(device=str(prec.device), precision="float32")
    encoder = SentenceEncoder(encoder_model, tokenizer, pooling, normalize=False, max_length=length,
                              device=prec.device, precision="fp32")
    info.update(max_length=length, pooling=pooling, hidden_size=encoder.dim)
    return info, [Embed(encoder), *ops]


def _exported(folder: Path, meta: dict, info: dict[str, Any], length: int) -> tuple[dict, list[Operation]]:
    """(description, operations) of an exported folder: its task and /embed, as a PyTorch folder.
    /embed pools the graph's encoder states; a head graph exported without them serves its task only."""
    from bert_kit.embeddings import SentenceEncoder
    from bert_kit.onnx_runtime import OnnxModel
    from bert_kit.tasks.inference import load_task_model
    from bert_kit.tokenizer import get_tokenizer

    info.update(device="cpu", precision=meta["onnx"].get("precision", "fp32"), backend="onnx", max_length=length)
    pooling = meta.get("pooling") or "mean"
    ops: list[Operation] = []
    if info["task"] in TASK_OPERATIONS:
        flags = argparse.Namespace(model=str(folder), task=None, max_length=length, device="cpu", precision="fp32",
                                   batch_size=BATCH, text_column="sentence", text_pair_column=None)
        task, model, prec = load_task_model(flags, verbose=False)
        guard_finite(model)
        ops.append(TASK_OPERATIONS[task.name](task, model, prec))
        info.update(labels=task.label_names)
        if task.name == "similarity":
            info["similarity_mode"] = task.s.similarity.mode
            pooling = task.s.similarity.pooling
        encoder_model, tokenizer = model, task.tokenizer
    else:
        encoder_model, tokenizer = OnnxModel(folder), get_tokenizer(folder)
        guard_finite(encoder_model)
    if isinstance(encoder_model, OnnxModel) and encoder_model.has_encoder_states:
        encoder = SentenceEncoder(encoder_model.encoder(), tokenizer, pooling, normalize=False, max_length=length,
                                  device="cpu", unpadded=False)
        info.update(pooling=pooling, hidden_size=encoder.dim)
        ops.insert(0, Embed(encoder))
    if not ops:
        raise ValueError(f"{folder} holds an exported {encoder_model.architecture} graph that records no task and "
                         "does not output the encoder's states: nothing to serve (export a fine-tuned folder or "
                         "an encoder)")
    return info, ops


# backend name -> loader(folder, device, precision, max_length) -> (description, operations)
BACKENDS: dict[str, Callable[..., tuple[dict[str, Any], list[Operation]]]] = {"torch": load_torch}
