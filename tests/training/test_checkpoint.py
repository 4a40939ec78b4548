"""Checkpoints: exact round trip of every piece of training state, atomic writes that survive
`kill -9`, pruning to the last K.

Run: .venv/bin/python -m pytest tests/training/test_checkpoint.py -q
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_kit.training.checkpoint import (STATE_FILE, checkpoint_writer, latest_checkpoint, list_checkpoints,
                                          load_checkpoint, load_trainer_state, resolve_checkpoint, save_checkpoint)
from bert_kit.config import BertConfig
from bert_kit.heads import BERTForPreTraining
from bert_kit.training.optim import create_optimizer, create_scheduler

torch.set_num_threads(1)  # tiny tensors: threads only add contention on a shared machine
REPO = Path(__file__).resolve().parents[2]


def tiny_config() -> BertConfig:
    return BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=16)


def train_steps(model, opt, sched, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        ids = torch.randint(5, 40, (4, 12), generator=g)
        labels = torch.where(torch.rand(4, 12, generator=g) < 0.3, ids, torch.full_like(ids, -100))
        labels[0, 1] = ids[0, 1]  # at least one masked token
        mlm, nsp = model(ids, labels=labels)
        loss = torch.nn.functional.cross_entropy(mlm, labels[labels != -100]) + nsp.square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()


def test_round_trip_restores_weights_optimizer_schedule_scaler_and_rng(tmp_path):
    torch.manual_seed(0)
    model = BERTForPreTraining(tiny_config())
    opt = create_optimizer(model, "adamw", lr=1e-3)
    sched = create_scheduler(opt, 2, 10)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)  # an fp16 scaler with non-default state
    train_steps(model, opt, sched, 3)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    path = save_checkpoint(tmp_path, 3, model, optimizer=opt, scheduler=sched, scaler=scaler,
                           data_state={"phase": 0, "loader": {"epoch": 1, "batch_index": 2}},
                           run_config={"lr": 1e-3, "files": ["a.txt"]})
    assert path == tmp_path / "step-0000003" and (path / STATE_FILE).is_file()
    draws = (torch.rand(3), random.random(), np.random.rand())

    torch.manual_seed(99)  # a different init and RNG stream, then restore everything
    model2 = BERTForPreTraining(tiny_config())
    opt2 = create_optimizer(model2, "adamw", lr=1e-3)
    sched2 = create_scheduler(opt2, 2, 10)
    scaler2 = torch.amp.GradScaler("cpu")
    state = load_checkpoint(path, model2, optimizer=opt2, scheduler=sched2, scaler=scaler2)
    torch.testing.assert_close(torch.rand(3), draws[0], rtol=0, atol=0)
    assert (random.random(), np.random.rand()) == draws[1:]
    assert state["step"] == 3 and state["data"] == {"phase": 0, "loader": {"epoch": 1, "batch_index": 2}}
    assert state["run_config"] == {"lr": 1e-3, "files": ["a.txt"]}
    assert sched2.last_epoch == 3 and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert scaler2.get_scale() == 512.0
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    # the restored optimizer, schedule and weights continue exactly as the originals
    # (one global RNG serves both models here, so reseed it for equal dropout masks)
    torch.manual_seed(1)
    train_steps(model, opt, sched, 2, seed=1)
    torch.manual_seed(1)
    train_steps(model2, opt2, sched2, 2, seed=1)
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    # the folder is also an ordinary model folder
    loaded = BERTForPreTraining.from_pretrained(path)
    for k, v in loaded.state_dict().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0, msg=k)


def test_latest_ignores_tmp_leftovers_and_keep_last_prunes(tmp_path):
    torch.manual_seed(0)
    model = BERTForPreTraining(tiny_config())
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000003", "step-0000004"]
    # a crashed write of step 5: folder without the state file, and a .tmp folder
    (tmp_path / "step-0000005.tmp").mkdir()
    (tmp_path / "step-0000005.tmp" / "model.safetensors").write_bytes(b"half")
    assert latest_checkpoint(tmp_path).name == "step-0000004"
    assert latest_checkpoint(tmp_path.parent / "nothing-here") is None
    # a run folder works too (checkpoints/ below it)
    run_dir = tmp_path / "run"
    save_checkpoint(run_dir / "checkpoints", 7, model)
    assert resolve_checkpoint("latest", run_dir).name == "step-0000007"
    assert resolve_checkpoint(run_dir).name == "step-0000007"
    # saving again prunes leftovers; saving an existing step replaces it
    save_checkpoint(tmp_path, 4, model, keep_last=2)
    assert not (tmp_path / "step-0000005.tmp").exists()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000003", "step-0000004"]


def test_a_checkpoint_written_in_the_background_is_the_one_written_at_once(tmp_path):
    torch.manual_seed(0)
    model = BERTForPreTraining(tiny_config())
    opt = create_optimizer(model, "adamw", lr=1e-3)
    train_steps(model, opt, create_scheduler(opt, 2, 10), 2)
    at_once = load_trainer_state(save_checkpoint(tmp_path / "a", 2, model, optimizer=opt))
    writer = checkpoint_writer(tmp_path / "b", 2, model, optimizer=opt)
    torch.rand(5)  # the run goes on drawing random numbers while the checkpoint is written
    background = load_trainer_state(writer.result())
    torch.testing.assert_close(background["rng"]["torch"], at_once["rng"]["torch"], rtol=0, atol=0)  # of its start
    assert background["optimizer"]["param_groups"] == at_once["optimizer"]["param_groups"]
    assert (tmp_path / "a" / "step-0000002" / "model.safetensors").read_bytes() == \
        (tmp_path / "b" / "step-0000002" / "model.safetensors").read_bytes()
    (tmp_path / "c").write_text("a file where the checkpoints would go")
    writer = checkpoint_writer(tmp_path / "c", 2, model)
    with pytest.raises(FileExistsError):  # its error is raised where the run waits for it
        writer.result()


def test_missing_checkpoint_errors_name_the_place(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_checkpoint("latest", tmp_path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        resolve_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=STATE_FILE):
        load_trainer_state(tmp_path)


def write_corpus(path: Path, n_docs: int = 30, seed: int = 0) -> Path:
    rng = random.Random(seed)
    words = "red big small old cat dog bird fish tree house sees likes chases finds".split()
    docs = [" ".join(f"The {rng.choice(words)} {rng.choice(words)} {rng.choice(words)} the {rng.choice(words)}."
                     for _ in range(5)) for _ in range(n_docs)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


KILL_SCRIPT = textwrap.dedent("""
    import sys, time, torch
    torch.set_num_threads(1)
    import bert_kit.training.checkpoint as ck
    original = ck._write_trainer_state

    def slow_write(path, state):
        if state["step"] >= 10:  # the second checkpoint: write half a file, then hang
            path.write_bytes(b"partial")
            open(sys.argv[2], "w").write("mid-write")
            time.sleep(120)
        original(path, state)

    ck._write_trainer_state = slow_write
    from bert_kit.tasks.pretraining import PretrainConfig, pretrain
    from bert_kit.training.runconfig import load_config
    pretrain(load_config(PretrainConfig, sys.argv[1]))
""")


def tiny_run_yaml(tmp_path: Path, corpus: Path, **extra) -> Path:
    settings = {
        "model": "{preset: bert-tiny, hidden_size: 32, num_attention_heads: 2, intermediate_size: 64, "
                 "max_position_embeddings: 64}",
        "train_tokenizer": "{vocab_size: 120, min_frequency: 1}", "train_files": f"[{corpus}]",
        "max_length": 32, "batch_size": 8, "max_steps": 30, "lr": "1.0e-3", "eval_every": 0,
        "save_every": 5, "keep_last": 3, "log_every": 1, "output_dir": str(tmp_path / "run"), "eval_fraction": 0.1,
    }
    settings.update(extra)
    path = tmp_path / "run.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
    return path


def test_kill_9_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    config = tiny_run_yaml(tmp_path, corpus)
    (tmp_path / "kill.py").write_text(KILL_SCRIPT)
    marker = tmp_path / "marker"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "kill.py"), str(config), str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    try:
        deadline = time.time() + 300  # only a hang fails: start-up takes what a busy machine needs
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.time() < deadline, "the run never reached the second checkpoint"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    ckpt_dir = tmp_path / "run" / "checkpoints"
    assert (ckpt_dir / "step-0000010.tmp" / STATE_FILE).read_bytes() == b"partial"
    latest = latest_checkpoint(ckpt_dir)
    assert latest is not None and latest.name == "step-0000005"
    state = load_trainer_state(latest)
    assert state["step"] == 5 and state["data"]["loader"]["batch_index"] == 5
    model = BERTForPreTraining.from_pretrained(latest)
    assert model.config.hidden_size == 32

    # and training resumes from it, cleaning up the half-written folder on its next save
    from bert_kit.tasks.pretraining import PretrainConfig, pretrain
    from bert_kit.training.runconfig import load_config

    results = pretrain(load_config(PretrainConfig, config, ["max_steps=7"]), resume="latest")
    assert results["steps"] == 7
    assert latest_checkpoint(ckpt_dir).name == "step-0000007"
    assert not (ckpt_dir / "step-0000010.tmp").exists()

