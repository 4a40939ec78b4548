"""The embedding task's settings that shape its loss, on engine=jax (CPU, two devices):

* `gather_across_ranks: false`: each device's block of a batch's examples is a batch of its own
  (its anchors against its own candidates), the loss the mean over the blocks: the torch engine's
  loss under DDP without gathering (each rank's MNRL, gradients averaged), here the torch engine
  in one process with its loss split into the same blocks;
* `scale: learned`: exp of a trained `logit_scale` (from log 20, at most 100, no weight decay),
  trained by AdamW with the encoder, written into the checkpoints where the torch engine writes
  it (model.safetensors, `logit_scale`) and read back on resume.

Run: .venv/bin/python -m pytest tests/jax/test_engine_contrastive_settings.py -q -n 0
"""

from __future__ import annotations

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402
from torch.testing import assert_close  # noqa: E402

from bert_kit.jax.tasks import ContrastiveHead, normalize, sharded_contrastive_loss  # noqa: E402
from bert_kit.jax.train import cast  # noqa: E402
from bert_kit.tasks.embedding import EmbeddingTask  # noqa: E402
from bert_kit.tasks.finetuning import finetune  # noqa: E402
from bert_kit.training.contrastive import known_positives, multiple_negatives_ranking_loss, pair_codes  # noqa: E402
from tests.jax.test_engine_embedding import embedding  # noqa: E402
from tests.jax.test_engine_finetune import assert_same_steps, records  # noqa: E402
from tests.jax.test_engine_tasks import encoder  # noqa: E402,F401  (a fixture)
from tests.tasks.test_embedding import nli  # noqa: E402,F401  (fixture: SNLI triplets, STS-B dev pairs)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("dims", [(), (8, 4)])
def test_each_block_of_examples_is_a_batch_of_its_own(symmetric, dims):
    """7 real tuples of 3 texts padded to 8 rows, in 2 blocks of 4 (the second holds 3 and the
    padding row): the loss and its gradient are the mean of torch's MNRL of each block's real rows.
    Anchor 1's known positive 12 is in its block (left out); anchor 0's, 15, in the other block (no
    candidate of anchor 0 here)."""
    rng = np.random.default_rng(0)
    k, B, real_rows, H, blocks = 3, 8, 7, 8, 2
    keys = np.array([list(range(7)), list(range(10, 17)), list(range(20, 27))])  # (k, real B) text ids
    pairs, texts = pair_codes([(i, 10 + i) for i in range(7)] + [(1, 12), (0, 15)])
    head = ContrastiveHead("embedding", pairs=pairs.numpy(), texts=texts)
    real = rng.normal(size=(k, real_rows, H)).astype(np.float32)
    real[1, 2] = real[0, 1] + 0.1 * real[1, 2]  # 12, close to anchor 1: leaving it out matters
    padded = np.concatenate([real, real[:, :1]], axis=1)  # (k, B, H)
    padded_keys = np.concatenate([keys.T, np.full((1, k), -1)])[None]  # (1, B, k)
    known = head.host_inputs({"keys": padded_keys})["known"][0]  # (B, (k - 1) B)
    is_real = np.arange(B) < real_rows
    exclude = lambda a, c: known_positives(a, c, pairs, texts)  # noqa: E731

    def torch_loss(c: torch.Tensor) -> torch.Tensor:
        def mnrl(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            return multiple_negatives_ranking_loss(x, 20.0, symmetric, False, exclude, ids)

        def at_widths(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            return sum(mnrl(torch.nn.functional.normalize(x[..., :d], dim=-1), ids) for d in dims) if dims \
                else mnrl(x, ids)

        ids = torch.from_numpy(keys)
        return (at_widths(c[:, :4], ids[:, :4]) + at_widths(c[:, 4:], ids[:, 4:])) / 2

    def loss(x):
        if dims:
            return sum(sharded_contrastive_loss(normalize(x[..., :d]), is_real, 20.0, blocks, symmetric, known)
                       for d in dims)
        return sharded_contrastive_loss(x, is_real, 20.0, blocks, symmetric, known)

    got, grad = jax.value_and_grad(loss)(jax.numpy.asarray(padded))
    c = torch.from_numpy(real).requires_grad_()
    expected = torch_loss(c)
    expected.backward()
    assert abs(float(got) - expected.item()) <= 1e-5, (float(got), expected.item())
    grad = np.array(grad)
    assert np.isfinite(grad).all() and not grad[:, real_rows:].any()  # the padding row takes no part
    assert_close(torch.from_numpy(grad[:, :real_rows]), c.grad, rtol=1e-4, atol=1e-6)
    whole = multiple_negatives_ranking_loss(torch.from_numpy(real), 20.0, symmetric)
    assert abs(float(whole) - expected.item()) > 1e-2  # the blocks see fewer negatives than the batch


def test_a_scalar_stays_float32_in_bf16_compute():
    params = {"kernel": jax.numpy.ones((2, 2)), "logit_scale": jax.numpy.asarray(math.log(20.0))}
    out = cast(params, jax.numpy.bfloat16)
    assert out["kernel"].dtype == jax.numpy.bfloat16 and out["logit_scale"].dtype == jax.numpy.float32


def split_torch_loss(monkeypatch, rows: int) -> None:
    """The torch engine's loss of a batch: the mean of its loss on each block of `rows` examples
    (the last may be shorter): what DDP without gathering averages, one rank a block."""
    original = EmbeddingTask.loss_of_vectors

    def per_block(self, columns, vectors, log_scale, keys=None):
        cols = vectors.view(columns, -1, vectors.shape[-1])  # (k, B, H)
        starts = range(0, cols.shape[1], rows)
        losses = [original(self, columns, cols[:, a:a + rows].reshape(-1, cols.shape[-1]), log_scale,
                           None if keys is None else keys[:, a:a + rows]) for a in starts]
        return sum(losses) / len(losses)

    monkeypatch.setattr(EmbeddingTask, "loss_of_vectors", per_block)


def test_each_devices_examples_are_their_own_negatives_as_torchs_ranks(encoder, nli, tmp_path, monkeypatch):
    """gather_across_ranks: false on two devices, triplets, symmetric, Matryoshka widths and a
    learned scale: batches of 12, 6 a device (the fourth batch's 8: 6 and 2), the torch engine's
    steps with its loss split into blocks of 6; not the steps of one batch of 12."""
    assert jax.device_count() == 2
    train, dev = nli
    group = {"no_duplicates": False, "gather_across_ranks": False, "loss": "symmetric", "scale": "learned",
             "matryoshka_dims": [32, 16]}
    settings = dict(train_file=str(train), validation_file=str(dev), max_train_examples=44, eval_every=0,
                    embedding=group)
    finetune(embedding(encoder, tmp_path / "jax", "jax", **settings))
    finetune(embedding(encoder, tmp_path / "gathered", "jax", **{**settings, "embedding": {
        **group, "gather_across_ranks": True}}))
    with monkeypatch.context() as patch:
        split_torch_loss(patch, 6)
        finetune(embedding(encoder, tmp_path / "torch", "torch", **settings))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    local, gathered = records(tmp_path / "jax", "train"), records(tmp_path / "gathered", "train")
    assert all(abs(local[s]["loss"] - gathered[s]["loss"]) > 1e-2 for s in local)


def test_a_learned_scale_takes_torchs_steps_and_resumes_from_the_checkpoint(encoder, nli, tmp_path):
    """scale: learned with GradCache: 2 JAX steps, then 2 more resumed from the checkpoint, take the
    torch engine's 4 steps; each checkpoint holds the learned `logit_scale` (no longer log 20) where
    the torch engine writes it, equal to the torch run's; best/ and final/ hold the encoder alone."""
    train, dev = nli
    settings = dict(train_file=str(train), validation_file=str(dev), max_train_examples=44, eval_every=0,
                    lr=1e-2, schedule="constant", warmup_steps=0,  # the same lr whether the run stops at 2
                    embedding={"no_duplicates": False, "scale": "learned", "cached": True,
                               "mini_batch_size": 10})
    finetune(embedding(encoder, tmp_path / "torch", "torch", **settings))
    finetune(embedding(encoder, tmp_path / "jax", "jax", **{**settings, "max_steps": 2}))
    at_2 = load_file(tmp_path / "jax" / "checkpoints" / "step-0000002" / "model.safetensors")["logit_scale"]
    assert abs(float(at_2) - math.log(20.0)) > 1e-3  # the scale moved: a resume from log 20 would differ
    finetune(embedding(encoder, tmp_path / "jax", "jax", **settings), resume="latest")
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    checkpoints = [run / "checkpoints" / "step-0000004" / "model.safetensors" for run in (tmp_path / "jax",
                                                                                            tmp_path / "torch")]
    got, expected = (load_file(path) for path in checkpoints)
    assert got.keys() == expected.keys() and "logit_scale" in got
    assert_close(got["logit_scale"], expected["logit_scale"], rtol=0, atol=1e-5)
    for name in got:  # (a key bias's gradient is 0 but for rounding, which Adam scales up to lr-sized steps)
        if not name.endswith("key.bias"):
            assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)
    for kept in ("best", "final"):
        folder = tmp_path / "jax" / kept
        if folder.is_dir():
            assert "logit_scale" not in load_file(folder / "model.safetensors")
