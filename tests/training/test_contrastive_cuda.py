"""GradCache on a GPU (training/grad_cache.py): what the CPU tests cannot reach.

* With dropout on, the replay restores the GPU's generator, so the cached gradients are those of
  the same mini-batches embedded once with autograd (fp32, 1e-4).
* Under bf16 autocast (as `precision: auto` trains on a GPU), the cached loss and gradients stay
  within bf16's error of the uncached ones.

Skipped without CUDA. Run on a GPU: .venv/bin/python -m pytest tests/training/test_contrastive_cuda.py -q
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from bert_kit.training.grad_cache import cached_loss
from tests.training.test_contrastive import embedder, gradients, loss_of, text_batch, tiny_encoder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def test_grad_cache_replays_the_gpu_dropout_masks():
    ids, mask = (t.to(CUDA) for t in text_batch(8))
    fn = loss_of(2)
    model = tiny_encoder(dropout=0.3).to(CUDA)
    torch.manual_seed(5)  # seeds the GPU's generator too
    embed = embedder(model, ids, mask, 3)
    loss = fn(torch.cat([embed(i) for i in range(3)]), None)  # autograd through all of them, in order
    loss.backward()
    want = gradients(model)
    model.zero_grad()
    torch.manual_seed(5)
    cached = cached_loss(embed, 3, fn, CUDA)
    cached.backward()
    assert_close(cached.detach(), loss.detach(), rtol=1e-5, atol=1e-5)
    for name, grad in gradients(model).items():
        assert_close(grad, want[name], rtol=1e-4, atol=1e-4, msg=name)


def test_grad_cache_under_bf16_autocast_is_the_uncached_loss():
    ids, mask = (t.to(CUDA) for t in text_batch(12))
    fn = loss_of(3)

    def run(chunk: int | None) -> tuple[torch.Tensor, dict]:
        model = tiny_encoder().to(CUDA)
        with torch.autocast("cuda", torch.bfloat16):
            if chunk is None:
                loss = fn(embedder(model, ids, mask, 12)(0).float(), None)
            else:
                loss = cached_loss(embedder(model, ids, mask, chunk), -(-12 // chunk), fn, CUDA)
        loss.backward()
        return loss.detach(), gradients(model)

    want_loss, want = run(None)
    got_loss, got = run(4)
    assert_close(got_loss, want_loss, rtol=2e-2, atol=2e-2)
    assert got.keys() == want.keys()
    for name in want:  # bf16 matmuls of different shapes: a few units of bf16's 2^-8 relative error
        assert_close(got[name], want[name], rtol=5e-2, atol=5e-3, msg=name)
