"""Optimizers and schedules: hand-computed LR values, LAMB's update rule, weight-decay groups.

Run: .venv/bin/python -m pytest tests/training/test_optim.py -q
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from bert_kit.config import BertConfig
from bert_kit.heads import BERTForPreTraining
from bert_kit.training.optim import (LAMB, AdamW, create_optimizer, create_scheduler, lr_multiplier, no_decay_names,
                                     param_groups)

torch.set_num_threads(1)  # tiny tensors: threads only add contention on a shared machine


def tiny_config() -> BertConfig:
    return BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=16)


@pytest.mark.parametrize("step, expected", [
    (0, 0.1), (4, 0.5), (9, 1.0),  # warmup: (step + 1) / 10
    (10, 1.0), (35, 0.75), (60, 0.5), (85, 0.25), (110, 0.0), (200, 0.0),  # 1 - (step - 10) / 100
])
def test_linear_schedule_values(step, expected):
    assert lr_multiplier(step, 10, 110, "linear") == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("step, expected", [
    (4, 0.5), (10, 1.0), (35, 0.5 * (1 + math.cos(math.pi / 4))), (60, 0.5), (110, 0.0),
])
def test_cosine_schedule_values(step, expected):
    assert lr_multiplier(step, 10, 110, "cosine") == pytest.approx(expected, abs=1e-12)


def test_min_ratio_and_constant():
    assert lr_multiplier(60, 10, 110, "linear", min_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5, abs=1e-12)
    assert lr_multiplier(110, 10, 110, "cosine", min_ratio=0.1) == pytest.approx(0.1, abs=1e-12)
    assert lr_multiplier(100, 10, 110, "constant") == 1.0
    assert lr_multiplier(0, 0, 10, "linear") == 1.0  # no warmup: full lr at once
    with pytest.raises(ValueError, match="schedule must be one of"):
        lr_multiplier(50, 10, 110, "step")


def test_scheduler_drives_the_optimizer_lr():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = create_scheduler(opt, warmup_steps=4, total_steps=8, schedule="linear")
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])  # the lr update s runs with
        opt.step()
        sched.step()
    expected = [2.0 * lr_multiplier(s, 4, 8) for s in range(8)]
    torch.testing.assert_close(torch.tensor(seen), torch.tensor(expected), rtol=0, atol=1e-12)
    assert seen[:4] == [0.5, 1.0, 1.5, 2.0]
    # the state holds the step count only, so a resumed run keeps its own schedule
    state = sched.state_dict()
    assert state["last_epoch"] == 8 and state["lr_lambdas"] == [None]


def test_no_weight_decay_on_biases_and_layernorm():
    model = BERTForPreTraining(tiny_config())
    skipped = set(no_decay_names(model))
    assert "bert.embeddings.norm.weight" in skipped
    assert "bert.encoder.layers.0.attention.qkv.bias" in skipped
    assert "bert.encoder.layers.0.ffn_norm.weight" in skipped
    assert "mlm.decoder.bias" in skipped
    assert "bert.encoder.layers.0.attention.qkv.weight" not in skipped
    assert "bert.embeddings.word_embeddings.weight" not in skipped
    groups = param_groups(model, 0.01)
    decayed = {id(p) for p in groups[0]["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in decayed) == (name not in skipped), name
    assert groups[0]["weight_decay"] == 0.01 and groups[1]["weight_decay"] == 0.0
    # every parameter once, the tied decoder weight included only through the embeddings
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(list(model.parameters()))

    # behaviour: with zero gradients, AdamW shrinks decayed weights and leaves LayerNorm alone
    opt = create_optimizer(model, "adamw", lr=0.1, weight_decay=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    norm = "bert.embeddings.norm.weight"
    torch.testing.assert_close(after[norm], before[norm], rtol=0, atol=0)
    torch.testing.assert_close(after["bert.pooler.dense.weight"], before["bert.pooler.dense.weight"] * (1 - 0.1 * 0.5),
                               rtol=1e-6, atol=1e-7)


def _toy_regression(optimizer_name: str, steps: int = 150) -> tuple[float, float]:
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    w_true = torch.randn(8, 1)
    y = x @ w_true + 0.01 * torch.randn(64, 1)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = create_optimizer(model, optimizer_name, lr=1e-2, weight_decay=0.0)
    first = None
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return first, nn.functional.mse_loss(model(x), y).item()


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_optimizers_fit_a_toy_problem(name):
    first, last = _toy_regression(name)
    assert last < 0.05 * first, (first, last)


def test_lamb_step_matches_the_formula():
    torch.manual_seed(1)
    w = nn.Parameter(torch.randn(4, 3))
    g = torch.randn(4, 3)
    w0 = w.detach().clone()
    opt = LAMB([w], lr=0.1, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    w.grad = g.clone()
    opt.step()
    m_hat = (0.1 * g) / (1 - 0.9)
    v_hat = (0.01 * g * g) / (1 - 0.99)
    r = m_hat / (v_hat.sqrt() + 1e-6) + 0.01 * w0
    expected = w0 - 0.1 * (w0.norm() / r.norm()) * r
    torch.testing.assert_close(w.detach(), expected, rtol=1e-6, atol=1e-7)

    # without layer adaptation (the no-decay group) the trust ratio is 1
    b = nn.Parameter(torch.ones(3))
    opt = LAMB([{"params": [b], "trust_ratio": False}], lr=0.1)
    b.grad = torch.full((3,), 2.0)
    opt.step()
    torch.testing.assert_close(b.detach(), torch.full((3,), 1 - 0.1 * (1 / (1 + 1e-6))), rtol=1e-6, atol=1e-7)


def test_unknown_optimizer_is_rejected():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        create_optimizer(nn.Linear(2, 2), "sgd")


def test_adamw_is_torchs_update_and_state_dict():
    torch.manual_seed(0)
    ours, theirs = BERTForPreTraining(tiny_config()), BERTForPreTraining(tiny_config())
    theirs.load_state_dict(ours.state_dict())
    ours.eval(), theirs.eval()  # no dropout: the same gradients
    groups = param_groups(theirs, 0.01)
    for g in groups:
        g.pop("trust_ratio", None)
    opts = [create_optimizer(ours, "adamw", lr=1e-2, weight_decay=0.01, device="cpu"),
            torch.optim.AdamW(groups, lr=1e-2, eps=1e-6, fused=False)]
    assert isinstance(opts[0], AdamW) and isinstance(opts[0], torch.optim.AdamW)
    for step in range(4):
        ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(step))
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            model.bert(ids).pow(2).mean().backward()
            opt.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)  # bit for bit
    mine, torchs = opts[0].state_dict(), opts[1].state_dict()
    assert mine["param_groups"] == torchs["param_groups"]
    for i, state in torchs["state"].items():
        assert all(torch.equal(mine["state"][i][k], v) for k, v in state.items())
    opts[0].load_state_dict(torchs)  # either loads the other's state


# a CPU training step, a checkpoint and its reload, with each optimizer
NO_DYNAMO = """
import sys, tempfile, torch
from bert_kit.config import BertConfig
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.training.checkpoint import load_checkpoint, save_checkpoint
from bert_kit.training.optim import create_optimizer
from bert_kit.training.trainer import AMPTrainer
config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                    max_position_embeddings=16)
model = BERTForSequenceClassification(config, num_labels=2)
optimizer = create_optimizer(model, sys.argv[1], lr=1e-3, device="cpu")
trainer = AMPTrainer(model, optimizer, clip_grad=1.0)
batch = {"input_ids": torch.randint(0, 50, (4, 8)), "attention_mask": torch.ones(4, 8, dtype=torch.long),
         "labels": torch.tensor([0, 1, 0, 1])}
for _ in range(2):
    trainer.classification_step(batch)
with tempfile.TemporaryDirectory() as d:
    load_checkpoint(save_checkpoint(d, 2, model, optimizer=optimizer), model, optimizer=optimizer)
heavy = ("torch._dynamo", "sympy", "torch.distributed.fsdp", "torch.distributed.tensor")
loaded = [m for m in heavy if m in sys.modules]
assert not loaded, loaded
"""


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_training_without_compile_never_imports_dynamo(name):
    # torch's optimizers import torch._dynamo (with sympy and FSDP: 2-4 s) on their first call
    subprocess.run([sys.executable, "-c", NO_DYNAMO, name], check=True)
