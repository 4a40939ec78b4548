"""Bad inputs: interruption and resume. A run folder belongs to one run; resuming with changed
settings does what the settings say (or stops, naming them); a stop sent to a whole process group
saves as one sent to the main process; results.json describes the whole run after a resume.

(Corrupt newest checkpoints are in test_model_folders.py; SIGKILL at random points, including in
the middle of a checkpoint write, with a bit-exact resume, in tests/training/test_checkpoint.py.)

Run: .venv/bin/python -m pytest tests/bad_inputs/test_interruption.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bert_kit.data import pretraining
from bert_kit.data.pretraining import (STOP_SIGNALS, DistributedResumableSampler, ResumableDataLoader,
                                      leave_stop_signals_to_the_main_process, stop_signals_blocked)
from bert_kit.training.checkpoint import list_checkpoints
from bert_kit.training.progress import read_metrics

pytestmark = pytest.mark.usefixtures("single_thread")
REPO = Path(__file__).resolve().parents[2]


def records(run: Path, kind: str = "train") -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run) if r["type"] == kind}


# ---- a run folder belongs to one run --------------------------------------------------------------

@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_a_fresh_run_into_a_used_folder_stops_and_names_the_way_out(cli, assets, tmp_path, command):
    config = assets.pretrain_yaml if command == "pretrain" else assets.finetune_yaml
    run = tmp_path / "run"
    assert cli(command, "--config", config, f"output_dir={run}").code == 0
    before = {p.name for p in list_checkpoints(run / "checkpoints")}
    lines = (run / "metrics.jsonl").read_text()
    out = cli(command, "--config", config, f"output_dir={run}", "max_steps=2")
    out.one_line_error(f"{run} already holds a run", "--resume latest", "overwrite=true", code=2)
    # nothing of the first run was pruned, appended to or replaced
    assert {p.name for p in list_checkpoints(run / "checkpoints")} == before
    assert (run / "metrics.jsonl").read_text() == lines


def test_overwrite_starts_over_with_nothing_of_the_old_run(cli, assets, tmp_path):
    run = tmp_path / "run"
    assert cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}").code == 0
    assert cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=2", "save_every=1",
               "overwrite=true").code == 0
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step-0000001", "step-0000002"]
    assert max(records(run)) == 2 and json.loads((run / "results.json").read_text())["steps"] == 2


def test_output_dir_that_is_a_file(cli, assets, tmp_path):
    (tmp_path / "run").write_text("not a folder")
    cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={tmp_path / 'run'}").one_line_error("run", code=2)


# ---- resuming with changed settings --------------------------------------------------------------

def interrupted_run(cli, assets, tmp_path: Path) -> Path:
    """The asset run's first 4 steps in a folder of its own, as a crash after step 4 leaves it (its
    step-6 checkpoint and results.json removed)."""
    run = assets.copy("run", tmp_path / "run")
    for p in list_checkpoints(run / "checkpoints"):
        if p.name == "step-0000006":
            import shutil

            shutil.rmtree(p)
    (run / "results.json").unlink()
    return run


def test_resume_with_a_new_lr_takes_it_and_says_so(cli, assets, tmp_path):
    run = interrupted_run(cli, assets, tmp_path)
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "lr=5e-4", "--resume", "latest")
    assert out.code == 0, out.err
    assert "resuming with changed settings: lr 0.001 -> 0.0005" in out.err
    original = records(assets.run)
    resumed = records(run)
    for step in (5, 6):  # the same schedule shape, half the peak
        assert resumed[step]["lr"] == pytest.approx(original[step]["lr"] / 2, rel=1e-9)
    assert (run / "run_config.yaml").read_text().count("lr: 0.0005") == 1


@pytest.mark.parametrize("change", ["batch_size=2", "max_length=16", "seed=1", "mask_probability=0.2"])
def test_resume_refuses_settings_that_shape_the_run(cli, assets, tmp_path, change):
    run = interrupted_run(cli, assets, tmp_path)
    key = change.split("=")[0]
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", change, "--resume", "latest")
    out.one_line_error("cannot resume", f"{key}:", "force_resume=true", code=2)
    assert max(records(run)) == 6  # untouched: the records of the lost steps are still there


def test_force_resume_takes_the_change(cli, assets, tmp_path):
    run = interrupted_run(cli, assets, tmp_path)
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "seed=1", "force_resume=true",
              "--resume", "latest")
    assert out.code == 0, out.err
    assert "seed 0 -> 1" in out.err


def test_extending_max_steps_continues_without_a_second_warmup(cli, assets, tmp_path):
    run = assets.copy("run", tmp_path / "run")
    first = records(run)
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=12", "--resume", "latest")
    assert out.code == 0, out.err
    assert "max_steps 6 -> 12" in out.err
    lrs = records(run)
    # the warmup (1% of 6 steps: 0 steps) is the first run's; the decay now ends at step 12
    assert [lrs[s]["lr"] for s in range(1, 7)] == [first[s]["lr"] for s in range(1, 7)]
    assert all(lrs[s + 1]["lr"] < lrs[s]["lr"] for s in range(7, 12))
    assert lrs[12]["lr"] == pytest.approx(1e-3 / 12, rel=1e-9)


# ---- results.json after a resume -----------------------------------------------------------------

def test_results_describe_the_whole_run_after_a_resume(cli, assets, tmp_path):
    run = interrupted_run(cli, assets, tmp_path)
    assert cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "--resume", "latest").code == 0
    whole = json.loads((assets.run / "results.json").read_text())
    resumed = json.loads((run / "results.json").read_text())
    assert resumed["steps"] == whole["steps"] == 6
    assert resumed["initial_train_mlm_loss"] == whole["initial_train_mlm_loss"]  # step 1, of the first session
    assert resumed["train_tokens"] == whole["train_tokens"]  # all 6 steps, not the last 2
    assert resumed["train_mlm_loss"] == pytest.approx(whole["train_mlm_loss"], rel=1e-5)


def test_resuming_after_metrics_were_deleted_says_so_and_results_say_what_they_cover(cli, assets, tmp_path):
    run = interrupted_run(cli, assets, tmp_path)
    (run / "metrics.jsonl").unlink()
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "--resume", "latest")
    assert out.code == 0, out.err
    warnings = [ln for ln in out.err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "metrics.jsonl holds 0 of the 4 train records up to step 4" in warnings[0], out.err
    results = json.loads((run / "results.json").read_text())
    assert results["metrics_complete"] is False and results["metrics_steps"] == [5, 6]
    assert results["train_tokens"] < json.loads((assets.run / "results.json").read_text())["train_tokens"]
    # resumed again, the gap is still known
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=8", "--resume", "latest")
    assert out.code == 0 and "2 of the 6 train records up to step 6" in out.err, out.err
    assert json.loads((run / "results.json").read_text())["metrics_complete"] is False


def test_a_complete_record_says_so(cli, assets, tmp_path):
    run = interrupted_run(cli, assets, tmp_path)
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "--resume", "latest")
    assert out.code == 0 and "warning:" not in out.err, out.err
    results = json.loads((run / "results.json").read_text())
    assert results["metrics_complete"] is True and results["metrics_steps"] == [1, 6]


# ---- resuming a finished run, rewinding one, contradicting settings ------------------------------

def test_resume_latest_of_a_finished_run_says_so_and_rewrites_nothing(cli, assets, tmp_path):
    """It re-evaluated and rewrote final/ and results.json without a word."""
    run = assets.copy("run", tmp_path / "run")
    before = {name: (run / name).read_bytes() for name in ("results.json", "metrics.jsonl", "run_config.yaml",
                                                             "final/model.safetensors")}
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "--resume", "latest")
    assert out.code == 0, out.err
    assert "the run finished at step 6" in out.err and "max_steps (or epochs) past step 6" in out.err, out.err
    assert {name: (run / name).read_bytes() for name in before} == before
    assert json.loads(out.out[out.out.index("{"):])["steps"] == 6  # its results, as they are


def test_resume_latest_of_a_fine_tune_that_finished_after_its_newest_checkpoint_is_refused(cli, assets, tmp_path):
    """A fine-tune keeps no end checkpoint: `latest` was its step-4 checkpoint, and the run trained
    step 5 again and replaced best/ of the finished run."""
    run = tmp_path / "ft"
    assert cli("finetune", "--config", assets.finetune_yaml, f"output_dir={run}", "max_steps=5").code == 0
    best = (run / "best" / "model.safetensors").read_bytes()
    out = cli("finetune", "--config", assets.finetune_yaml, f"output_dir={run}", "max_steps=5", "--resume", "latest")
    out.one_line_error("finished at step 5", "step-0000004", "train steps 5-5 again",
                       f"--resume {run / 'checkpoints' / 'step-0000004'}", code=2)
    assert (run / "best" / "model.safetensors").read_bytes() == best


def test_a_rewound_run_is_the_one_latest_follows(cli, assets, tmp_path):
    """Rewound to step 2 and run to step 4, `--resume latest` went on from step-0000006 of the run it
    had rewound."""
    run = assets.copy("run", tmp_path / "run")
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=4",
              "--resume", run / "checkpoints" / "step-0000002")
    assert out.code == 0, out.err
    assert f"rewinding {run} to step 2: removing step-0000004, step-0000006, results.json" in out.err, out.err
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step-0000002", "step-0000004"]
    assert json.loads((run / "results.json").read_text())["steps"] == 4
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=5", "--resume", "latest")
    assert out.code == 0, out.err
    assert f"resuming from {run / 'checkpoints' / 'step-0000004'} at step 4" in out.out
    assert sorted(records(run)) == [1, 2, 3, 4, 5]
    assert json.loads((run / "results.json").read_text())["steps"] == 5


def test_a_rewind_forgets_the_run_it_replaces_as_it_starts_and_a_refused_one_forgets_nothing(cli, assets, tmp_path):
    """The later checkpoints and results go when the rewound run starts (as its metrics.jsonl records
    after the step do): interrupted at once, `latest` is the checkpoint it started from."""
    run = assets.copy("run", tmp_path / "run")
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "nonsense_key=1",
              "--resume", run / "checkpoints" / "step-0000002")
    assert out.code == 2 and len(list_checkpoints(run / "checkpoints")) == 3  # a bad setting removes nothing
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=2",
              "--resume", run / "checkpoints" / "step-0000002")
    assert out.code == 0 and "the run finished" not in out.err, out.err
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step-0000002"]


def test_resume_with_overwrite_is_refused_before_anything_changes(cli, assets, tmp_path):
    """`--resume latest overwrite=true` resumed and ignored the overwrite."""
    run = assets.copy("run", tmp_path / "run")
    before = sorted(p.name for p in list_checkpoints(run / "checkpoints"))
    out = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "overwrite=true", "max_steps=8",
              "--resume", "latest")
    out.one_line_error("--resume latest continues the run", "overwrite=true would delete it", "overwrite=false",
                       code=2)
    assert sorted(p.name for p in list_checkpoints(run / "checkpoints")) == before and max(records(run)) == 6


# ---- a stop sent to the whole process group ------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_to_the_process_group_saves_with_dataloader_workers(assets, tmp_path, sig):
    """`timeout`, `scancel` and Ctrl-C signal every process of the group: the DataLoader workers
    leave the signal to the main process, which finishes its step, saves and exits 128 + signal."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "bert_kit", "pretrain", "--config", str(assets.pretrain_yaml),
                             f"output_dir={run}", "max_steps=100000", "num_workers=2", "save_every=0",
                             "eval_every=0", "log_every=1"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own process group, as a shell job
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").is_file() or len(records(run)) < 5:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.time() < deadline, "the run did not start"
            time.sleep(0.2)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = err.decode()
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err and "killed by signal" not in err, err[-2000:]
    saved = list_checkpoints(run / "checkpoints")
    assert len(saved) == 1 and int(saved[0].name[5:]) >= 5, (saved, err[-2000:])
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    assert json.loads((run / "results.json").read_text())["stopped"] == signal.Signals(sig).name
    assert (run / "loss_curve.png").is_file()  # the child drawing it is not in the group: the stop spares it


def _signalled_at_birth(worker_id: int) -> None:
    """A stop that reaches a worker before it has set its signal handlers (every epoch starts new
    workers, so a process-group signal can land in that window)."""
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    leave_stop_signals_to_the_main_process(worker_id)


def _record_worker(worker_id: int) -> None:
    """A caller's own worker_init_fn: it runs after the signals are settled."""
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & STOP_SIGNALS  # a later terminate() works


def test_a_worker_signalled_as_it_starts_survives_and_the_main_process_gets_the_signal(monkeypatch):
    received = []
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: received.append(sig))
    monkeypatch.setattr(pretraining, "leave_stop_signals_to_the_main_process", _signalled_at_birth)
    try:
        sampler = DistributedResumableSampler(12, shuffle=False)
        loader = ResumableDataLoader(list(range(12)), sampler, batch_size=4, num_workers=2,
                                     worker_init_fn=_record_worker)
        for _ in range(2):  # two epochs: two sets of new workers
            assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        with stop_signals_blocked():
            # held while workers start, delivered after; sent to this thread, since a signal sent to
            # the process may be taken by another thread that does not block it (the loaders' own)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
            assert received == []
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
