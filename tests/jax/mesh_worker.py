"""Trains a tiny MLM + NSP model a few steps on a mesh of 1 device, then on a mesh of 2, from the same
weights and batch; prints the losses and how the batch was split, as JSON. With the argument
`kernels`, the model runs the Pallas kernels (interpreted), each device's on its rows of the batch.

Run by tests/jax/test_train.py in a process of its own, with
XLA_FLAGS=--xla_force_host_platform_device_count=2 (two CPU devices: the flag is read once, when
jax starts its CPU backend, so it cannot be set inside the test process).
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

import bert_kit.jax as bj
from tests.jax.common import padded_batch, random_model, tiny

STEPS = 10


def main() -> None:
    # dropout on: the masks must not depend on how the batch is split
    config = tiny(num_hidden_layers=1, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = random_model(bj.BERTForPreTraining, config)
    kernels = sys.argv[1:] == ["kernels"]
    T = 16 if kernels else 10  # the attention kernel takes powers of two
    batch = padded_batch(config, [T, 7, T, 4], T, seed=5)
    rng = np.random.default_rng(5)
    labels = np.where((rng.random(batch["input_ids"].shape) < 0.3) & (batch["attention_mask"] == 1),
                      batch["input_ids"], -100)
    positions, targets = bj.prediction_slots(labels, slots=8)
    batch = {**batch, "masked_positions": positions, "masked_labels": targets,
             "next_sentence_label": np.array([0, 1, 1, 0])}
    tx = bj.create_optimizer(bj.lr_schedule(2e-3, warmup_steps=1, total_steps=STEPS, kind="constant"))
    report = {"devices": len(jax.devices())}
    for n in (1, 2):
        mesh = bj.make_mesh(jax.devices()[:n])
        if kernels:
            from bert_kit.jax.kernels import fast_path
            from bert_kit.jax.kernels.flash_attention import Blocks
            from bert_kit.jax.kernels.residual_norm import Tiles

            report[f"fast_path_{n}"] = fast_path.apply(model, kernel="pallas", blocks=Blocks(16, 16, 16, 16),
                                                       tiles=Tiles(rows=8), mesh=mesh).summary
        graphdef, state = bj.init_train_state(model, tx, mesh, seed=0)
        step = bj.make_train_step(graphdef, tx, mesh)
        sharded = bj.shard_batch(batch, mesh)
        report[f"shards_{n}"] = len(sharded["input_ids"].addressable_shards)
        report[f"rows_per_shard_{n}"] = sharded["input_ids"].addressable_shards[0].data.shape[0]
        losses = []
        for _ in range(STEPS):
            state, metrics = step(state, sharded)
            losses.append(float(metrics["loss"]))
        report[f"losses_{n}"] = losses
    print(json.dumps(report))


if __name__ == "__main__":
    main()
