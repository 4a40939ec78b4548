"""The JAX engine's training against the torch one: the same loss and gradients from the same weights
and batch (1e-4 relative, fp32, dropout off), the same AdamW update (decay on matrices only,
clipping, the schedule), bf16 with float32 master weights, donated state, a falling loss, and
data parallel over a mesh of 2 CPU devices giving the 1-device losses.

Run: .venv/bin/python -m pytest tests/jax/test_train.py -q
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
jnp = jax.numpy
from flax import nnx  # noqa: E402

import bert_kit.jax as bj  # noqa: E402
from bert_kit.heads import BERTForPreTraining, BERTForSequenceClassification  # noqa: E402
from bert_kit.jax.weights import torch_name, torch_state_dict  # noqa: E402
from bert_kit.training.losses import compute_classification_loss, compute_pretraining_loss  # noqa: E402
from bert_kit.training.optim import create_optimizer, lr_multiplier, no_decay_names  # noqa: E402
from tests.jax.common import jax_twin, max_abs, padded_batch, tiny  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = tiny(num_hidden_layers=1)
LR, WARMUP, TOTAL, WD, BETAS, EPS, CLIP = 1e-3, 2, 100, 0.01, (0.9, 0.98), 1e-6, 0.1


def make_task(kind: str) -> tuple[torch.nn.Module, dict]:
    """A seeded torch model of the head `kind` and a padded batch with its labels."""
    torch.manual_seed(0)
    batch = padded_batch(CONFIG, [11, 6, 9, 3], 11, seed=1)
    batch["input_ids"][0, 5] = CONFIG.pad_token_id  # a padding id among the tokens: its row takes no gradient
    rng = np.random.default_rng(1)
    real = batch["attention_mask"] == 1
    if kind == "pretraining":
        model = BERTForPreTraining(CONFIG)
        batch["labels"] = np.where((rng.random(real.shape) < 0.3) & real, batch["input_ids"], -100)
        batch["labels"][:, 1] = batch["input_ids"][:, 1]  # every row predicts at least one token
        batch["next_sentence_label"] = np.array([1, 0, 0, 1])
    else:
        model = BERTForSequenceClassification(CONFIG, num_labels=3)
        batch["labels"] = np.array([2, 0, 1, 2])
    return model.train(), batch


def torch_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    tb = {k: torch.as_tensor(v) for k, v in batch.items()}
    if isinstance(model, BERTForPreTraining):
        return compute_pretraining_loss(model, tb)[0]
    logits = model(tb["input_ids"], tb["attention_mask"], tb["token_type_ids"])
    return compute_classification_loss(logits, tb["labels"])


def assert_relatively_close(got: dict, expected: dict, rtol: float) -> None:
    """Each tensor within rtol of its largest entry (a gradient's scale is its largest value)."""
    assert got.keys() == expected.keys()
    for name in expected:
        scale = float(np.abs(expected[name]).max())
        assert max_abs(got[name], expected[name]) <= rtol * scale, name


def torch_step(model: torch.nn.Module, batch: dict) -> tuple[float, float, dict, dict]:
    """bert-kit's torch update: AdamW over `param_groups`, clipping, the schedule's first lr.
    Returns the loss, the gradient norm before clipping, the gradients and the new parameters."""
    optimizer = create_optimizer(model, "adamw", lr=LR * lr_multiplier(0, WARMUP, TOTAL), weight_decay=WD,
                                 betas=BETAS, eps=EPS)
    loss = torch_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return loss.item(), norm.item(), grads, {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def optimizer():
    return bj.create_optimizer(bj.lr_schedule(LR, WARMUP, TOTAL), weight_decay=WD, betas=BETAS, eps=EPS,
                               clip_grad=CLIP)


@pytest.mark.parametrize("kind", ["pretraining", "classification"])
def test_the_jitted_step_matches_torch_and_lowers_the_loss(kind, optimizer):
    """Loss and gradients within 1e-4 relative, the AdamW update within 1e-6, on a 1-device mesh."""
    model, batch = make_task(kind)
    twin = jax_twin(model, **({} if kind == "pretraining" else {"num_labels": model.num_labels}))
    if kind == "pretraining":  # the prediction-slot path: (B, P) positions, static shapes under jit
        batch["masked_positions"], batch["masked_labels"] = bj.prediction_slots(batch.pop("labels"))
    mesh = bj.make_mesh(jax.devices()[:1])
    graphdef, state = bj.init_train_state(twin, optimizer, mesh)
    step = bj.make_train_step(graphdef, optimizer, mesh, return_grads=True)
    sharded = bj.shard_batch(batch, mesh)
    old = jax.tree.leaves(state.params)[0]
    state, metrics = step(state, sharded)
    assert old.is_deleted()  # the state was donated: updated in place

    loss, norm, grads, params = torch_step(model, make_task(kind)[1])
    assert abs(float(metrics["loss"]) - loss) <= 1e-4 * loss
    assert_relatively_close(torch_state_dict(twin, metrics["grads"]), grads, rtol=1e-4)
    assert abs(float(metrics["grad_norm"]) - norm) <= 1e-4 * norm and norm > CLIP  # clipping was at work
    got = torch_state_dict(twin, state.params)
    assert max(max_abs(got[n], params[n]) for n in params) <= 1e-6  # updates are ~1e-3

    losses = [float(metrics["loss"])]
    for _ in range(29):
        state, metrics = step(state, sharded)
        losses.append(float(metrics["loss"]))
    assert int(state.step) == 30
    assert losses[-1] < 0.75 * losses[0], losses


def test_bf16_computes_in_bf16_and_keeps_float32_weights(optimizer):
    """Read from the step's program (traced, not compiled: XLA's CPU compiler is the slow part)."""
    model, batch = make_task("classification")
    mesh = bj.make_mesh(jax.devices()[:1])
    graphdef, state = bj.init_train_state(jax_twin(model, num_labels=3), optimizer, mesh)
    step = bj.make_train_step(graphdef, optimizer, mesh, precision="bf16")
    lowered = step.lower(state, bj.shard_batch(batch, mesh))
    one_hot = f"x{CONFIG.type_vocab_size}xf32>"  # the segment lookup, a one-hot product kept in float32
    matmuls = [line for line in lowered.as_text().splitlines() if "dot_general" in line and one_hot not in line]
    assert len(matmuls) > 10 and all("bf16" in line for line in matmuls)  # every other one, forward and backward
    new_state, metrics = lowered.out_info
    assert {p.dtype for p in jax.tree.leaves(new_state.params)} == {np.dtype(np.float32)}  # master weights
    assert {m.dtype for m in jax.tree.leaves(new_state.opt_state) if m.ndim} == {np.dtype(np.float32)}  # moments
    assert metrics["loss"].dtype == np.float32


def test_every_product_and_sum_of_the_step_runs_over_one_token_axis(optimizer):
    """The pretraining step's matrix products contract one axis and its sums over the tokens (the
    gradients of biases and norms) run over one: over (B, T) XLA's GPU compiler copied activations
    into transposed order first (BERT-base on an H200, one call: 552.4k tokens/s before, 613.7k after)."""
    model, batch = make_task("pretraining")
    batch["masked_positions"], batch["masked_labels"] = bj.prediction_slots(batch.pop("labels"))
    mesh = bj.make_mesh(jax.devices()[:1])
    graphdef, state = bj.init_train_state(jax_twin(model), optimizer, mesh)
    step = bj.make_train_step(graphdef, optimizer, mesh, precision="bf16")
    lines = step.lower(state, bj.shard_batch(batch, mesh)).as_text().splitlines()
    products = [line for line in lines if "stablehlo.dot_general" in line]
    contracted = [re.search(r"contracting_dims = \[([\d, ]*)\]", line).group(1) for line in products]
    assert len(products) > 20 and all("," not in axes for axes in contracted), [
        line.strip() for line, axes in zip(products, contracted) if "," in axes]
    sums = [line for line in lines if "stablehlo.reduce" in line and "stablehlo.add" in line]
    over_b_and_t = [line.strip() for line in sums
                    if re.search(r"across dimensions = \[0, 1\] : \(tensor<\d+x\d+x\d+x", line)]
    assert len(sums) > 20 and not over_b_and_t, over_b_and_t


def test_the_step_is_compiled_with_the_devices_compiler_options(monkeypatch):
    """make_train_step passes `compilation.compiler_options` (cuBLAS matrix products on GPUs) to XLA:
    an option XLA does not know, put in their place, fails the compilation by its name."""
    monkeypatch.setattr("bert_kit.jax.train.compiler_options", lambda platform: {"xla_no_such_option": True})
    optimizer = bj.create_optimizer(1e-3, weight_decay=0.0)
    model, batch = make_task("classification")
    mesh = bj.make_mesh(jax.devices()[:1])
    graphdef, state = bj.init_train_state(jax_twin(model, num_labels=3), optimizer, mesh)
    step = bj.make_train_step(graphdef, optimizer, mesh)
    with pytest.raises(Exception, match="xla_no_such_option"):
        step.lower(state, bj.shard_batch(batch, mesh)).compile()


@pytest.mark.slow
def test_the_loss_scale_moves_as_torchs_grad_scaler(monkeypatch):
    """fp16's scale: halved on overflow, doubled after GROWTH_INTERVAL finite steps (torch's own update)."""
    monkeypatch.setattr(bj.train, "GROWTH_INTERVAL", 3)
    assert float(bj.train.LossScale.initial(jnp.bfloat16).scale) == 1.0  # bf16 and fp32 do not scale
    scale = bj.train.LossScale.initial(jnp.float16)
    s, tracker = torch.tensor([2.0 ** 16]), torch.tensor([0], dtype=torch.int32)
    for finite in (1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1):
        scale = scale.update(jnp.asarray(bool(finite)))
        torch._amp_update_scale_(s, tracker, torch.tensor([float(not finite)]), 2.0, 0.5, 3)
        assert (float(scale.scale), int(scale.good_steps)) == (s.item(), tracker.item())
    assert s.item() == 2.0 ** 16  # it went down and up again
    with pytest.raises(ValueError, match="fp16, with its loss scaling: the engine"):
        bj.make_train_step(None, None, bj.make_mesh(jax.devices()[:1]), precision="fp16")


@pytest.mark.parametrize("kernels", [False, True])
def test_two_devices_give_the_losses_of_one(kernels):
    """With the Pallas kernels, each device runs them on its two rows (`fast_path.per_device`), told
    where its rows start: the dropout masks are the whole batch's, so the losses are one device's."""
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"}
    done = subprocess.run([sys.executable, "-m", "tests.jax.mesh_worker", *(["kernels"] if kernels else [])],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["devices"] == 2 and report["shards_2"] == 2 and report["rows_per_shard_2"] == 2
    if kernels:
        assert report["fast_path_2"] == "Pallas attention with dropout (interpreted), Pallas add & norm (interpreted)"
    one, two = np.array(report["losses_1"]), np.array(report["losses_2"])
    assert np.abs(one - two).max() <= 1e-5, (one, two)
    assert two[-1] < 0.85 * two[0], two  # and it trains


@pytest.mark.parametrize("kind, min_ratio", [("linear", 0.0), ("cosine", 0.1), ("constant", 0.0)])
def test_schedule_follows_torch_update_for_update(kind, min_ratio):
    steps = np.arange(0, 30)
    got = np.asarray(bj.lr_schedule(2e-3, 5, 25, kind, min_ratio)(steps))
    expected = [2e-3 * lr_multiplier(int(s), 5, 25, kind, min_ratio) for s in steps]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-12)


def test_weight_decay_skips_what_torch_skips():
    torch_model = BERTForPreTraining(CONFIG)
    abstract = nnx.eval_shape(lambda: bj.BERTForPreTraining(CONFIG))
    mask = bj.decay_mask(nnx.state(abstract, nnx.Param))
    skipped = {torch_name(path)[0] for path, decayed in nnx.to_flat_state(mask) if not decayed.get_value()}
    assert skipped == set(no_decay_names(torch_model))
    assert "bert.embeddings.norm.weight" in skipped and "mlm.decoder.bias" in skipped


def test_mlm_loss_at_prediction_slots_equals_the_full_loss_and_torch():
    from bert_kit.training.losses import compute_mlm_loss

    rng = np.random.default_rng(4)
    logits = rng.normal(size=(3, 7, 11)).astype(np.float32)
    labels = np.where(rng.random((3, 7)) < 0.4, rng.integers(0, 11, (3, 7)), -100)
    labels[1] = -100  # a row with nothing to predict
    positions, targets = bj.prediction_slots(labels)
    at_slots = np.take_along_axis(logits, positions[..., None], axis=1)  # (B, P, V)
    expected = compute_mlm_loss(torch.as_tensor(logits), torch.as_tensor(labels)).item()
    assert abs(float(bj.mlm_loss(logits, labels)) - expected) <= 1e-6
    assert abs(float(bj.mlm_loss(at_slots, targets)) - expected) <= 1e-6
    assert float(bj.mlm_loss(logits, np.full((3, 7), -100))) == 0.0  # nothing masked: 0, not NaN


def test_prediction_slots_line_up_with_the_labels():
    labels = np.full((3, 10), -100)
    labels[0, [1, 4, 9]] = [7, 8, 9]
    labels[2, 0] = 5
    positions, targets = bj.prediction_slots(labels)
    assert positions.shape == targets.shape == (3, 8)  # the most in a row (3), rounded up to 8
    assert targets[0, :3].tolist() == [7, 8, 9] and positions[0, :3].tolist() == [1, 4, 9]
    assert (targets[1] == -100).all() and targets[2, 0] == 5 and (targets[2, 1:] == -100).all()
    real = targets != -100
    assert (np.take_along_axis(labels, positions, 1)[real] == targets[real]).all()
    with pytest.raises(ValueError, match="3 masked tokens, more than the 2 prediction slots"):
        bj.prediction_slots(labels, slots=2)


def test_distributed_settings_come_from_the_environment():
    assert bj.distributed_settings({}) is None
    assert bj.distributed_settings({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert bj.distributed_settings({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
                                    "JAX_PROCESS_ID": "3"}) == {
        "coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 3}
    torchrun = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "RANK": "5",
                "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert bj.distributed_settings(torchrun) == {"coordinator_address": "node0:29500", "num_processes": 8,
                                                 "process_id": 5, "local_device_ids": [1]}
    assert bj.initialize_distributed({}) is False
