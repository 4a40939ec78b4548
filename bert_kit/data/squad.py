"""Extractive question answering (SQuAD v1.1) data: reader, sliding-window features, decoding.

A context longer than the model's window is cut into overlapping windows, each fed as
``[CLS] question [SEP] context-window [SEP]``. Consecutive windows share ``doc_stride`` context
tokens (the HF tokenizers meaning of stride), so every answer lies whole inside at least one
window. Training targets are the answer's first / last token in the window, or 0 ([CLS]) when
the window does not hold the whole answer. At evaluation every window proposes spans and
:func:`postprocess_predictions` keeps the best one over all windows of the question, the
logic of HF's run_qa post-processing for SQuAD v1.1.

Question and context are tokenized separately (each context once, however many questions it
has) and the windows are assembled here; for BERT this gives exactly the ids, offsets and
windows of a pair encoding with ``truncation="only_second"`` and overflowing tokens.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from torch.utils.data import DataLoader

from bert_kit.data import read_text, setting
from bert_kit.data.classification import pad_collate


def read_squad(path: str | Path, skip_bad_answers: bool = False, encoding: str | None = None,
               what: str = "SQuAD file") -> list[dict[str, Any]]:
    """Flatten a SQuAD JSON file into one example per question, every field checked.

    Each example: {"id", "title", "context", "question", "answers": [{"text",
    "answer_start"}]}. Errors (ValueError / KeyError) name the file and the place, e.g.
    ``data[3].paragraphs[0].qas[2] has no key 'id'``: malformed JSON, a missing key, a field of
    the wrong type, a duplicate question id. Every answer is checked against its context: an
    integer ``answer_start`` inside it, and a non-empty ``text`` equal to the context there. A bad
    answer is an error naming its question id, or with ``skip_bad_answers`` it is left out and
    counted (one line on stderr); a question left without answers is then dropped, since it
    would train as "no answer". ``encoding``: the file's codec (default UTF-8); ``what``: how errors
    name the file.
    """
    path = Path(path)
    try:
        root = json.loads(read_text(path, what, encoding, max_line=None))  # one JSON document: often one line
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid JSON at column {e.colno} ({e.msg})") from None

    def get(obj: Any, key: str, where: str, kind: type | tuple[type, ...]) -> Any:
        if not isinstance(obj, dict):
            raise ValueError(f"{path}: {where} should be a JSON object, got {_json_type(obj)}")
        if key not in obj:
            raise KeyError(f"{path}: {where} has no key {key!r} (keys: {sorted(obj)})")
        value = obj[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            names = " or ".join(_json_type(k()) for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise ValueError(f"{path}: {where}.{key} should be {names}, got {_json_type(value)} {value!r:.40}")
        return value

    examples, seen, skipped, dropped = [], {}, 0, 0
    for a, article in enumerate(get(root, "data", "top level", list)):
        title = article.get("title", "") if isinstance(article, dict) else ""
        for p, paragraph in enumerate(get(article, "paragraphs", f"data[{a}]", list)):
            where_p = f"data[{a}].paragraphs[{p}]"
            context = get(paragraph, "context", where_p, str)
            for q, qa in enumerate(get(paragraph, "qas", where_p, list)):
                where_q = f"{where_p}.qas[{q}]"
                qid = str(get(qa, "id", where_q, (str, int)))
                if qid in seen:
                    raise ValueError(f"{path}: question id {qid!r} appears twice ({seen[qid]} and {where_q}); "
                                     "ids must be unique")
                seen[qid] = where_q
                question = get(qa, "question", where_q, str)
                answers = []
                for n, ans in enumerate(get(qa, "answers", where_q, list)):
                    where_a = f"{where_q}.answers[{n}]"
                    answer = _checked_answer(ans, context, get, where_a)
                    if isinstance(answer, str):  # what is wrong with it
                        if not skip_bad_answers:
                            raise ValueError(f"{path}: question {qid!r} ({where_a}): {answer}; fix the answer "
                                             f"or set {setting('skip_bad_answers', True)} to leave such answers out")
                        skipped += 1
                        continue
                    answers.append(answer)
                if not answers and qa["answers"]:
                    dropped += 1  # every answer was bad: keeping it would train "no answer"
                    continue
                examples.append({"id": qid, "title": title, "context": context, "question": question,
                                 "answers": answers})
    if skipped:
        print(f"{path}: skipped {skipped} answer(s) that do not match their context; dropped {dropped} "
              "question(s) left without an answer", file=sys.stderr)
    return examples


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
            bool: "a boolean", type(None): "null"}.get(type(value), type(value).__name__)


def _checked_answer(ans: Any, context: str, get: Any, where: str) -> dict[str, Any] | str:
    """{"text", "answer_start"} of a good answer, or a sentence saying what is wrong with it.
    Fields of the wrong type raise at once: that is a malformed file, not a bad answer."""
    text = get(ans, "text", where, str)
    start = get(ans, "answer_start", where, (int, float))
    if isinstance(start, float):
        if not start.is_integer():
            return f"answer_start {start} is not a whole character offset"
        start = int(start)
    if not text.strip():
        return "the answer text is empty"
    if not 0 <= start < len(context):
        return f"answer_start {start} is outside the context ({len(context)} characters)"
    found = context[start: start + len(text)]
    if found != text:
        return f"answer {text[:40]!r} does not match the context at answer_start {start} ({found[:40]!r})"
    return {"text": text, "answer_start": start}


def split_by_article(examples: Sequence[dict], n_train_articles: int
                     ) -> tuple[list[dict], list[dict]]:
    """Split examples into (train, eval) by article title, in file order.

    The first ``n_train_articles`` articles go to train and the rest to eval, so no
    paragraph is shared between the two (the train file of SQuAD is not always at hand).
    """
    titles: list[str] = []
    for ex in examples:
        if not titles or titles[-1] != ex["title"]:
            if ex["title"] in titles:
                raise ValueError(f"article {ex['title']!r} is not contiguous in the examples")
            titles.append(ex["title"])
    if not 0 < n_train_articles < len(titles):
        raise ValueError(f"n_train_articles must be in [1, {len(titles) - 1}] for "
                         f"{len(titles)} articles, got {n_train_articles}")
    train_titles = set(titles[:n_train_articles])
    train = [ex for ex in examples if ex["title"] in train_titles]
    held_out = [ex for ex in examples if ex["title"] not in train_titles]
    return train, held_out


def _strip_specials(ids: list[int], tokenizer, what: str) -> slice:
    """The slice of a single-sequence encoding inside its [CLS] ... [SEP]."""
    if len(ids) < 2 or ids[0] != tokenizer.cls_token_id or ids[-1] != tokenizer.sep_token_id:
        raise ValueError(f"{what}: expected the tokenizer to wrap a sequence in [CLS] ... [SEP]")
    return slice(1, len(ids) - 1)


def _windows(examples: Sequence[dict], tokenizer, max_length: int, doc_stride: int,
             max_query_length: int):
    """Yield (example index, input_ids, context offset in the feature, context token offsets).

    The context offsets are (start_char, end_char) of the window's context tokens.
    """
    questions = [ex["question"].lstrip() for ex in examples]  # leading spaces waste tokens
    contexts = list(dict.fromkeys(ex["context"] for ex in examples))  # each context once
    q_enc = tokenizer(questions, padding=False, truncation=False, return_tensors=None)
    c_enc = tokenizer(contexts, padding=False, truncation=False, return_offsets_mapping=True,
                      return_tensors=None)
    context_index = {c: i for i, c in enumerate(contexts)}
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    for e, ex in enumerate(examples):
        q_ids = q_enc["input_ids"][e]
        q_ids = q_ids[_strip_specials(q_ids, tokenizer, f"question of {ex['id']}")][:max_query_length]
        c = context_index[ex["context"]]
        inner = _strip_specials(c_enc["input_ids"][c], tokenizer, f"context of {ex['id']}")
        c_ids = c_enc["input_ids"][c][inner]
        c_offsets = [tuple(o) for o in c_enc["offset_mapping"][c][inner]]
        budget = max_length - len(q_ids) - 3  # room for context tokens: [CLS] q [SEP] c [SEP]
        if budget <= doc_stride:
            raise ValueError(f"example {ex['id']}: max_length {max_length} leaves {budget} context "
                             f"tokens after a {len(q_ids)}-token question; need > doc_stride "
                             f"{doc_stride}")
        # windows start every (budget - stride) tokens until one reaches the end
        start = 0
        while True:
            stop = min(start + budget, len(c_ids))
            ids = [cls_id] + q_ids + [sep_id] + c_ids[start:stop] + [sep_id]
            yield e, ids, len(q_ids) + 2, c_offsets[start:stop]
            if stop >= len(c_ids):
                break
            start += budget - doc_stride


def _feature(ids: list[int], context_at: int, segments: bool = True) -> dict[str, list[int]]:
    """Model inputs of one window: segment 0 up to the first [SEP], segment 1 after it (all 0 for a
    family without segment ids: RoBERTa's one-row table, ModernBERT)."""
    types = [0] * context_at + [1] * (len(ids) - context_at) if segments else [0] * len(ids)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": [1] * len(ids)}


def prepare_train_features(examples: Sequence[dict], tokenizer, max_length: int = 384,
                           doc_stride: int = 128, max_query_length: int = 64) -> list[dict]:
    """Training windows with answer positions; one dict per window.

    Keys: input_ids, token_type_ids, attention_mask (length <= max_length), start_positions
    and end_positions (token indices of the first answer's first / last token, both 0 = [CLS]
    when the window does not contain the whole answer). Questions are cut to
    ``max_query_length`` tokens.
    """
    features = []
    for e, ids, ctx_at, offsets in _windows(examples, tokenizer, max_length, doc_stride,
                                            max_query_length):
        ex = examples[e]
        feat = _feature(ids, ctx_at, getattr(tokenizer, "token_types", True))
        start_pos = end_pos = 0
        if ex["answers"] and offsets:
            start_char = ex["answers"][0]["answer_start"]
            end_char = start_char + len(ex["answers"][0]["text"])
            if offsets[0][0] <= start_char and offsets[-1][1] >= end_char:
                # first token starting after start_char, minus one; last ending before end_char, plus one
                s = 0
                while s < len(offsets) and offsets[s][0] <= start_char:
                    s += 1
                t = len(offsets) - 1
                while t >= 0 and offsets[t][1] >= end_char:
                    t -= 1
                start_pos, end_pos = ctx_at + s - 1, ctx_at + t + 1
        feat["start_positions"], feat["end_positions"] = start_pos, end_pos
        features.append(feat)
    return features


def prepare_eval_features(examples: Sequence[dict], tokenizer, max_length: int = 384,
                          doc_stride: int = 128, max_query_length: int = 64) -> list[dict]:
    """Evaluation windows; one dict per window.

    Keys: input_ids, token_type_ids, attention_mask, example_id, and offset_mapping (one
    (start_char, end_char) per token for context tokens, None for question and special tokens,
    so decoding can never pick a span outside the context).
    """
    features = []
    for e, ids, ctx_at, offsets in _windows(examples, tokenizer, max_length, doc_stride,
                                            max_query_length):
        feat = _feature(ids, ctx_at, getattr(tokenizer, "token_types", True))
        feat["example_id"] = examples[e]["id"]
        feat["offset_mapping"] = [None] * ctx_at + list(offsets) + [None]
        features.append(feat)
    return features


def postprocess_predictions(examples: Sequence[dict], features: Sequence[dict], start_logits,
                            end_logits, n_best: int = 20, max_answer_length: int = 30
                            ) -> dict[str, str]:
    """Answer text per example id from window logits, as HF's run_qa post-processing.

    start_logits / end_logits: (N_features, T) arrays (rows may be padded past each feature's
    length) or lists of 1-D arrays. For every window the ``n_best`` top start and end tokens are
    paired; a pair is kept if both tokens are context tokens, start <= end and the span has at
    most ``max_answer_length`` tokens. The highest start + end score over all windows of an
    example wins; an example without any valid span gets "".
    """
    if hasattr(start_logits, "detach"):
        start_logits, end_logits = start_logits.detach().cpu().numpy(), end_logits.detach().cpu().numpy()
    if len(start_logits) != len(features) or len(end_logits) != len(features):
        raise ValueError(f"{len(features)} features but {len(start_logits)} start and "
                         f"{len(end_logits)} end logit rows")
    by_example: dict[str, list[int]] = {}
    for i, feat in enumerate(features):
        by_example.setdefault(feat["example_id"], []).append(i)

    predictions: dict[str, str] = {}
    for ex in examples:
        candidates = []
        for i in by_example.get(ex["id"], []):
            offsets = features[i]["offset_mapping"]
            s_logits, e_logits = np.asarray(start_logits[i]), np.asarray(end_logits[i])
            # top-n indices, highest first
            start_indexes = np.argsort(s_logits)[-1: -n_best - 1: -1].tolist()
            end_indexes = np.argsort(e_logits)[-1: -n_best - 1: -1].tolist()
            for s in start_indexes:
                if s >= len(offsets) or offsets[s] is None:
                    continue
                for t in end_indexes:
                    if t >= len(offsets) or offsets[t] is None:
                        continue
                    if t < s or t - s + 1 > max_answer_length:
                        continue
                    candidates.append((float(s_logits[s] + e_logits[t]),
                                       offsets[s][0], offsets[t][1]))
        if not candidates:
            predictions[ex["id"]] = ""
            continue
        # stable sort: ties keep the window / index order, as in run_qa
        _, char_start, char_end = sorted(candidates, key=lambda c: c[0], reverse=True)[0]
        predictions[ex["id"]] = ex["context"][char_start:char_end]
    return predictions


def create_squad_dataloader(features: Sequence[dict], batch_size: int = 32, shuffle: bool = True,
                            pad_token_id: int = 0) -> DataLoader:
    """DataLoader over SQuAD features, padded per batch to the longest window.

    Batches hold input_ids, token_type_ids, attention_mask (B, T) and, for training
    features, start_positions / end_positions (B,); example ids and offsets stay in
    ``features`` for :func:`postprocess_predictions`.
    """
    return DataLoader(list(features), batch_size=batch_size, shuffle=shuffle,
                      collate_fn=partial(pad_collate, pad_token_id=pad_token_id))
