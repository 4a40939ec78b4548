"""Fine-tuning on a GPU: steady-state steps never wait for the device, the unpadded path with
variable-length flash attention (dropout included) trains like the padded one, and whole steps
replayed as CUDA graphs compute what the eager steps compute.

Skipped without CUDA. Run: .venv/bin/python -m pytest tests/tasks/test_finetuning_gpu.py -q
"""

import math

import pytest
import torch

from bert_kit import BertConfig
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.input_checks import unchecked_inputs
from bert_kit.kernels import fast_path
from bert_kit.kernels.packing import Packed
from bert_kit.tasks.base import encode
from bert_kit.training.losses import compute_classification_loss, compute_multi_label_loss
from bert_kit.training.optim import create_optimizer
from bert_kit.training.precision import resolve_precision
from bert_kit.training.trainer import AMPTrainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def config(dropout: float) -> BertConfig:
    return BertConfig(vocab_size=500, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=256, max_position_embeddings=64, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout)


def batches(n: int, B: int = 16, T: int = 48, seed: int = 0) -> list[dict]:
    """Variable-length batches of a learnable task: the label says whether the first token id is below 250."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(4, T + 1, (B,), generator=g)
        mask = (torch.arange(T)[None] < lengths[:, None]).long()
        ids = torch.randint(5, 500, (B, T), generator=g) * mask
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
                    "labels": (ids[:, 0] < 250).long()})
    return out


def train(unpadded: bool, dropout: float, steps: int = 200, sync_check_after: int | None = None, graphs: bool = False,
          precision: str = "bf16", pad_to: int | None = None, batch_size: int = 16, multi_label: bool = False
          ) -> list[float]:
    torch.manual_seed(0)
    precision = resolve_precision(precision, "cuda", verbose=False)
    model = BERTForSequenceClassification(config(dropout), num_labels=3 if multi_label else 2).cuda()
    fast_path.apply(model, "cuda", training=True, dtype=precision.dtype)  # as `bert-kit finetune` does
    optimizer = create_optimizer(model, "adamw", 1e-3, 0.01, (0.9, 0.999), 1e-6, "cuda", capturable=graphs)
    trainer = AMPTrainer(model, optimizer, None, precision, clip_grad=1.0, deferred_checks=True, cuda_graphs=graphs)
    assert trainer.deferred
    losses = []

    pos_weight = torch.tensor([1.0, 3.0, 0.5], device="cuda")  # made once, as the task's class weights are

    def loss_fn(b):
        logits = encode(trainer.model, b, unpadded)
        if multi_label:
            return compute_multi_label_loss(logits, b["labels"], pos_weight), {}
        return compute_classification_loss(logits, b["labels"]), {}

    with unchecked_inputs():
        for i, batch in enumerate(batches(steps, B=batch_size)):
            if multi_label:  # three labels of the first two ids: (B, 3) 0/1 targets
                ids = batch["input_ids"]
                batch["labels"] = torch.stack([ids[:, 0] < 250, ids[:, 1] < 100, ids[:, 0] % 2 == 0], 1).float()
            if pad_to:  # static shapes: each graph is captured once and replayed
                T = -(-int(batch["attention_mask"].sum(1).max()) // pad_to) * pad_to
                batch = {k: v[:, :T] if v.dim() == 2 else v for k, v in batch.items()}
            batch = {k: v.pin_memory() for k, v in batch.items()}
            if unpadded:
                batch["packed"] = Packed.from_mask(batch["attention_mask"])
            if sync_check_after is not None and i >= sync_check_after:
                torch.cuda.set_sync_debug_mode("error")  # any host-device synchronisation now raises
            try:
                trainer.train_step(batch, loss_fn)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            losses.append(trainer.last["loss"].clone())  # a graph's output is overwritten by its next replay
    trainer.check_finite()
    assert all(p.grad is None for p in model.parameters())  # a graph's gradients live inside its step
    return [float(x) for x in losses]


def test_steady_state_steps_never_synchronise():
    for unpadded in (False, True):
        losses = train(unpadded, dropout=0.1, steps=8, sync_check_after=2)
        assert all(math.isfinite(x) for x in losses)


def test_unpadded_flash_with_dropout_trains_like_padded():
    # without dropout the two paths compute the same function (bf16 rounding apart)
    plain, fast = train(False, 0.0), train(True, 0.0)
    first = sum(plain[:20]) / 20
    assert abs(sum(plain[-20:]) / 20 - sum(fast[-20:]) / 20) < 0.05 * first
    # with dropout the masks differ, the learning does not: both fall well below the start
    plain, fast = train(False, 0.1), train(True, 0.1)
    for curve in (plain, fast):
        assert sum(curve[-20:]) / 20 < 0.5 * sum(curve[:20]) / 20
    assert abs(sum(plain[-20:]) / 20 - sum(fast[-20:]) / 20) < 0.1 * first


def test_cuda_graph_steps_compute_the_eager_steps():
    # fp32, no dropout: the replayed kernels are the eager ones, so the losses agree to rounding
    eager = train(False, 0.0, steps=60, precision="fp32", pad_to=16)
    graphed = train(False, 0.0, steps=60, precision="fp32", pad_to=16, graphs=True)
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-4, atol=1e-5)
    # bf16 with dropout: replays draw fresh masks (the loss curve learns as the eager one does)
    graphed = train(False, 0.1, steps=200, pad_to=16, graphs=True, sync_check_after=120)
    assert sum(graphed[-20:]) / 20 < 0.5 * sum(graphed[:20]) / 20


def test_cuda_graph_steps_of_a_weighted_multi_label_loss_compute_the_eager_steps():
    """(B, C) float targets and a pos_weight made before the capture: the replayed step is the eager one."""
    eager = train(False, 0.0, steps=60, precision="fp32", pad_to=16, multi_label=True)
    graphed = train(False, 0.0, steps=60, precision="fp32", pad_to=16, graphs=True, multi_label=True)
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-4, atol=1e-5)
    learnt = train(True, 0.1, steps=200, multi_label=True)
    assert sum(learnt[-20:]) / 20 < 0.8 * sum(learnt[:20]) / 20


def test_cuda_graphs_of_shapes_seen_late_compute_the_eager_steps():
    # batches of 4 cut at their longest sequence: a new shape (its eager warm-up, then its capture)
    # keeps coming between replays of the graphs captured before. The warm-ups once freed the
    # gradient tensors earlier graphs added into, so other graphs' memory overwrote them; now each
    # graph writes its gradients afresh in the shared pool, and nothing is kept between replays
    eager = train(False, 0.0, steps=80, precision="fp32", pad_to=1, batch_size=4)
    graphed = train(False, 0.0, steps=80, precision="fp32", pad_to=1, batch_size=4, graphs=True)
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-4, atol=1e-5)
