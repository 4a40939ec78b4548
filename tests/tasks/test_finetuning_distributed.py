"""`bert-kit finetune` under torchrun on CPU: 2 processes over gloo, and their checkpoint in 1 process.

* A 2-rank SST-2 classification run (DDP, 48 training rows, 25 validation rows) through the
  command line: rank 0 alone prints, logs and writes results.json, best/ and the checkpoints,
  whose data position is counted in examples (`global_micro_batch`).
* Its step-2 checkpoint, continued by one process with batch_size 4 x grad_accum 2 (the same
  global batch of 8), is the same computation as the rest of the 2-rank run: dropout is off and
  every loss is a mean over 4 examples. So the resumed run must reach the same weights, train
  losses and validation metrics (1e-5). That checks the converted data position (batch 2 of 2
  ranks is batch 4 of one process) and that the validation set, split over the 2 ranks with an
  odd number of rows, is gathered complete and in order.
* A rank that dies mid-run ends the other with one line and exit code 1.

Run: .venv/bin/python -m pytest tests/tasks/test_finetuning_distributed.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bert_kit.training.checkpoint import load_trainer_state
from bert_kit.config import BertConfig
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.model import BERTModel
from bert_kit.training.progress import read_metrics
from bert_kit.training.runconfig import save_config
from bert_kit.tokenizer import get_tokenizer

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
TOL = {"rtol": 0, "atol": 1e-5}
# dropout off: 2 ranks (own dropout streams) and 1 process then compute the same steps
TINY = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.xdist_group("finetuning_distributed"),
              pytest.mark.slow]  # one worker runs the module's torchrun fixture, first


@pytest.fixture(scope="module")
def setup(tmp_path_factory, minilm_path, data_dir) -> dict[str, Path]:
    """A random tiny encoder folder (MiniLM's tokenizer) and SST-2 train (48 rows) / dev (25 rows)."""
    folder = tmp_path_factory.mktemp("ft_dist")
    torch.manual_seed(0)
    BERTModel(TINY).save_pretrained(folder / "tiny")
    get_tokenizer(minilm_path).save(folder / "tiny")
    for name, n in (("train.tsv", 48), ("dev.tsv", 25)):
        lines = (data_dir / "sst2" / name).read_text().splitlines()
        (folder / name).write_text("\n".join(lines[: n + 1]) + "\n")
    return {"root": folder, "model": folder / "tiny", "train": folder / "train.tsv", "dev": folder / "dev.tsv"}


def config(setup: dict[str, Path], output_dir: Path, **kw) -> FinetuneConfig:
    settings = dict(task="classification", model=str(setup["model"]), train_file=str(setup["train"]),
                    validation_file=str(setup["dev"]), output_dir=str(output_dir), batch_size=4, eval_batch_size=4,
                    max_steps=8, eval_every=4, save_every=2, keep_last=0, lr=1e-3, log_every=1, precision="fp32",
                    device="cpu", seed=3, max_length=64, label_names=["negative", "positive"])
    return FinetuneConfig(**{**settings, **kw})


def torchrun(*args: str) -> subprocess.CompletedProcess:
    launcher = [str(TORCHRUN)] if TORCHRUN.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    proc = subprocess.run([*launcher, "--standalone", "--nproc_per_node=2", *args], env=ENV, cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def two_ranks(setup) -> tuple[Path, subprocess.CompletedProcess]:
    run = setup["root"] / "two"
    save_config(config(setup, run), setup["root"] / "run.yaml")
    return run, torchrun("-m", "bert_kit", "finetune", "--config", str(setup["root"] / "run.yaml"))


def test_two_ranks_log_and_write_once(two_ranks):
    run, proc = two_ranks
    # one summary on stdout, one start line naming the ranks and the global batch (4 x 2 ranks)
    assert proc.stdout.count('"best_value"') == 1, proc.stdout
    start = [line for line in proc.stdout.splitlines() if line.startswith("task classification:")]
    assert len(start) == 1 and "global batch 8" in start[0] and "2 ranks (DDP)" in start[0], proc.stdout
    # 48 rows over 2 ranks of batch 4: 6 steps an epoch; 8 steps, one line each in metrics.jsonl
    # (read raw: read_metrics would hide a second rank's copies) and one message per evaluation
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "train"] == list(range(1, 9))
    assert [r["step"] for r in records if r["type"] == "eval"] == [4, 8]
    assert proc.stderr.count("step 4: accuracy") == 1 and proc.stderr.count("step 8: saved") == 1
    results = json.loads((run / "results.json").read_text())
    assert results["world_size"] == 2 and results["parallel"] == "ddp"
    assert results["steps"] == 8 and results["epochs"] == pytest.approx(8 / 6, abs=1e-3)
    assert results["wall_time_s"] > 0  # set by rank 0 only, just before it writes the file
    assert [h["step"] for h in results["history"]] == [4, 8] and results["num_eval_examples"] == 25
    # every validation row was scored once: the counts of the report add up to the 25 rows
    assert all(h["num_examples"] == 25 for h in results["history"])
    assert results["best_value"] == max(h["accuracy"] for h in results["history"])
    # best/ is a complete HF folder, swapped in atomically (no leftovers)
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("best")) == ["best"]
    best = BERTForSequenceClassification.from_pretrained(run / "best")
    assert best.num_labels == 2 and (run / "best" / "tokenizer.json").is_file()
    # checkpoints: rank 0's file, every rank's RNG state, the position in examples
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step-{s:07d}" for s in (2, 4, 6, 8)]
    state = load_trainer_state(run / "checkpoints" / "step-0000002")
    assert len(state["rng_ranks"]) == 2
    assert state["data"] == {"loader": {"epoch": 0, "batch_index": 2}, "world_size": 2, "global_micro_batch": 8}


def test_two_rank_checkpoint_resumes_in_one_process(setup, two_ranks, tmp_path):
    run, _ = two_ranks
    one = tmp_path / "one"
    resumed = finetune(config(setup, one, grad_accum=2), resume=str(run / "checkpoints" / "step-0000002"))
    assert resumed["steps"] == 8 and resumed["world_size"] == 1 and resumed["parallel"] is None

    # the weights after step 8 are those of the 2-rank run; training moved them well beyond 1e-5
    a, b = load_file(run / "checkpoints" / "step-0000008" / "model.safetensors"), \
        load_file(one / "checkpoints" / "step-0000008" / "model.safetensors")
    start = load_file(run / "checkpoints" / "step-0000002" / "model.safetensors")
    assert a.keys() == b.keys()
    assert (a["classifier.weight"] - start["classifier.weight"]).abs().max() > 1e-3
    for k in a:
        torch.testing.assert_close(b[k], a[k], **TOL, msg=k)

    # steps 3-8 have the same (rank-averaged) train losses
    def losses(folder: Path) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in read_metrics(folder) if r["type"] == "train"}

    got, want = losses(one), losses(run)
    assert sorted(got) == list(range(3, 9))
    torch.testing.assert_close(torch.tensor([got[s] for s in range(3, 9)]),
                               torch.tensor([want[s] for s in range(3, 9)]), **TOL)

    # the evaluation split over 2 ranks gathered every row in order: same metrics as one process
    two = json.loads((run / "results.json").read_text())["history"]
    assert [h["step"] for h in resumed["history"]] == [4, 8]
    for mine, theirs in zip(resumed["history"], two):
        assert mine["accuracy"] == theirs["accuracy"] and mine["num_examples"] == 25
        assert mine["loss"] == pytest.approx(theirs["loss"], abs=1e-5)


def test_a_dead_rank_ends_the_other_with_one_line(setup, tmp_path):
    """Rank 1 exits without a word at step 2 (as an OOM kill): rank 0 reports it and exits 1."""
    from tests.training.test_distributed import run_faulty

    cfg = config(setup, tmp_path / "run", max_steps=4, eval_every=0, save_every=0, validation_file=None)
    save_config(cfg, tmp_path / "run.yaml")
    codes, err, waited = run_faulty(tmp_path, "die", "die", 2, "finetune", "--config", str(tmp_path / "run.yaml"),
                                    "dist_timeout_s=60")
    assert codes == [1, 3], err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("bert-kit finetune: error: rank 0 of 2: lost the other ranks"), err[-2000:]
    assert "--resume latest" in last and waited < 20
