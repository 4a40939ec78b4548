"""The fine-tuning tasks on the JAX engine: each task's loss and the outputs its evaluation
scores, as plain functions of the NNX model and a batch, the twins of the torch tasks' `loss` and
evaluation forward (`bert_kit/tasks/`). The engine trains with `loss` and hands `outputs` (one row
per example) to the torch task's `score`, so both engines report the same metrics by the same code.

    head = task_head(job.task)                     # from the job's `bert_kit.tasks` Task
    loss, parts = head.loss(model, batch, rngs)    # rngs: dropout (None in evaluation)
    rows = head.outputs(model, batch)              # (B, ...) float32

| task (settings)           | model                          | loss                          | outputs (per example) |
| ------------------------- | ------------------------------ | ----------------------------- | --------------------- |
| classification            | BERTForSequenceClassification  | cross-entropy, MSE for 1 label | logits (C,)          |
| ..., label sets or weights | BERTForSequenceClassification | BCE per label, weighted CE   | logits (C,)           |
| token-classification      | BERTForTokenClassification     | cross-entropy per tag          | logits (T, C)        |
| qa                        | BERTForQuestionAnswering       | mean of start and end CE       | (2, T): start, end   |
| similarity, cross-encoder | BERTForSequenceClassification  | MSE on the score               | (1,)                 |
| similarity, bi-encoder    | BERTModel                      | cosine MSE, or CoSENT          | (2, H): u, v pooled  |
| embedding                 | BERTModel (the `EmbeddingModel`'s encoder) | MNRL, or symmetric | (H,): one text pooled |
| ..., a learned scale      | `ScaledEncoder`: it and `logit_scale` | the same, scale learned | (H,)         |
| reranker                  | BERTForSequenceClassification  | BCE, ListNet or LambdaLoss     | (1,): a pair's logit |

A bi-encoder's batch holds two sentences per example, all first sentences then all second ones
(`SimilarityTask.collate`): `sides` = 2 tells the engine to pad each side's rows apart. An
embedding (contrastive) batch holds k texts per example, column after column
(`EmbeddingTask.collate`), and their text ids `keys`, which the engine lays out (B, k), padding
rows -1: in-batch negatives are the real rows only (`ContrastiveHead`). A reranker's training
batch holds its queries' (query, candidate) pairs; `RerankHead.layout` puts them in a grid of n
candidates a query, candidate after candidate, so the engine pads it as n sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from bert_kit.jax.model import HEAD_CLASSES
from bert_kit.jax.randomness import HostKeys, derive
from bert_kit.jax.train import IGNORE_INDEX, _mean_cross_entropy, task_loss
from bert_kit.jax.weights import from_torch
from bert_kit.training.contrastive import MAX_LEARNED_SCALE

Batch = Mapping[str, jax.Array]


def inputs_of(batch: Batch) -> tuple:
    return batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids")


def by_side(rows: jax.Array, sides: int) -> jax.Array:
    """(sides, B, ...) of a batch's (sides B, ...) rows: each host lays out its examples side after
    side (all first sentences, then all second ones), and the batch's rows are the hosts' in turn."""
    hosts = jax.process_count()
    per_host = rows.reshape(hosts, sides, -1, *rows.shape[1:])  # (hosts, sides, B / hosts, ...)
    return jnp.swapaxes(per_host, 0, 1).reshape(sides, -1, *rows.shape[1:])


@dataclass(frozen=True)
class TaskHead:
    """A task's loss and evaluation outputs; frozen: the engine's jitted programs close over it."""

    name: str
    sides: int = 1  # sentences per example, their rows one block after the other

    def loss(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> tuple[jax.Array, dict]:
        """(loss, {}) of a batch: classification, regression, token classification (`train.task_loss`)."""
        return task_loss(model, batch, rngs)

    def outputs(self, model: nnx.Module, batch: Batch) -> jax.Array:
        """The head's logits, float32, no dropout: (B, C) or (B, T, C)."""
        return model(*inputs_of(batch)).astype(jnp.float32)

    def trained(self, torch_model: Any) -> Any:
        """The part of the job's PyTorch model the engine trains (its twin is built from it)."""
        return torch_model

    def twin(self, torch_model: Any) -> nnx.Module:
        """The NNX twin of `trained(...)`, holding a copy of its weights, under its parameter names."""
        return from_torch(torch_model, HEAD_CLASSES[torch_model.hf_architecture])

    def for_devices(self, devices: int) -> "TaskHead":
        """The head of a run whose batches are split over `devices` (itself, unless its loss depends on that)."""
        return self

    def host_inputs(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs the host computes from a padded training batch (A, B, ...); none by default."""
        return {}

    def layout(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One collated micro-batch as the engine pads it (as the task collates it, by default)."""
        return batch


@dataclass(frozen=True)
class SpanHead(TaskHead):
    """Extractive QA: start and end logits over the tokens; padding is never an answer (its logits
    are pushed to the float32 minimum, so a batch's padded length changes neither loss nor outputs)."""

    def logits(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> jax.Array:
        start, end = model(*inputs_of(batch), rngs=rngs)  # (B, T) each
        logits = jnp.stack([start, end], axis=1).astype(jnp.float32)  # (B, 2, T)
        return jnp.where(batch["attention_mask"][:, None, :] != 0, logits, jnp.finfo(jnp.float32).min)

    def loss(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> tuple[jax.Array, dict]:
        logits = self.logits(model, batch, rngs)
        # BERT's: the mean of the start and end cross-entropies; rows padding a batch are -100
        return (_mean_cross_entropy(logits[:, 0], batch["start_positions"]) +
                _mean_cross_entropy(logits[:, 1], batch["end_positions"])) / 2, {}

    def outputs(self, model: nnx.Module, batch: Batch) -> jax.Array:
        return self.logits(model, batch, None)


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """Cross-entropy of (B, C) logits and (B,) class ids weighted per class, as
    `torch.nn.CrossEntropyLoss(weight=weights)`: sum_i w[y_i] nll_i / sum_i w[y_i] over the labelled rows."""
    valid = labels != IGNORE_INDEX
    safe = jnp.where(valid, labels, 0)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), safe)
    w = jnp.where(valid, weights[safe], 0.0)
    return (w * nll).sum() / jnp.maximum(w.sum(), jnp.finfo(jnp.float32).tiny)


def binary_cross_entropy(x: jax.Array, y: jax.Array, pos_weight: jax.Array | float = 1.0) -> jax.Array:
    """Elementwise -(pw y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))) of logits x and targets y,
    as torch's `binary_cross_entropy_with_logits`."""
    return pos_weight * y * jax.nn.softplus(-x) + (1.0 - y) * jax.nn.softplus(x)


def multi_label_loss(logits: jax.Array, targets: jax.Array, pos_weight: jax.Array | None = None) -> jax.Array:
    """Binary cross-entropy of (B, C) logits against (B, C) 0/1 targets, the mean over every (text,
    label) of the rows that are examples (a padding row's targets are NaN), as
    `torch.nn.BCEWithLogitsLoss(pos_weight=...)`: -(pw y log sigmoid(x) + (1 - y) log(1 - sigmoid(x)))."""
    x = logits.astype(jnp.float32)
    valid = ~jnp.isnan(targets[:, :1])  # (B, 1)
    y = jnp.where(valid, targets, 0.0)
    terms = jnp.where(valid, binary_cross_entropy(x, y, 1.0 if pos_weight is None else pos_weight), 0.0)
    return terms.sum() / jnp.maximum(valid.sum() * x.shape[-1], 1)


@dataclass(frozen=True)
class LabelsHead(TaskHead):
    """Classification with several labels per text (one sigmoid each) or with class weights
    (`classification.multi_label`, `class_weights`: single-label, per class; label sets, BCE's pos_weight)."""

    multi_label: bool = False
    weights: tuple[float, ...] | None = None

    def loss(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> tuple[jax.Array, dict]:
        logits = model(*inputs_of(batch), rngs=rngs)  # (B, C)
        weights = None if self.weights is None else jnp.asarray(self.weights, jnp.float32)
        if self.multi_label:
            return multi_label_loss(logits, batch["labels"], weights), {}
        return weighted_cross_entropy(logits, batch["labels"], weights), {}


PADDED = -1e16  # a padded candidate's score (`training.ranking.PADDED`): softmax weight 0, sorted last


def ranking_bce(scores: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
    """Pointwise BCE of (Q, n) logits and labels clamped to [0, 1], over the real candidates
    (`training.ranking.binary_cross_entropy`)."""
    y = jnp.clip(jnp.where(mask, labels, 0.0), 0.0, 1.0)
    return jnp.where(mask, binary_cross_entropy(scores, y), 0.0).sum() / jnp.maximum(mask.sum(), 1)


def listnet_loss(scores: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
    """ListNet over the queries with a candidate (`training.ranking.listnet_loss`; rows that pad a
    batch have none): -sum_j softmax(labels)_j log softmax(scores)_j, averaged."""
    real = mask.any(axis=1)  # (Q,)
    target = jax.nn.softmax(jnp.where(mask, labels, -jnp.inf), axis=1)
    target = jnp.where(mask, target, 0.0)  # a row without candidates: 0, not NaN
    per_query = -(target * jax.nn.log_softmax(jnp.where(mask, scores, PADDED), axis=1)).sum(axis=1)
    return jnp.where(real, per_query, 0.0).sum() / jnp.maximum(real.sum(), 1)


def lambda_loss(scores: jax.Array, labels: jax.Array, mask: jax.Array, sigma: float = 1.0, mu: float = 10.0,
                eps: float = 1e-10) -> jax.Array:
    """LambdaLoss with NDCG-Loss2++ weights (`training.ranking.lambda_loss`, every pair of a query's
    candidates): (Q, n) scores, labels and mask."""
    n = scores.shape[1]
    scores = jnp.where(mask, scores, PADDED)
    order = jnp.argsort(-scores, axis=1, stable=True)  # (Q, n): by score, descending
    by_score = jnp.take_along_axis(scores, order, axis=1)
    real = jnp.take_along_axis(mask, order, axis=1)
    true = jnp.where(real, jnp.take_along_axis(jnp.where(mask, labels, 0.0), order, axis=1), 0.0)
    ideal = jnp.clip(-jnp.sort(-jnp.where(mask, labels, -jnp.inf), axis=1), 0.0, None)
    pairs = real[:, :, None] & real[:, None, :] & (true[:, :, None] > true[:, None, :])  # (Q, n, n)
    discount = jnp.log2(jnp.arange(2, n + 2, dtype=jnp.float32))  # (n,)
    max_dcg = jnp.maximum(((2.0 ** ideal - 1) / discount).sum(axis=1), eps)  # (Q,)
    gain = (2.0 ** jnp.clip(true, 0.0, None) - 1) / max_dcg[:, None]  # (Q, n)
    place = jnp.arange(1, n + 1)
    gap = jnp.abs(place[:, None] - place[None, :])  # (n, n)
    at = jnp.maximum(gap, 1)  # NDCG-Loss2's |1/D(|i-j|) - 1/D(|i-j|+1)|, 0 on the diagonal
    delta = jnp.where(gap == 0, 0.0, jnp.abs(1 / discount[at - 1] - 1 / discount[at]))
    gain_gap = jnp.abs(gain[:, :, None] - gain[:, None, :])
    lambda_rank = jnp.abs(1 / discount[:, None] - 1 / discount[None, :])[None] * gain_gap
    weights = mu * delta[None] * gain_gap + lambda_rank
    score_gap = jnp.clip(by_score[:, :, None] - by_score[:, None, :], -1e8, 1e8)
    terms = weights * jax.nn.log_sigmoid(sigma * score_gap) / np.log(2)
    return -jnp.where(pairs, terms, 0.0).sum() / jnp.maximum(pairs.sum(), 1)


RANKING_LOSSES: dict[str, Callable] = {"bce": ranking_bce, "listnet": listnet_loss, "lambdaloss": lambda_loss}


@dataclass(frozen=True)
class RerankHead(TaskHead):
    """A reranker (task: reranker): a cross-encoder's logit for each (query, candidate) pair of a
    batch's queries, a ranking loss over each query's candidates; evaluation: one logit a pair."""

    loss_name: str = "bce"  # a key of RANKING_LOSSES
    candidates: int = 1  # n: the candidates a query holds in a training batch (the most a training group has)

    def layout(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The P pairs of Q queries (`RerankerTask.collate`: pairs in order, `slots` their places in
        the (Q, n0) matrix) as a grid of `candidates` a query, candidate-major: row j Q + q is
        candidate j of query q; a query with fewer repeats its first (masked out)."""
        if "group_mask" not in batch:  # evaluation's pairs: one logit each
            return batch
        mask, labels, slots = batch["group_mask"], batch["group_labels"], batch["slots"]
        Q, n0 = mask.shape
        n = self.candidates
        if n0 > n:
            raise ValueError(f"a reranker batch holds {n0} candidates for a query; the engine laid out {n}")
        query, place = np.divmod(slots, n0)  # (P,) each
        pair_at = np.repeat(np.searchsorted(query, np.arange(Q))[:, None], n, axis=1)  # (Q, n): the first
        pair_at[query, place] = np.arange(len(slots))
        rows = pair_at.T.reshape(-1)  # candidate-major
        out = {k: v[rows] for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        grid = np.zeros((Q, n), bool)
        grid[:, :n0] = mask
        out["group_mask"] = grid
        out["group_labels"] = np.zeros((Q, n), np.float32)
        out["group_labels"][:, :n0] = labels
        return out

    def loss(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> tuple[jax.Array, dict]:
        mask = batch["group_mask"]  # (Q, n)
        logits = model(*inputs_of(batch), rngs=rngs)[:, 0].astype(jnp.float32)  # (n Q,)
        scores = by_side(logits, mask.shape[1]).T  # (Q, n)
        labels = jnp.where(mask, batch["group_labels"], 0.0)  # a padding query's are NaN
        return RANKING_LOSSES[self.loss_name](scores, labels, mask), {}


def pool(hidden: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
    """Sentence vectors (B, H), float32: the mean of the real tokens' states, or the [CLS] state
    (`bert_kit.embeddings.pool`)."""
    if mode == "cls":
        return hidden[:, 0].astype(jnp.float32)
    weights = mask.astype(jnp.float32)[..., None]  # (B, T, 1)
    return (hidden.astype(jnp.float32) * weights).sum(1) / jnp.maximum(weights.sum(1), 1e-9)


def cosine(u: jax.Array, v: jax.Array, eps: float = 1e-8) -> jax.Array:
    """Row-wise cosine similarity of (B, H) u and v -> (B,), as torch's F.cosine_similarity."""
    norms = jnp.maximum(jnp.linalg.norm(u, axis=-1) * jnp.linalg.norm(v, axis=-1), eps)
    return (u * v).sum(-1) / norms


def cosine_mse_loss(u: jax.Array, v: jax.Array, scores: jax.Array) -> jax.Array:
    """Sentence-BERT's CosineSimilarityLoss: MSE between cos(u, v) and the (B,) targets in [0, 1],
    over the rows whose target is not NaN."""
    valid = ~jnp.isnan(scores)
    error = jnp.where(valid, cosine(u, v) - jnp.where(valid, scores, 0.0), 0.0)
    return jnp.square(error).sum() / jnp.maximum(valid.sum(), 1)


def cosent_loss(u: jax.Array, v: jax.Array, scores: jax.Array, scale: float = 20.0) -> jax.Array:
    """CoSENT (`training.losses.compute_cosent_loss`): log(1 + sum over pairs i, j with
    s_i > s_j of exp(scale * (cos_j - cos_i))); rows with a NaN score take part in no pair."""
    cos = cosine(u, v) * scale  # (B,)
    valid = ~jnp.isnan(scores)
    ranked = (scores[:, None] > scores[None, :]) & valid[:, None] & valid[None, :]  # (B, B)
    diff = jnp.where(ranked, cos[None, :] - cos[:, None], -jnp.inf)
    return jax.nn.logsumexp(jnp.concatenate([jnp.zeros(1), diff.ravel()]))


PAIR_LOSSES: dict[str, Callable] = {"cosine": cosine_mse_loss, "cosent": cosent_loss}


@dataclass(frozen=True)
class PooledHead(TaskHead):
    """A bi-encoder: the encoder's pooled vectors of each side, a loss of them and the labels."""

    pooling: str = "mean"
    loss_name: str = "cosine"  # a key of PAIR_LOSSES

    def vectors(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> jax.Array:
        """(sides, B, H) pooled vectors, float32."""
        hidden = model(*inputs_of(batch), rngs=rngs)  # (sides * B, T, H)
        vectors = pool(hidden, batch["attention_mask"], self.pooling)
        return by_side(vectors, self.sides)

    def loss(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> tuple[jax.Array, dict]:
        u, v = self.vectors(model, batch, rngs)
        return PAIR_LOSSES[self.loss_name](u, v, batch["labels"].astype(jnp.float32)), {}

    def outputs(self, model: nnx.Module, batch: Batch) -> jax.Array:
        return jnp.swapaxes(self.vectors(model, batch, None), 0, 1)  # (B, sides, H)


def normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    """x / max(|x|, eps) along the last axis, as torch's F.normalize."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def cross_entropy_at_diagonal(scores: jax.Array, real: jax.Array) -> jax.Array:
    """The mean over the real rows i of -scores[i, i] + logsumexp_j scores[i, j]; scores (B, C >= B)."""
    B = scores.shape[0]
    ce = jax.nn.logsumexp(scores, axis=-1) - scores[jnp.arange(B), jnp.arange(B)]
    return jnp.where(real, ce, 0.0).sum() / jnp.maximum(real.sum(), 1)


def contrastive_loss(columns: jax.Array, real: jax.Array, scale: float | jax.Array, symmetric: bool = False,
                     known: jax.Array | None = None) -> jax.Array:
    """MNRL (or its symmetric form) of `columns` (k >= 2, B, H), the twin of
    `training.contrastive.multiple_negatives_ranking_loss` on a padded batch: real (B,) bool marks
    the rows that are examples; the others are neither anchors nor candidates. known (B, (k - 1) B)
    bool: candidates left out of an anchor's negatives (embedding.exclude_known_positives)."""
    k, B, H = columns.shape
    unit = normalize(columns.astype(jnp.float32))
    anchors, candidates = unit[0], unit[1:].reshape(-1, H)  # (B, H), ((k - 1) B, H)
    diagonal = jnp.eye(B, (k - 1) * B, dtype=bool)  # p_i is candidate i
    # only the real anchors' rows are masked: a padding row of all -inf would give NaN gradients
    out = real[:, None] & ~jnp.tile(real, k - 1)[None, :]
    if known is not None:
        out = out | (known & real[:, None] & ~diagonal)
    scores = jnp.where(out, -jnp.inf, anchors @ candidates.T * scale)  # (B, (k - 1) B)
    loss = cross_entropy_at_diagonal(scores, real)
    if not symmetric:
        return loss
    back_out = real[:, None] & ~real[None, :]  # p_i against anchor l: l must be real
    if known is not None:  # ... and p_i no known positive of l
        back_out = back_out | (known[:, :B].T & real[:, None] & ~jnp.eye(B, dtype=bool))
    backward = jnp.where(back_out, -jnp.inf, unit[1] @ anchors.T * scale)  # (B, B)
    return (loss + cross_entropy_at_diagonal(backward, real)) / 2


def sharded_contrastive_loss(columns: jax.Array, real: jax.Array, scale: float | jax.Array, shards: int,
                             symmetric: bool = False, known: jax.Array | None = None) -> jax.Array:
    """`contrastive_loss` of each of `shards` equal blocks of the B examples on its own (an anchor's
    candidates are its block's rows only), averaged over the blocks that hold an example: torch's
    DDP with `gather_across_ranks: false`, each rank's loss, its gradients averaged over the ranks.
    columns (k, B, H), real (B,), known (B, (k - 1) B)."""
    k, B, H = columns.shape
    b = B // shards
    blocks = columns.reshape(k, shards, b, H)
    real = real.reshape(shards, b)
    if known is None:
        losses = jax.vmap(lambda c, r: contrastive_loss(c, r, scale, symmetric), in_axes=(1, 0))(blocks, real)
    else:  # each block's anchors against its own candidates, in every candidate column
        at = jnp.arange(shards)
        own = known.reshape(shards, b, k - 1, shards, b)[at, :, :, at, :].reshape(shards, b, (k - 1) * b)
        losses = jax.vmap(lambda c, r, m: contrastive_loss(c, r, scale, symmetric, m),
                          in_axes=(1, 0, 0))(blocks, real, own)
    held = real.any(axis=1)
    return jnp.where(held, losses, 0.0).sum() / jnp.maximum(held.sum(), 1)


def encode_in_pieces(model: nnx.Module, inputs: tuple, rngs: nnx.Rngs | None, rows: int, pooling: str) -> jax.Array:
    """Pooled vectors (R, H) of a batch's R rows, `rows` at a time (GradCache, `embedding.cached`):
    each piece's forward pass is run again in the backward (`jax.checkpoint` in a `lax.map`), so
    one piece's activations are held at a time, and the gradients are the whole batch's. A piece's
    dropout draws from the step's key folded with its index. inputs: (R, T) ids, mask, types."""
    ids = inputs[0]
    inputs = tuple(jnp.zeros_like(ids) if x is None else x for x in inputs)  # no token types: segment 0
    R, T = ids.shape
    pieces = -(-R // rows)
    key = None if rngs is None else rngs.dropout()

    def grid(x: jax.Array) -> jax.Array:  # (pieces, rows, T): the last piece filled with copies of row 0
        return jnp.concatenate([x, jnp.repeat(x[:1], pieces * rows - R, axis=0)]).reshape(pieces, rows, T)

    @jax.checkpoint
    def piece(i: jax.Array, ids: jax.Array, mask: jax.Array, types: jax.Array) -> jax.Array:
        piece_rngs = None if key is None else HostKeys(derive(key, i))
        return pool(model(ids, mask, types, rngs=piece_rngs), mask, pooling)

    grids = tuple(grid(x) for x in inputs)
    vectors = jax.lax.map(lambda args: piece(*args), (jnp.arange(pieces), *grids))  # (pieces, rows, H)
    return vectors.reshape(pieces * rows, -1)[:R]


class ScaledEncoder(nnx.Module):
    """The twin of an `EmbeddingModel` with a learned scale (`bert_kit.tasks.embedding`): its encoder
    `bert` and `logit_scale`, the scale's log (0-d), under the torch model's names; called, the encoder."""

    def __init__(self, bert: nnx.Module, logit_scale: float) -> None:
        self.bert = bert
        self.logit_scale = nnx.Param(jnp.asarray(logit_scale, jnp.float32))

    def __call__(self, *args: Any, **kwargs: Any) -> jax.Array:
        return self.bert(*args, **kwargs)


@dataclass(frozen=True)
class ContrastiveHead(TaskHead):
    """An embedding model (task: embedding): the encoder's pooled vectors of a batch's k columns
    (anchors, positives, hard negatives) and their contrastive loss, at the full width and at
    each Matryoshka width; evaluation outputs one pooled vector per text."""

    pooling: str = "mean"
    scale: float = 20.0
    symmetric: bool = False
    dims: tuple[int, ...] = ()  # embedding.matryoshka_dims (empty: the full width only)
    weights: tuple[float, ...] = ()
    # embedding.exclude_known_positives: the sorted codes anchor id * texts + positive id of every
    # training pair (`training.contrastive.pair_codes`); host data, not part of the jitted programs
    pairs: np.ndarray | None = field(default=None, compare=False, repr=False)
    texts: int = 0
    piece_rows: int = 0  # embedding.cached: the rows a forward pass takes (mini_batch_size); 0: all at once
    learned: bool = False  # embedding.scale: learned: exp of the model's `logit_scale`, at most MAX_LEARNED_SCALE
    local: bool = False  # embedding.gather_across_ranks: false: each device's examples are their own negatives
    shards: int = 1  # the blocks of examples that are their own batches (with `local`: one a device)

    def trained(self, torch_model: Any) -> Any:
        """The whole `EmbeddingModel` with a learned scale (checkpoints hold it), else its encoder."""
        return torch_model if self.learned else torch_model.bert

    def twin(self, torch_model: Any) -> nnx.Module:
        if not self.learned:
            return super().twin(torch_model)
        return ScaledEncoder(super().twin(torch_model.bert), float(torch_model.logit_scale.detach()))

    def for_devices(self, devices: int) -> TaskHead:
        """Each device's block of a batch's examples (split on the examples, in the devices' order,
        after `by_side`: the hosts' rows in turn) is a batch of its own, as a torch rank's."""
        return replace(self, shards=devices) if self.local else self

    def scale_of(self, model: nnx.Module) -> float | jax.Array:
        if not self.learned:
            return self.scale
        return jnp.minimum(jnp.exp(model.logit_scale.get_value().astype(jnp.float32)), MAX_LEARNED_SCALE)

    def contrastive(self, columns: jax.Array, real: jax.Array, scale: float | jax.Array,
                    known: jax.Array | None) -> jax.Array:
        if self.shards > 1:
            return sharded_contrastive_loss(columns, real, scale, self.shards, self.symmetric, known)
        return contrastive_loss(columns, real, scale, self.symmetric, known)

    def host_inputs(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """known (A, B, (k - 1) B) bool: candidate j is a known positive of anchor i, by the text ids
        `keys` (A, B, k) (padding rows -1, known to no one)."""
        if self.pairs is None:
            return {}
        keys = batch["keys"].astype(np.int64)
        anchors, candidates = keys[..., 0], np.swapaxes(keys[..., 1:], 1, 2).reshape(len(keys), -1)
        codes = anchors[:, :, None] * self.texts + candidates[:, None, :]
        at = np.searchsorted(self.pairs, codes).clip(max=len(self.pairs) - 1)
        return {"known": (self.pairs[at] == codes) & (anchors[:, :, None] >= 0) & (candidates[:, None, :] >= 0)}

    def vectors(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> jax.Array:
        """(k, B, H) pooled vectors, float32 (k: the columns of `keys` (B, k))."""
        if self.piece_rows:
            vectors = encode_in_pieces(model, inputs_of(batch), rngs, self.piece_rows, self.pooling)
        else:
            vectors = pool(model(*inputs_of(batch), rngs=rngs), batch["attention_mask"], self.pooling)  # (k B, H)
        return by_side(vectors, batch["keys"].shape[1])

    def loss(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> tuple[jax.Array, dict]:
        columns = self.vectors(model, batch, rngs)
        real, known, scale = batch["keys"][:, 0] >= 0, batch.get("known"), self.scale_of(model)
        if not self.dims:
            return self.contrastive(columns, real, scale, known), {}
        # sentence-transformers' MatryoshkaLoss: the first d components of every vector, renormalised
        return sum(w * self.contrastive(normalize(columns[..., :d]), real, scale, known)
                   for d, w in zip(self.dims, self.weights)), {}

    def outputs(self, model: nnx.Module, batch: Batch) -> jax.Array:
        """(B, H): each text's pooled vector (the task normalises it)."""
        return pool(model(*inputs_of(batch)), batch["attention_mask"], self.pooling)


def task_head(task: Any, train_items: list | None = None) -> TaskHead:
    """The JAX head of a `bert_kit.tasks` Task (by its name and settings; a reranker's by its
    training groups too)."""
    if task.name == "embedding":
        e = task.e
        pairs = getattr(task, "known_pairs", None) if e.exclude_known_positives else None
        if pairs is not None and jax.process_count() > 1:  # a host lays out the known pairs of its rows only
            raise ValueError("engine=jax excludes known positives (embedding.exclude_known_positives) on one host: "
                             "run on one host, or with engine=torch")
        dims = tuple(e.matryoshka_dims or ())
        learned = e.scale == "learned"  # (its first value: the torch model's, log 20, or a checkpoint's)
        return ContrastiveHead("embedding", pooling=e.pooling, scale=20.0 if learned else float(e.scale),
                               symmetric=e.loss == "symmetric", dims=dims,
                               weights=tuple(e.matryoshka_weights or (1.0,) * len(dims)),
                               pairs=None if pairs is None else pairs.cpu().numpy(),
                               texts=getattr(task, "num_texts", 0), piece_rows=e.mini_batch_size if e.cached else 0,
                               learned=learned, local=not e.gather_across_ranks)
    if task.name == "qa":
        return SpanHead("qa")
    if task.name == "reranker":  # n: the most candidates a training group holds (pointwise: 1)
        n = max((len(item["pairs"]) for item in train_items or ()), default=1)
        return RerankHead("reranker", loss_name=task.r.loss, candidates=n)
    if task.name == "similarity" and task.bi_encoder:
        sim = task.s.similarity
        return PooledHead("similarity", sides=2, pooling=sim.pooling, loss_name=sim.loss)
    if task.name == "classification" and (task.multi_label or task.class_weights is not None):
        weights = None if task.class_weights is None else tuple(float(w) for w in task.class_weights)
        return LabelsHead("classification", multi_label=task.multi_label, weights=weights)
    if task.name in ("classification", "token-classification", "similarity"):
        return TaskHead(task.name)
    raise ValueError(f"engine=jax does not fine-tune task {task.name!r}; train it with engine=torch")
