"""Rerankers at inference: a cross-encoder's score of (query, passage) pairs, and a first stage reranked.

    reranker = Reranker.from_pretrained("runs/reranker/best")          # a `bert-kit finetune --task reranker` folder
    reranker.score("what is bm25?", ["a ranking function", "a fish"])   # (2,) sigmoid scores
    reranked = rerank(first_stage, data, reranker, top_k=100)          # each query's top 100 by the reranker

Any folder of a `...ForSequenceClassification` with one output is a reranker (BERT, RoBERTa,
DistilBERT, ModernBERT; those of sentence-transformers' `CrossEncoder` too); its score is the
sigmoid of the logit, as `CrossEncoder.predict` returns it (`raw=True`: the logit). Pairs are
"[CLS] query [SEP] passage [SEP]", cut longest-first to `max_length`; they are scored in
length-sorted batches of a token budget (`embeddings.token_batches`), packed on the host, in bf16
on a GPU that has it. `rerank` rescores the top_k documents of each query of a `Ranking` and orders
them by the new scores (ties by document id, as trec_eval); the documents past top_k follow in the
first stage's order, as a two-stage search returns them (so Recall@100 after reranking the top 5
is the first stage's, not the Recall@5 of a list cut short).
This is the reranker of `bert-kit evaluate --task retrieval --rerank`, of `bert-kit mine-negatives
--rescore` (sentence-transformers' `mine_hard_negatives(cross_encoder=...)`), and of `/rerank` in
`bert-kit serve`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from bert_kit.embeddings import default_token_budget, inference_dtype, token_batches
from bert_kit.input_checks import unchecked_inputs
from bert_kit.kernels import fast_path
from bert_kit.kernels.packing import Packed
from bert_kit.retrieval.beir import BeirData
from bert_kit.retrieval.evaluator import Ranking
from bert_kit.retrieval.metrics import ranked


class Reranker:
    """A cross-encoder with one output: model (a `...ForSequenceClassification`, num_labels=1) and
    its tokenizer; max_length: tokens per pair; precision: "auto" (bf16 autocast on a GPU that has
    it), "fp32", "bf16" or "fp16"; max_tokens_per_batch: padded tokens a batch (default: for the device)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, max_length: int = 512,
                 device: str | torch.device | None = None, precision: str = "auto",
                 max_tokens_per_batch: int | None = None):
        from bert_kit.checks import resolve_device

        if getattr(model, "num_labels", None) != 1:
            raise ValueError(f"a reranker gives one score per pair: its head has {getattr(model, 'num_labels', '?')} "
                             "outputs (fine-tune one with bert-kit finetune --task reranker)")
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.packed = isinstance(model, torch.nn.Module)  # (an exported graph takes padded batches)
        if self.packed:
            fast_path.apply(self.model, self.device, training=False)
        self.tokenizer, self.max_length = tokenizer, min(max_length, model.config.max_length)
        self.dtype = inference_dtype(precision, self.device)
        config = model.config
        self.max_tokens_per_batch = max_tokens_per_batch or default_token_budget(
            self.device, config.hidden_size, config.intermediate_size)

    @classmethod
    def from_pretrained(cls, folder: str | Path, max_length: int | None = None,
                        device: str | torch.device | None = None, precision: str = "auto",
                        max_tokens_per_batch: int | None = None) -> "Reranker":
        """A reranker folder (or a hub name's local copy); max_length: default its fine-tuning length, else 512."""
        from bert_kit.families import load_model
        from bert_kit.model_folder import resolve_model
        from bert_kit.tokenizer import get_tokenizer

        found = resolve_model(folder)
        meta = check_reranker_folder(found)
        model = load_model("ForSequenceClassification", found, strict=True)
        length = max_length or meta.get("max_length") or 512
        return cls(model, get_tokenizer(found), int(length), device, precision, max_tokens_per_batch)

    @property
    def precision(self) -> str:
        return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]

    def encode_pairs(self, queries: Sequence[str], passages: Sequence[str]) -> tuple[list, list]:
        """(token ids, token type ids) of each pair, cut longest-first to max_length."""
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries but {len(passages)} passages")
        if not queries:
            return [], []
        enc = self.tokenizer(list(queries), list(passages), max_length=self.max_length, padding=False,
                             truncation=True, return_tensors=None)
        return enc["input_ids"], enc["token_type_ids"]

    def logits_of_ids(self, rows: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """The logit of each tokenized pair (ids and token types), in input order."""
        order = np.argsort([-len(r) for r in rows], kind="stable")
        out = torch.empty(len(rows), dtype=torch.float32, device=self.device)
        pad = self.tokenizer.pad_token_id
        with torch.inference_mode(), unchecked_inputs(), torch.autocast(self.device.type, self.dtype,
                                                                         enabled=self.dtype != torch.float32):
            for batch in token_batches([len(rows[i]) for i in order], self.max_tokens_per_batch):
                picked = order[batch]
                T = len(rows[picked[0]])
                ids = torch.full((len(picked), T), pad, dtype=torch.long)
                types = torch.zeros((len(picked), T), dtype=torch.long)
                mask = torch.zeros((len(picked), T), dtype=torch.long)
                for j, i in enumerate(picked):
                    n = len(rows[i])
                    ids[j, :n], types[j, :n], mask[j, :n] = torch.tensor(rows[i]), torch.tensor(type_ids[i]), 1
                layout = Packed.from_mask(mask).to(self.device, non_blocking=True) if self.packed else False
                logits = self.model(ids.to(self.device), mask.to(self.device), types.to(self.device), unpadded=layout)
                out[torch.as_tensor(picked, device=self.device)] = logits[:, 0].float()
        values = out.cpu().numpy()
        if not np.isfinite(values).all():
            raise FloatingPointError("the reranker's scores are NaN or inf: its weights (or the precision) are broken")
        return values

    def score_pairs(self, queries: Sequence[str], passages: Sequence[str], raw: bool = False) -> np.ndarray:
        """(n,) scores of the pairs (queries[i], passages[i]): sigmoid of the logits (raw: the logits)."""
        if not queries:
            return np.zeros(0, dtype=np.float32)
        logits = self.logits_of_ids(*self.encode_pairs(queries, passages))
        return logits if raw else (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)

    def score(self, query: str, passages: Sequence[str], raw: bool = False) -> np.ndarray:
        """(n,) scores of `passages` for one query (the rescoring seam of `mine_hard_negatives`)."""
        return self.score_pairs([query] * len(passages), passages, raw)

    def rank(self, query: str, passages: Sequence[str], top_n: int | None = None) -> list[tuple[int, float]]:
        """(index, score) of the passages, best first (ties by index), the first top_n of them."""
        scores = self.score(query, passages)
        order = sorted(range(len(passages)), key=lambda i: (-scores[i], i))
        return [(i, float(scores[i])) for i in order[:top_n]]


def check_reranker_folder(folder: str | Path) -> dict[str, Any]:
    """The metadata of a reranker folder (`read_model_metadata`), read without loading the model; a
    ValueError naming the folder when its config.json holds another head than one classifier output
    (an embedding model, a classifier), so a command refuses it before its first stage runs."""
    from bert_kit.model_folder import read_model_metadata

    meta = read_model_metadata(folder)
    held, outputs = meta["architectures"], len(meta.get("label_names") or [None])
    if held and not any(h.endswith("ForSequenceClassification") for h in held):
        what = f"a {held[0]}"
    elif outputs != 1:
        what = f"a classifier with {outputs} outputs"
    else:
        return meta
    raise ValueError(f"{folder} holds {what}, not a reranker (a cross-encoder with one output): fine-tune one with "
                     "bert-kit finetune --task reranker")


def rerank(ranking: Ranking, data: BeirData, reranker: Reranker, top_k: int = 100, query_prefix: str = "",
           progress: Callable[[int], None] | None = None) -> Ranking:
    """`ranking` with the top_k documents of each query rescored by `reranker` and reordered (ties
    by document id, highest first, as trec_eval), then the documents past top_k in their first-stage
    order, scored below the reranked ones (one less for each place). All pairs are scored together
    (length-sorted batches); progress(n) counts the queries done."""
    texts = dict(zip(data.corpus_ids, data.corpus_texts))
    queries, passages, spans = [], [], []
    for q, docs in zip(ranking.query_ids, ranking.doc_ids):
        kept = docs[:top_k]
        spans.append(kept)
        queries += [query_prefix + data.queries[q]] * len(kept)
        passages += [texts[d] for d in kept]
    scores = reranker.score_pairs(queries, passages, raw=True)  # the logits: no ties from a saturated sigmoid
    doc_ids, kept_scores, at = [], [], 0
    for docs, everything in zip(spans, ranking.doc_ids):
        found = dict(zip(docs, scores[at: at + len(docs)].tolist()))
        at += len(docs)
        order = ranked(list(found), list(found.values()))
        head = [found[d] for d in order]
        tail = list(everything[len(docs):])
        floor = min(head, default=0.0)
        doc_ids.append(order + tail)
        kept_scores.append(head + [floor - i for i in range(1, len(tail) + 1)])
        if progress is not None:
            progress(1)
    return Ranking(list(ranking.query_ids), doc_ids, kept_scores)
