"""Distributed training on CPU: 2 processes over gloo against 1 process, DDP and FSDP2.

* Equality with one process is checked at the level of training steps on fixed batches
  (`dist_worker.train_fixed`): 2 ranks each take their half of every global micro-batch, one
  process takes it whole. A full `pretrain` run cannot match a 1-process run exactly: each rank
  masks its own batch (a mask depends on the batch it is drawn for) and DDP averages the ranks'
  mean losses, which equals the global mean only when every rank holds as many masked tokens.
  The fixed batches mask 3 tokens in every row, so the two are the same computation and
  must agree to float32 rounding. That the pipeline feeds each rank the matching half of the
  1-process batch is checked separately, on the real loader (`make_loader`).
* The command line runs under torchrun (`--standalone --nproc_per_node=2`). To see what the
  surviving rank itself does when its peer dies or hangs, the failure runs start the two ranks
  as plain processes with torchrun's environment variables: torchrun's agent would also kill
  the survivor, hiding whether it would have exited on its own.

Run: .venv/bin/python -m pytest tests/training/test_distributed.py -q
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.training import dist_worker
from bert_kit.training.checkpoint import load_trainer_state, resume_position
from bert_kit.data.corpus import StreamingTextDataset
from bert_kit.data.pretraining import DistributedResumableSampler
from bert_kit.training.progress import read_metrics
from bert_kit.training.runconfig import save_config
from tests.tasks.test_pretraining import tiny_config

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]
WORKER = str(Path(__file__).with_name("dist_worker.py"))
TORCHRUN = Path(sys.executable).with_name("torchrun")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
TOL = {"rtol": 0, "atol": 1e-5}


def torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    launcher = [str(TORCHRUN)] if TORCHRUN.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    proc = subprocess.run([*launcher, "--standalone", "--nproc_per_node=2", *args], env=ENV, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def losses_of(folder: Path) -> dict[int, float]:
    return {int(k): v for k, v in json.loads((folder / "result.json").read_text())["losses"].items()}


def assert_same_run(run: Path, reference: Path, steps: range) -> None:
    """Losses at `steps` and final weights of `run` equal those of `reference` (1e-5)."""
    got, want = losses_of(run), losses_of(reference)
    assert sorted(got) == list(steps)
    torch.testing.assert_close(torch.tensor([got[s] for s in steps]), torch.tensor([want[s] for s in steps]), **TOL)
    a, b = load_file(run / "final" / "model.safetensors"), load_file(reference / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], **TOL, msg=k)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """One process trains the fixed batches (checkpoint at step 10); then 2 ranks do it with DDP
    and FSDP2, straight and resumed from that checkpoint, and record one epoch of their data."""
    out = tmp_path_factory.mktemp("fixed")
    dist_worker.train_fixed(out / "one")
    (out / "lines.txt").write_text("".join(f"line {i}\n" for i in range(23)))
    torchrun(WORKER, "steps", str(out), str(out / "one" / "checkpoints" / "step-0000010"))
    return out


@pytest.mark.slow
@pytest.mark.xdist_group("distributed_runs")  # one worker builds `runs` once (tests/conftest.py)
def test_ddp_and_fsdp_on_two_ranks_match_one_process(runs):
    init = dist_worker.tiny_model().state_dict()
    final = load_file(runs / "one" / "final" / "model.safetensors")
    # the comparison means something: training moved the weights well beyond the tolerance
    embeddings = "bert.embeddings.word_embeddings.weight"
    assert (final[embeddings] - init[embeddings]).abs().max() > 1e-2
    for parallel in ("ddp", "fsdp", "own"):
        assert_same_run(runs / parallel, runs / "one", range(1, 21))
    # no_sync: one gradient all-reduce per optimizer step, none for the first of 2 micro-batches
    assert json.loads((runs / "ddp" / "result.json").read_text())["allreduce_calls"] == dist_worker.STEPS


@pytest.mark.slow
@pytest.mark.xdist_group("distributed_runs")
def test_a_trainer_that_reduces_its_own_gradients_stops_every_rank_at_a_nan_of_one(runs):
    """The bare model under torchrun (what CUDA-graph steps use instead of DDP): the losses are
    averaged with the gradients, so rank 1's NaN stops rank 0 too, at the same step."""
    stopped = json.loads((runs / "nonfinite.json").read_text())
    assert [s["step"] for s in stopped] == [3, 3], stopped
    assert all("loss=nan" in s["message"] for s in stopped), stopped


@pytest.mark.slow
@pytest.mark.xdist_group("distributed_runs")
def test_checkpoints_move_between_one_and_two_ranks(runs, tmp_path):
    # 1 -> 2: the one-process checkpoint of step 10, continued by 2 ranks (DDP and FSDP2)
    for parallel in ("ddp", "fsdp"):
        assert_same_run(runs / f"{parallel}-resumed", runs / "one", range(11, 21))
    # 2 -> 1: checkpoints written by 2 ranks, continued by one process
    for parallel in ("ddp", "fsdp"):
        checkpoint = runs / parallel / "checkpoints" / "step-0000010"
        dist_worker.train_fixed(tmp_path / parallel, resume=checkpoint)
        assert_same_run(tmp_path / parallel, runs / "one", range(11, 21))
        # the single-process format: HF weights and an index-keyed optimizer state
        state, one = load_trainer_state(checkpoint), load_trainer_state(runs / "one" / "checkpoints" / "step-0000010")
        n_params = len(list(dist_worker.tiny_model().parameters()))  # the tied decoder weight counted once
        assert sorted(state["optimizer"]["state"]) == sorted(one["optimizer"]["state"]) == list(range(n_params))
        assert len(state["rng_ranks"]) == 2
        for i in range(n_params):
            got, want = state["optimizer"]["state"][i], one["optimizer"]["state"][i]
            torch.testing.assert_close(got["exp_avg"], want["exp_avg"], **TOL)


@pytest.mark.slow
@pytest.mark.xdist_group("distributed_runs")
def test_every_example_is_seen_once_per_epoch_across_ranks(runs):
    rank0, rank1 = json.loads((runs / "epochs.json").read_text())
    # map-style, pretrain's own loader: per step, the two ranks' batches of 3 are together the
    # 1-process batch of 6, and over the epoch the 48 examples are each seen once
    from types import SimpleNamespace

    from bert_kit.tasks.pretraining import PretrainConfig, make_loader

    tokenizer = SimpleNamespace(pad_token_id=0, mask_token_id=4, vocab_size=1000, special_token_ids=frozenset(range(5)))
    examples = [{"input_ids": torch.tensor([2, 100 + i, 3])} for i in range(48)]
    single = [sorted((torch.where(b["labels"] != -100, b["labels"], b["input_ids"])[:, 1] - 100).tolist())
              for b in make_loader(PretrainConfig(seed=3), examples, tokenizer, 6, True, torch.device("cpu"))]
    assert len(rank0["map"]) == len(rank1["map"]) == len(single) == 8
    assert [sorted(a + b) for a, b in zip(rank0["map"], rank1["map"])] == single
    seen = [i for batch in rank0["map"] + rank1["map"] for i in batch]
    assert sorted(seen) == list(range(48))
    # streaming: the dataset takes its shard from the process group
    assert not set(rank0["stream"]) & set(rank1["stream"])
    assert sorted(rank0["stream"] + rank1["stream"]) == sorted(f"line {i}" for i in range(23))

    # the sampler for other world sizes: padded (every example at least once, the padding at
    # most world_size - 1 repeats) or cut (drop_last: each at most once, all but < world_size)
    for world, drop_last in ((3, False), (3, True), (4, False)):
        shards = [DistributedResumableSampler(50, seed=1, rank=r, world_size=world, drop_last=drop_last)
                  for r in range(world)]
        seen = [i for s in shards for i in s]
        assert len({len(list(s)) for s in shards}) == 1  # equal shares: ranks step in lockstep
        assert len(set(seen)) == (50 - 50 % world if drop_last else 50)
        assert len(seen) - len(set(seen)) == (0 if drop_last else -50 % world)
    # streaming with DataLoader workers inside each of 2 ranks: 4 shards, each line once
    lines = []
    for r in range(2):
        stream = StreamingTextDataset(runs / "lines.txt", mode="line", buffer_size=3, rank=r, world_size=2)
        lines += list(torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2))
    assert sorted(lines) == sorted(f"line {i}" for i in range(23))
    # resuming with another global micro-batch skips the same number of sequences
    saved = {"loader": {"epoch": 1, "batch_index": 6}, "global_micro_batch": 6}
    assert resume_position(saved, 12) == {"epoch": 1, "batch_index": 3}
    assert resume_position(saved, 3) == {"epoch": 1, "batch_index": 12}


# ---- the command line under torchrun, and failures ----------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_faulty(tmp_path: Path, name: str, kind: str, at_step: int, *argv: str) -> tuple[list[int], str, float]:
    """Start 2 ranks as plain processes (torchrun's environment, no agent) with rank 1 failing
    at `at_step`; return (exit codes, rank 0's stderr, seconds from rank 1's failure (die) or
    from its stall to rank 0's exit)."""
    port, procs, logs = free_port(), [], []
    for r in range(2):
        logs.append(open(tmp_path / f"{name}-rank{r}.err", "w+"))
        env = {**ENV, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, WORKER, "fault", kind, str(at_step), *argv], env=env,
                                      cwd=REPO, stdout=subprocess.DEVNULL, stderr=logs[r]))
    try:
        deadline, failed_at = time.time() + 150, None  # a hang: past any dist_timeout_s used here
        while procs[0].poll() is None:
            assert time.time() < deadline, "rank 0 hangs after its peer failed"
            if failed_at is None and f"{kind} at step" in (tmp_path / f"{name}-rank1.err").read_text():
                failed_at = time.time()
            time.sleep(0.05)
        waited = time.time() - (failed_at or time.time())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in logs:
            f.close()
    return [p.returncode for p in procs], (tmp_path / f"{name}-rank0.err").read_text(), waited


@pytest.mark.slow
def test_torchrun_cli_survives_a_dead_and_a_stalled_rank(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=8, grad_accum=2, save_every=2, eval_every=4, log_every=1)
    save_config(cfg, tmp_path / "run.yaml")
    straight = tmp_path / "straight"
    out = torchrun("-m", "bert_kit", "pretrain", "--config", str(tmp_path / "run.yaml"), f"output_dir={straight}")
    # rank 0 alone prints, logs and writes; the log states the global batch
    assert out.stdout.count('"train_mlm_loss"') == 1
    assert "global batch 16 sequences (batch 4 x grad_accum 2 x 2 rank(s))" in out.stderr
    train = [r for r in read_metrics(straight) if r["type"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 9)) and train[0]["global_batch"] == 16
    assert (straight / "final" / "model.safetensors").is_file() and (straight / "loss_curve.png").is_file()

    run = tmp_path / "run"
    argv = ["pretrain", "--config", str(tmp_path / "run.yaml"), f"output_dir={run}"]
    # rank 1 dies at step 3: rank 0 sees the connection drop and exits at once, with one line
    codes, err, waited = run_faulty(tmp_path, "die", "die", 3, *argv, "dist_timeout_s=60")
    assert codes == [1, 3], err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("bert-kit pretrain: error: rank 0 of 2: lost the other ranks"), err[-2000:]
    assert "--resume latest" in last and waited < 45  # at once: long before dist_timeout_s (60 s)
    # resumed, rank 1 hangs at step 5: rank 0 gives up after dist_timeout_s (8 s), not never
    codes, err, waited = run_faulty(tmp_path, "stall", "stall", 5, *argv, "dist_timeout_s=8", "--resume", "latest")
    assert codes[0] == 1, err[-2000:]
    assert "rank 0 of 2: lost the other ranks" in err and "dist_timeout_s=8" in err
    assert 5 < waited < 120  # after the timeout, not never (a busy machine only adds to it)
    assert load_trainer_state(run / "checkpoints" / "step-0000004")["step"] == 4
    # and the run resumes from its last checkpoint, now sharded with FSDP2, ending where the
    # uninterrupted run ended: same per-rank dropout streams and data positions
    torchrun("-m", "bert_kit", *argv, "parallel=fsdp", "--resume", "latest")
    assert json.loads((run / "results.json").read_text())["parallel"] == "fsdp"
    got = {r["step"]: r["loss"] for r in read_metrics(run) if r["type"] == "train"}
    want = {r["step"]: r["loss"] for r in train}
    assert sorted(got) == list(range(1, 9))
    steps = range(1, 9)
    torch.testing.assert_close(torch.tensor([got[s] for s in steps]), torch.tensor([want[s] for s in steps]), **TOL)
    a, b = load_file(run / "final" / "model.safetensors"), load_file(straight / "final" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], **TOL, msg=k)


@pytest.mark.slow
def test_a_time_budget_gives_every_rank_the_same_learning_rates(tmp_path):
    """The schedule of a time budget runs on the clock, and each rank's clock differs (here rank
    1's run started 3 s earlier): the ranks share one clock, so their lr and weights stay alike.
    Each rank runs on a fake clock (a step takes 0.25 s), so the machine's speed does not matter."""
    cfg = tiny_config(tmp_path, max_steps=None, time_budget="15s", warmup_fraction=0.2, eval_every=0,
                      save_every=0, log_every=1)
    save_config(cfg, tmp_path / "run.yaml")
    torchrun(WORKER, "skewed-clock", str(tmp_path), "pretrain", "--config", str(tmp_path / "run.yaml"))
    lrs = [json.loads((tmp_path / f"lrs-rank{r}.json").read_text()) for r in (0, 1)]
    assert len(lrs[0]) > 5 and lrs[0] == lrs[1]
    assert len(lrs[0]) > 20 and max(lrs[0]) > 5 * min(lrs[0])  # the schedule warmed up and decayed
