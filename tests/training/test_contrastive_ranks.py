"""In-batch negatives across ranks on CPU: 2 processes over gloo against 1 process on the whole batch.

Each rank holds half the rows of every column and takes the other rank's as negatives too
(`gather_with_grad`). The loss averaged over the ranks must equal the one-process loss on the
concatenated batch; each rank's gradient of its rows, averaged over the ranks as DDP averages the
weight gradients, that of the one-process loss; and through a model under DDP (a learned scale
included), uncached and with GradCache, the weight gradients after DDP's all-reduce equal the
one-process ones (1e-5, dropout off). Worker: contrastive_worker.py.

Run: .venv/bin/python -m pytest tests/training/test_contrastive_ranks.py -q
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from tests.training import contrastive_worker as worker

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
TOL = {"rtol": 1e-5, "atol": 1e-5}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    launcher = [str(TORCHRUN)] if TORCHRUN.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    proc = subprocess.run([*launcher, "--standalone", "--nproc_per_node=2", str(Path(worker.__file__)), str(out)],
                          env=ENV, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("excluded", [False, True])
@pytest.mark.parametrize("symmetric", [False, True])
def test_the_loss_and_gradients_of_the_vectors_are_those_of_the_whole_batch(two_ranks, symmetric, excluded):
    """excluded: known positives of an anchor on the other rank are left out as on one process."""
    got = json.loads((two_ranks / "vectors.json").read_text())[f"symmetric={symmetric}" + ",excluded" * excluded]
    whole = worker.vectors().requires_grad_()
    scale = torch.tensor(math.log(20.0), requires_grad=True)
    loss = worker.loss_of(whole.reshape(-1, worker.H), scale, symmetric, gather=False, excluded=excluded)
    loss.backward()
    assert got["loss"] == pytest.approx(loss.item(), rel=1e-6)
    ranks = torch.cat([torch.tensor(g) for g in got["grads"]], dim=1)  # (K, ROWS, H): rank 0's rows, then rank 1's
    assert_close(ranks / 2, whole.grad, **TOL)  # DDP's average over the 2 ranks
    assert got["scale_grad"] == pytest.approx(float(scale.grad), rel=1e-5)


@pytest.mark.parametrize("name", ["plain", "cached"])
def test_a_model_under_ddp_gets_the_gradients_of_one_process(two_ranks, name):
    got = json.loads((two_ranks / f"{name}.json").read_text())
    ids, mask = worker.batch()
    loss, want = worker.model_run(worker.tiny_model(), ids, mask, symmetric=True, gather=False, chunk=None)
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5)
    assert got["grads"].keys() == want.keys() and "logit_scale" in want
    for key in want:
        assert_close(torch.tensor(got["grads"][key]), torch.tensor(want[key]), **TOL, msg=key)
