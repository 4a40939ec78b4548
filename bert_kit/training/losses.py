"""Losses as plain functions, and evaluation loops over a data loader (the 001 API).

Labels follow the -100 convention: positions labelled -100 take no part in the MLM loss.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.nn.functional as F

from bert_kit.heads import with_prediction_slots

IGNORE_INDEX = -100


class _SummedCrossEntropy(torch.autograd.Function):
    """sum_i (logsumexp(x_i) - x_i[t_i]) over the rows whose target t_i is not -100, in float32.

    The gradient is one pointwise expression, softmax(x_i) - onehot(t_i), which compiled code fuses
    with what follows. Autograd's cross-entropy goes through log_softmax's backward, whose row sums
    of the incoming gradient add a reduction over the logits (BERT-base pretraining on an H200:
    the loss kernels took 1.16 ms a step, 0.94 ms this way).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        lse = torch.logsumexp(logits.float(), dim=-1)  # (N,)
        valid = targets != IGNORE_INDEX
        picked = logits.gather(1, targets.clamp(min=0)[:, None]).squeeze(1).float()
        ctx.save_for_backward(logits, targets, lse)
        return torch.where(valid, lse - picked, 0.0).sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, targets, lse = ctx.saved_tensors
        row_grad = torch.where(targets != IGNORE_INDEX, grad, 0.0)[:, None]  # (N, 1)
        words = torch.arange(logits.shape[1], device=logits.device)
        softmax = torch.exp(logits.float() - lse[:, None])
        return ((softmax - (words == targets[:, None]).float()) * row_grad).to(logits.dtype), None


def summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """F.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="sum") for (N, V)
    logits and (N,) targets, with a one-pass gradient (see `_SummedCrossEntropy`)."""
    return _SummedCrossEntropy.apply(logits, targets)


def compute_mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the masked tokens.

    logits: (B, T, V) for every position, or (N, V) for the N labelled positions only (what the
        MLM heads return when given `labels`); labels: (B, T) with -100 where nothing is masked,
        or the (N,) targets themselves (`labels.flatten()[masked_index]`, -100 in padded slots).
    Computed in float32 whatever the logits' dtype, for a stable softmax over 30k classes.
    """
    if labels.dim() == 1 and logits.dim() == 2:  # -100 marks padded prediction slots; none labelled: 0
        return summed_cross_entropy(logits, labels) / (labels != IGNORE_INDEX).sum().clamp(min=1)
    if logits.dim() == 3:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
    targets = labels.flatten()
    targets = targets[targets != IGNORE_INDEX]
    if targets.shape[0] != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} MLM logits rows but {targets.shape[0]} labelled positions")
    return F.cross_entropy(logits.float(), targets)


def compute_classification_loss(logits: torch.Tensor, labels: torch.Tensor,
                                weight: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy for (B, C) logits and (B,) class ids; MSE when C == 1 (regression).
    weight: (C,) per-class weights, as `torch.nn.CrossEntropyLoss(weight=...)`: the mean is
    sum_i w[y_i] * nll_i / sum_i w[y_i]."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), weight=weight, ignore_index=IGNORE_INDEX)


def compute_multi_label_loss(logits: torch.Tensor, targets: torch.Tensor,
                             pos_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Binary cross-entropy of (B, C) logits, one independent sigmoid per label, against (B, C)
    0/1 targets, the mean over every (text, label): HF's loss for problem_type
    multi_label_classification. pos_weight: (C,) weights of each label's positive term
    (`torch.nn.BCEWithLogitsLoss(pos_weight=...)`: negatives / positives balances a label)."""
    return F.binary_cross_entropy_with_logits(logits.float(), targets.float(), pos_weight=pos_weight)


def compute_cosine_similarity_loss(u: torch.Tensor, v: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Sentence-BERT's CosineSimilarityLoss: MSE between cos(u, v) and the gold score in [0, 1].

    u, v: (B, H) pooled vectors of the two sides; scores: (B,) targets (STS-B score / 5)."""
    return F.mse_loss(F.cosine_similarity(u.float(), v.float(), dim=-1), scores.float())


def compute_cosent_loss(u: torch.Tensor, v: torch.Tensor, scores: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """CoSENT (Su, 2022; sentence-transformers' CoSENTLoss): a ranking loss on cosine similarities.

    For every two pairs i, j of the batch with gold scores s_i > s_j, cos_i should exceed cos_j:
    loss = log(1 + sum over such (i, j) of exp(scale * (cos_j - cos_i))). Only the order of the
    gold scores matters, which is what Spearman correlation measures.
    u, v: (B, H); scores: (B,) gold similarities (any scale).
    """
    cos = F.cosine_similarity(u.float(), v.float(), dim=-1) * scale  # (B,)
    diff = cos[None, :] - cos[:, None]  # (B, B): entry (i, j) = cos_j - cos_i
    ranked = scores[:, None] > scores[None, :]  # (B, B): pair i should rank above pair j
    # pairs not ranked contribute exp(-inf) = 0 (a mask, not a selection: no wait for the device)
    terms = torch.cat([diff.new_zeros(1), diff.masked_fill(~ranked, float("-inf")).flatten()])  # 0: the "1 +"
    return torch.logsumexp(terms, dim=0)


def compute_pretraining_loss(model: torch.nn.Module, batch: dict,
                             mlm_loss_fn=compute_mlm_loss) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MLM (+ NSP) loss of one batch: (loss, {"mlm_loss": ..., "nsp_loss": ...}).

    The batch holds input_ids, attention_mask, token_type_ids (B, T) and either labels (B, T)
    (-100 where nothing is masked) or fixed prediction slots (`with_prediction_slots`:
    masked_index (S,), masked_labels (S,)), plus next_sentence_label (B,) for NSP.
    """
    if "masked_index" in batch:  # fixed prediction slots (padded with -100 targets)
        out = model(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"),
                    masked_index=batch["masked_index"])
        labels = batch["masked_labels"]
    else:
        labels = batch["labels"]
        out = model(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"), labels=labels)
    mlm_logits, nsp_logits = out if isinstance(out, tuple) else (out, None)
    if mlm_logits.shape[0] == 0:
        # no masked token in this micro-batch (tiny batches): a zero loss that keeps the graph
        mlm = mlm_logits.sum() * 0.0
    else:
        mlm = mlm_loss_fn(mlm_logits, labels)
    parts = {"mlm_loss": mlm}
    loss = mlm
    nsp_labels = batch.get("next_sentence_label")
    if nsp_logits is not None and nsp_labels is not None:
        parts["nsp_loss"] = F.cross_entropy(nsp_logits.float(), nsp_labels)
        loss = loss + parts["nsp_loss"]
    elif nsp_logits is not None:
        loss = loss + nsp_logits.sum() * 0.0  # keep every parameter in the graph (DDP)
    return loss, parts


def _to(batch: dict, device: torch.device | str) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


@torch.no_grad()
def compute_mlm_loader_loss(model: torch.nn.Module, loader: Iterable[dict], device: torch.device | str = "cpu",
                            max_batches: int | None = None,
                            autocast_dtype: torch.dtype | None = None,
                            prediction_slots: float | None = None) -> dict[str, float]:
    """Evaluate an MLM (or MLM + NSP) model over a loader of dict batches.

    Batches hold input_ids, attention_mask, token_type_ids, labels and optionally
    next_sentence_label. Returns mlm_loss (token-weighted mean), perplexity, mlm_accuracy and,
    when NSP labels are present, nsp_loss and nsp_accuracy. prediction_slots: gather the masked
    positions into fixed slots (`with_prediction_slots`), for a model compiled with static shapes.
    """

    was_training = model.training
    model.eval()
    sums = torch.zeros(6, dtype=torch.float64, device=device)  # MLM loss, correct, count; NSP the same
    device_type = torch.device(device).type
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        if prediction_slots:
            batch = with_prediction_slots(batch, prediction_slots)
        batch = _to(batch, device)
        if prediction_slots:
            selected = {"masked_index": batch["masked_index"]}
            targets = batch["masked_labels"]  # -100 in the padded slots
        else:
            selected = {"labels": batch["labels"]}
            targets = batch["labels"].flatten()[batch["labels"].flatten() != IGNORE_INDEX]
        with torch.autocast(device_type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            out = model(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"), **selected)
        mlm_logits, nsp_logits = out if isinstance(out, tuple) else (out, None)
        real = targets != IGNORE_INDEX
        # summed on the device: the host reads the sums once, not three numbers a batch
        sums[0] += F.cross_entropy(mlm_logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
        sums[1] += ((mlm_logits.argmax(-1) == targets) & real).sum()
        sums[2] += real.sum()
        nsp_labels = batch.get("next_sentence_label")
        if nsp_logits is not None and nsp_labels is not None:
            sums[3] += F.cross_entropy(nsp_logits.float(), nsp_labels, reduction="sum")
            sums[4] += (nsp_logits.argmax(-1) == nsp_labels).sum()
            sums[5] += nsp_labels.numel()
    model.train(was_training)
    mlm_sum, mlm_correct, mlm_count, nsp_sum, nsp_correct, nsp_count = sums.tolist()
    return mlm_metrics(mlm_sum, mlm_correct, mlm_count, nsp_sum, nsp_correct, nsp_count)


def mlm_metrics(mlm_sum: float, mlm_correct: float, mlm_count: float, nsp_sum: float = 0.0,
                nsp_correct: float = 0.0, nsp_count: float = 0.0) -> dict[str, float]:
    """Held-out MLM (+ NSP) metrics from sums over the evaluation batches (of either engine): summed
    cross-entropy, correct predictions and count of the masked tokens (and of the NSP pairs)."""
    mlm_loss = mlm_sum / max(mlm_count, 1)
    result = {"mlm_loss": mlm_loss, "perplexity": math.exp(min(mlm_loss, 50.0)),
              "mlm_accuracy": mlm_correct / max(mlm_count, 1), "mlm_tokens": int(mlm_count)}
    if nsp_count:
        result.update(nsp_loss=nsp_sum / nsp_count, nsp_accuracy=nsp_correct / nsp_count)
    return result
