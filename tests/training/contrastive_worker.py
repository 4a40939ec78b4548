"""One rank of the in-batch-negatives tests across processes (test_contrastive_ranks.py), under torchrun:

    torchrun --standalone --nproc_per_node=2 tests/training/contrastive_worker.py OUT

Each rank takes its half of the rows of every column of a fixed batch (`batch`): rank r rows
[r n, (r + 1) n), n = ROWS / world size, and computes the contrastive loss with the negatives of
every rank (`gather=True`):
* on fixed vectors, with autograd to the vectors: OUT/vectors.json (the loss averaged over the
  ranks, and every rank's gradient of its rows);
* through a tiny `EmbeddingModel` with a learned scale under DDP, uncached and with GradCache
  (mini-batches of 5 texts): OUT/{plain,cached}.json (the loss averaged over the ranks, rank 0's
  weight gradients after DDP's all-reduce).
The one-process side computes the same on the whole batch inside pytest.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Callable

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bert_kit.config import BertConfig  # noqa: E402
from bert_kit.model import BERTModel  # noqa: E402
from bert_kit.tasks.base import freeze_pooler  # noqa: E402
from bert_kit.tasks.embedding import EmbeddingModel  # noqa: E402
from bert_kit.training.contrastive import known_positives, multiple_negatives_ranking_loss, pair_codes  # noqa: E402
from bert_kit.training.distributed import (all_gather_object, all_reduce_mean, init_distributed, rank,  # noqa: E402
                                           world_size, wrap_model)
from bert_kit.training.grad_cache import cached_loss  # noqa: E402

torch.set_num_threads(1)
K, ROWS, H, LENGTH = 3, 8, 16, 9  # columns (anchor, positive, negative), rows per column, width, tokens


def vectors() -> torch.Tensor:
    return torch.randn(K, ROWS, H, generator=torch.Generator().manual_seed(0))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) (K, ROWS, LENGTH): the texts of the batch, column by column."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (K, ROWS, LENGTH), generator=g)
    lengths = torch.randint(3, LENGTH + 1, (K, ROWS), generator=g)
    mask = (torch.arange(LENGTH) < lengths[..., None]).long()
    return ids * mask, mask


def tiny_model() -> EmbeddingModel:
    """As the embedding task builds it: the [CLS] pooler, which a sentence vector never reads, frozen
    (DDP would wait for its gradient forever)."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return freeze_pooler(EmbeddingModel(BERTModel(config), learned_scale=True)).train()


def keys() -> torch.Tensor:
    """(K, ROWS) text ids: anchors 0.., positives 100.., negatives 200.."""
    return torch.arange(ROWS)[None, :] + torch.tensor([0, 100, 200])[:, None]


def known() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """`exclude` for the training pairs: each anchor with its positive, with the positive of the row
    3 further (on the other rank when there are two) and with the negative of the row 5 further."""
    rows = range(ROWS)
    pairs = [(i, 100 + i) for i in rows] + [(i, 100 + (i + 3) % ROWS) for i in rows] + \
        [(i, 200 + (i + 5) % ROWS) for i in rows]
    codes, texts = pair_codes(pairs)
    return functools.partial(known_positives, pairs=codes, texts=texts)


def loss_of(vectors_: torch.Tensor, log_scale: torch.Tensor, symmetric: bool, gather: bool,
            excluded: bool = False, rows: slice = slice(None)) -> torch.Tensor:
    cols = vectors_.view(K, -1, vectors_.shape[-1])
    exclude, ids = (known(), keys()[:, rows]) if excluded else (None, None)
    return multiple_negatives_ranking_loss(cols, log_scale.exp(), symmetric, gather, exclude, ids)


def model_run(model, ids, mask, symmetric: bool, gather: bool, chunk: int | None):
    """(loss, the model's gradients by name) of one step on rows (K * n, LENGTH), column by column."""
    flat_ids, flat_mask = ids.reshape(-1, LENGTH), mask.reshape(-1, LENGTH)
    core = model.module if hasattr(model, "module") else model
    fn = lambda v, s: loss_of(v, s, symmetric, gather)  # noqa: E731
    if chunk is None:
        loss = fn(model(flat_ids, flat_mask), core.logit_scale)
    else:
        def embed(i: int) -> torch.Tensor:
            rows = slice(i * chunk, (i + 1) * chunk)
            return model(flat_ids[rows], flat_mask[rows])

        loss = cached_loss(embed, -(-len(flat_ids) // chunk), fn, torch.device("cpu"), core.logit_scale, model)
    loss.backward()
    return loss.detach(), {n: p.grad.tolist() for n, p in core.named_parameters() if p.grad is not None}


def main(out: Path) -> None:
    init_distributed(timeout_s=60)
    n = ROWS // world_size()
    rows = slice(rank() * n, (rank() + 1) * n)
    results = {}
    for symmetric, excluded in ((False, False), (True, False), (False, True), (True, True)):
        local = vectors()[:, rows].clone().requires_grad_()
        scale = torch.tensor(math.log(20.0), requires_grad=True)
        loss = loss_of(local.reshape(-1, H), scale, symmetric, gather=True, excluded=excluded, rows=rows)
        loss.backward()
        results[f"symmetric={symmetric}" + ",excluded" * excluded] = {"loss": float(all_reduce_mean(loss.detach())),
                                             "grads": all_gather_object(local.grad.tolist()),
                                             "scale_grad": float(all_reduce_mean(scale.grad))}
    if rank() == 0:
        (out / "vectors.json").write_text(json.dumps(results))
    ids, mask = batch()
    for name, chunk in (("plain", None), ("cached", 5)):
        model = wrap_model(tiny_model(), torch.device("cpu"), "ddp")
        loss, grads = model_run(model, ids[:, rows], mask[:, rows], symmetric=True, gather=True, chunk=chunk)
        mean = float(all_reduce_mean(loss))
        if rank() == 0:
            (out / f"{name}.json").write_text(json.dumps({"loss": mean, "grads": grads}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
