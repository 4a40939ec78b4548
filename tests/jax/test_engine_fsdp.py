"""`parallel: fsdp` on the JAX engine (2 CPU devices, tests/jax/conftest.py): the trained weights and
the optimizer state really are split over the devices (each device holds half of every array that
2 divides), and a pretraining and a fine-tuning run take the steps of the replicated run (ddp),
evaluate as it does and save the same folders; a run resumed from its checkpoint continues bit for bit.

Run: .venv/bin/python -m pytest tests/jax/test_engine_fsdp.py -q -n 0
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from jax.sharding import PartitionSpec as P  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from bert_kit.jax.engine import STATE_FILE, JaxEngine  # noqa: E402
from bert_kit.jax.sharding import fsdp_spec  # noqa: E402
from bert_kit.tasks.finetuning import finetune  # noqa: E402
from bert_kit.tasks.pretraining import pretrain  # noqa: E402
from bert_kit.training.checkpoint import latest_checkpoint  # noqa: E402
from tests.jax.common import tiny_engine  # noqa: E402
from tests.jax.test_engine import jax_config  # noqa: E402
from tests.jax.test_engine_finetune import config, encoder, records  # noqa: E402, F401 -- the fixture
from tests.tasks.test_pretraining import train_losses  # noqa: E402

TOLERANCE = 1e-5  # fp32: the gathers and reduce-scatters add in another order than the all-reduce


def test_each_array_is_split_on_its_largest_dimension_the_devices_divide():
    assert fsdp_spec((30522, 32), 2) == P("data", None)
    assert fsdp_spec((48, 64), 2) == P(None, "data")  # the largest
    assert fsdp_spec((64, 64), 2) == P("data", None)  # the first of equal ones
    assert fsdp_spec((32, 3), 2) == P("data", None)
    assert fsdp_spec((33, 64), 3) == P("data", None)  # 64 is larger, but 3 does not divide it
    assert fsdp_spec((3,), 2) == P() and fsdp_spec((), 2) == P() and fsdp_spec((1, 5), 2) == P()
    assert fsdp_spec((64, 64), 1) == P()


def engine_of(parallel: str) -> JaxEngine:
    """An engine over both CPU devices for a tiny 3-class classifier (its classifier bias, (3,), divides by no 2)."""
    return tiny_engine(3, parallel=parallel)


def test_fsdp_splits_the_weights_and_the_optimizer_state_over_the_devices(capsys):
    """Each device holds half of every weight and AdamW moment that 2 divides, after steps too; the
    steps' losses and the weights handed back to torch are the replicated engine's."""
    assert len(jax.devices("cpu")) == 2
    engines = {parallel: engine_of(parallel) for parallel in ("ddp", "fsdp")}
    assert "parallel: fsdp: weights and optimizer state sharded over 2 device(s)" in capsys.readouterr().out
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        ids = torch.randint(1, 40, (4, 10), generator=generator)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
                 "labels": torch.randint(0, 3, (4,), generator=generator)}
        for engine in engines.values():
            engine.step([batch], lr=1e-2)
    (ddp_losses, ddp_norm, _), (fsdp_losses, fsdp_norm, _) = (e.read_window() for e in engines.values())
    assert abs(fsdp_losses["loss"] - ddp_losses["loss"]) <= TOLERANCE and abs(fsdp_norm - ddp_norm) <= TOLERANCE

    state = engines["fsdp"].state
    split, whole = 0, 0
    for x in jax.tree.leaves((state.params, state.opt_state)):
        local = x.addressable_shards[0].data.shape
        if fsdp_spec(x.shape, 2) == P():
            assert local == x.shape and x.sharding.is_fully_replicated
            whole += x.ndim > 0
        else:
            assert x.sharding.spec == fsdp_spec(x.shape, 2) and np.prod(local) * 2 == np.prod(x.shape), x.shape
            split += 1
    assert split > 20 and whole == 3  # the bias (3,) in params and in each AdamW moment
    word_embeddings = state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert word_embeddings.addressable_shards[0].data.shape == (20, 16)  # (40, 16) over 2 devices
    assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(engines["ddp"].state.params))

    for engine in engines.values():
        engine.weights_to_torch()
    expected = engines["ddp"].model.state_dict()
    for name, value in engines["fsdp"].model.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=TOLERANCE, msg=name)


def assert_same_folders(a: Path, b: Path, atol: float) -> None:
    """model.safetensors (and a checkpoint's optimizer.safetensors) of two folders: the same arrays."""
    for name in ("model.safetensors", STATE_FILE):
        if not (b / name).is_file():
            continue
        got, expected = load_file(a / name), load_file(b / name)
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key].shape == value.shape and got[key].dtype == value.dtype, key
            np.testing.assert_allclose(got[key], value, rtol=0, atol=atol, err_msg=f"{name}: {key}")


def test_pretraining_with_fsdp_takes_the_replicated_runs_steps_and_resumes_bit_for_bit(tmp_path):
    """MLM + NSP with dropout and grad_accum 2: the fsdp run's losses, held-out metrics, checkpoints
    and final/ are the ddp run's; stopped after its step-2 checkpoint and resumed, it ends as the
    run that was never stopped."""
    settings = dict(max_steps=4, save_every=2, eval_every=2, grad_accum=2)
    results = {p: pretrain(jax_config(tmp_path, p, parallel=p, **settings)) for p in ("ddp", "fsdp")}
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    expected, got = train_losses(ddp), train_losses(fsdp)
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
    assert max(abs(got[s] - expected[s]) for s in expected) <= TOLERANCE, (got, expected)
    for step, record in records(ddp, "eval").items():
        assert abs(records(fsdp, "eval")[step]["mlm_loss"] - record["mlm_loss"]) <= TOLERANCE
    assert abs(results["fsdp"]["test_mlm_loss"] - results["ddp"]["test_mlm_loss"]) <= TOLERANCE
    assert [json.loads((run / "results.json").read_text())["parallel"] for run in (ddp, fsdp)] == ["ddp", "fsdp"]
    assert_same_folders(fsdp / "final", ddp / "final", TOLERANCE)
    assert_same_folders(latest_checkpoint(fsdp), latest_checkpoint(ddp), TOLERANCE)

    resumed = tmp_path / "resumed"
    pretrain(jax_config(tmp_path, "resumed", parallel="fsdp", **{**settings, "max_steps": 2}))
    assert latest_checkpoint(resumed).name == "step-0000002"
    pretrain(jax_config(tmp_path, "resumed", parallel="fsdp", **settings), resume="latest")
    again = train_losses(resumed)
    assert sorted(again) == [1, 2, 3, 4] and all(again[s] == got[s] for s in got), (again, got)
    assert_same_folders(resumed / "final", fsdp / "final", 0.0)
    assert_same_folders(latest_checkpoint(resumed), latest_checkpoint(fsdp), 0.0)


@pytest.fixture(scope="module")
def reviews(tmp_path_factory) -> tuple[Path, Path]:
    """A made-up two-class review set (train.tsv 44 rows, dev.tsv 16), the label in the words."""
    rng = random.Random(0)
    words = {0: "bad dull boring awful slow", 1: "good fun great lovely bright"}
    neutral = "the film plot actors scene music story was and a".split()
    folder = tmp_path_factory.mktemp("reviews")
    for name, n in (("train.tsv", 44), ("dev.tsv", 16)):
        rows = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randrange(2)
            text = rng.choices(neutral, k=rng.randrange(3, 20)) + rng.choices(words[label].split(), k=2)
            rng.shuffle(text)
            rows.append(f"{' '.join(text)}\t{label}")
        (folder / name).write_text("\n".join(rows) + "\n")
    return folder / "train.tsv", folder / "dev.tsv"


def test_finetuning_with_fsdp_takes_the_replicated_runs_steps(encoder, reviews, tmp_path, monkeypatch):  # noqa: F811
    """Under fsdp a fine-tune takes the replicated run's steps, in one program a step and, as a short
    GPU fine-tune (the CPU taken for a GPU), in two: the gradients reduce-scattered into the shards."""
    import bert_kit.jax.engine as engine_module

    train, dev = reviews
    files = dict(train_file=str(train), validation_file=str(dev), label_names=["negative", "positive"])
    for parallel in ("ddp", "fsdp"):
        finetune(config(encoder, tmp_path / parallel, "jax", parallel=parallel, **files))
    monkeypatch.setattr(engine_module, "SHORT_PLATFORMS", ("gpu", "cpu"))
    finetune(config(encoder, tmp_path / "fsdp-short", "jax", parallel="fsdp", **files))
    for run in ("fsdp", "fsdp-short"):
        got, expected = records(tmp_path / run, "train"), records(tmp_path / "ddp", "train")
        assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
        for step, record in expected.items():
            assert abs(got[step]["loss"] - record["loss"]) <= TOLERANCE, (run, step, got[step], record)
            assert abs(got[step]["grad_norm"] - record["grad_norm"]) <= TOLERANCE * max(1.0, record["grad_norm"])
        got, expected = records(tmp_path / run, "eval"), records(tmp_path / "ddp", "eval")
        assert sorted(got) == sorted(expected) == [2, 4]
        for step, record in expected.items():
            assert abs(got[step]["loss"] - record["loss"]) <= TOLERANCE and got[step]["accuracy"] == record["accuracy"]
        assert_same_folders(tmp_path / run / "best", tmp_path / "ddp" / "best", TOLERANCE)
        assert_same_folders(latest_checkpoint(tmp_path / run), latest_checkpoint(tmp_path / "ddp"), TOLERANCE)
