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
| token-classification      | BERTForTokenClassification     | cross-entropy per tag          | logits (T, C)        |
| qa                        | BERTForQuestionAnswering       | mean of start and end CE       | (2, T): start, end   |
| similarity, cross-encoder | BERTForSequenceClassification  | MSE on the score               | (1,)                 |
| similarity, bi-encoder    | BERTModel                      | cosine MSE, or CoSENT          | (2, H): u, v pooled  |

A bi-encoder's batch holds two sentences per example, all first sentences then all second ones
(`SimilarityTask.collate`): `sides` = 2 tells the engine to pad each side's rows apart. An
embedding (contrastive) task is one more `PooledHead` loss: a function of the pooled vectors of
its `sides` (anchor, positive, negatives) and the labels, in-batch negatives over the rows whose
label is not NaN (padding rows carry NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from bert_kit.jax.train import _mean_cross_entropy, task_loss

Batch = Mapping[str, jax.Array]


def inputs_of(batch: Batch) -> tuple:
    return batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids")


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
        return vectors.reshape(self.sides, -1, vectors.shape[-1])

    def loss(self, model: nnx.Module, batch: Batch, rngs: nnx.Rngs | None) -> tuple[jax.Array, dict]:
        u, v = self.vectors(model, batch, rngs)
        return PAIR_LOSSES[self.loss_name](u, v, batch["labels"].astype(jnp.float32)), {}

    def outputs(self, model: nnx.Module, batch: Batch) -> jax.Array:
        return jnp.swapaxes(self.vectors(model, batch, None), 0, 1)  # (B, sides, H)


def task_head(task: Any) -> TaskHead:
    """The JAX head of a `bert_kit.tasks` Task (by its name and settings)."""
    if task.name == "qa":
        return SpanHead("qa")
    if task.name == "similarity" and task.bi_encoder:
        sim = task.s.similarity
        return PooledHead("similarity", sides=2, pooling=sim.pooling, loss_name=sim.loss)
    if task.name in ("classification", "token-classification", "similarity"):
        return TaskHead(task.name)
    raise ValueError(f"engine=jax does not fine-tune task {task.name!r}; train it with engine=torch")
