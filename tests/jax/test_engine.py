"""`bert-kit pretrain ... engine=jax` end to end on a tiny corpus (CPU): the run folder of the torch
engine (metrics, results, checkpoints, final/ that PyTorch and transformers load with the same
outputs), SIGINT in a process of its own and `--resume latest` continuing bit for bit, a time
budget on a fake clock, the settings the engine refuses, and a missing extra named in one line.

Run: .venv/bin/python -m pytest tests/jax/test_engine.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

import bert_kit.training.clock  # noqa: E402
import bert_kit.training.loop  # noqa: E402
from bert_kit.checks import ConfigError  # noqa: E402
from bert_kit.cli import main as cli  # noqa: E402
from bert_kit.jax.batches import HostBatches  # noqa: E402
from bert_kit.jax.engine import STATE_FILE, JaxEngine  # noqa: E402
from bert_kit.tasks.finetuning import FinetuneConfig  # noqa: E402
from bert_kit.tasks.pretraining import PretrainConfig, pretrain  # noqa: E402
from bert_kit.training.checkpoint import latest_checkpoint, load_trainer_state  # noqa: E402
from bert_kit.training.progress import read_metrics  # noqa: E402
from bert_kit.training.runconfig import save_config  # noqa: E402
from tests.fake_clock import FakeClock  # noqa: E402
from tests.jax.common import tiny_engine  # noqa: E402
from tests.tasks.test_pretraining import tiny_config, train_losses  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# one layer, width 32, dropout on: a resumed run must draw the same dropout masks
MODEL = {"preset": "bert-tiny", "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
         "num_hidden_layers": 1, "max_position_embeddings": 64}


def jax_config(tmp_path: Path, name: str, **overrides) -> PretrainConfig:
    """The tiny pretraining run of tests/tasks/test_pretraining.py (NSP + MLM) on the JAX engine:
    a constant lr, so runs of other lengths take the same steps."""
    settings = dict(engine="jax", model=MODEL, schedule="constant", warmup_steps=0, eval_every=0, log_every=1)
    return tiny_config(tmp_path, name, **{**settings, **overrides})


@pytest.mark.slow
def test_sigint_then_resume_latest_continues_the_run_bit_for_bit(tmp_path):
    """The command in its own process, stopped by SIGINT: the step in flight is finished and saved
    (exit 130); `--resume latest` continues it, and every loss equals that of a run never stopped.
    The run folder is the torch engine's, and final/ loads in PyTorch and transformers."""
    cfg = jax_config(tmp_path, "stopped", max_steps=100_000, save_every=100_000)
    save_config(cfg, tmp_path / "run.yaml")
    out = Path(cfg.output_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "bert_kit", "pretrain", "--config", str(tmp_path / "run.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.time() + 300  # only a hang fails: start-up and compilation take what a busy machine needs
        while not ((out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 4):
            assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
            assert time.time() < deadline, "training did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr.decode()[-3000:]
    stopped_at = load_trainer_state(latest_checkpoint(out))["step"]
    assert stopped_at >= 3 and stopped_at == max(train_losses(out))  # the step in flight, finished and saved
    checkpoint = latest_checkpoint(out)
    assert load_trainer_state(checkpoint)["engine"] == "jax" and (checkpoint / STATE_FILE).is_file()

    total = stopped_at + 3
    assert cli(["pretrain", "--config", str(tmp_path / "run.yaml"), f"max_steps={total}", "--resume", "latest"]) == 0
    straight = tmp_path / "straight"
    assert cli(["pretrain", "--config", str(tmp_path / "run.yaml"), f"max_steps={total}",
                f"output_dir={straight}"]) == 0
    resumed, expected = train_losses(out), train_losses(straight)
    assert sorted(resumed) == sorted(expected) == list(range(1, total + 1))
    assert max(abs(resumed[s] - expected[s]) for s in expected) <= 1e-6, (resumed, expected)
    losses = [expected[s] for s in range(1, total + 1)]
    assert np.mean(losses[-3:]) < losses[0]  # it learns

    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == total and results["stopped"] is None and results["precision"].startswith("JAX fp32")
    assert f"on {len(jax.devices())} cpu device(s)" in results["precision"]  # each batch split over them (conftest)
    assert results["test_mlm_loss"] is not None and results["test_nsp_accuracy"] is not None
    assert (out / "loss_curve.png").is_file() and "engine: jax" in (out / "run_config.yaml").read_text()
    assert [r["step"] for r in read_metrics(out) if r["type"] == "eval"] == [total]

    # final/: bert-kit PyTorch and transformers read it, and compute what the JAX model computes
    from bert_kit.heads import BERTForPreTraining
    from bert_kit.jax import BERTForPreTraining as JaxPreTraining
    from bert_kit.tokenizer import get_tokenizer

    transformers = pytest.importorskip("transformers")
    enc = get_tokenizer(out / "final")(["the red cat sees the dog .", "a bird"])
    ours = BERTForPreTraining.from_pretrained(out / "final").eval()
    hf = transformers.BertForPreTraining.from_pretrained(out / "final").eval()
    twin = JaxPreTraining.from_pretrained(out / "final")
    with torch.no_grad():
        mlm, nsp = ours(**enc)
        theirs = hf(**enc)
    torch.testing.assert_close(theirs.prediction_logits, mlm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs.seq_relationship_logits, nsp, rtol=1e-5, atol=1e-5)
    jax_mlm, jax_nsp = twin(*(jax.numpy.asarray(enc[k].numpy()) for k in ("input_ids", "attention_mask",
                                                                          "token_type_ids")))
    np.testing.assert_allclose(np.asarray(jax_mlm), mlm.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jax_nsp), nsp.numpy(), rtol=1e-5, atol=1e-5)


STEP_S, SAVE_S = 0.1, 0.2  # what a step, and a checkpoint or model folder, "take" on the fake clock


@pytest.mark.slow
def test_a_time_budget_ends_a_jax_run_and_drives_its_schedule(tmp_path, monkeypatch):
    """time_budget on the fake clock of tests/fake_clock.py: the run ends inside its budget, with
    final/ written, and the lr it hands the jitted step warms up and decays with the clock."""
    clock = FakeClock().install(monkeypatch, bert_kit.training.clock)
    step, save_checkpoint, write_folder = JaxEngine.step, bert_kit.training.loop.save_checkpoint, \
        bert_kit.training.loop.write_folder_atomically

    def timed(work, seconds):
        def call(*args, **kwargs):
            clock.sleep(seconds)
            return work(*args, **kwargs)
        return call

    monkeypatch.setattr(JaxEngine, "step", timed(step, STEP_S))
    monkeypatch.setattr(bert_kit.training.loop, "save_checkpoint", timed(save_checkpoint, SAVE_S))
    monkeypatch.setattr(bert_kit.training.loop, "write_folder_atomically", timed(write_folder, SAVE_S))
    budget = 9.0
    cfg = jax_config(tmp_path, "budget", max_steps=None, time_budget=f"{budget:g}s", schedule="linear",
                     warmup_steps=None, warmup_fraction=0.2, save_every=0)
    results = pretrain(cfg)
    out = Path(cfg.output_dir)
    assert results["stopped"] is None and results["steps"] > 25 and (out / "final" / "model.safetensors").is_file()
    assert budget - 6 < results["wall_time_s"] <= budget
    lrs = [r["lr"] for r in read_metrics(out) if r["type"] == "train"]
    assert max(lrs) == pytest.approx(cfg.lr, rel=0.2) and lrs.index(max(lrs)) > 3  # warmed up from below
    assert lrs[-1] < 0.35 * cfg.lr  # and decayed with the clock


@pytest.mark.parametrize("setting, named", [
    ("compile_tuning=true", "compile_tuning=true"), ("cuda_graphs=true", "cuda_graphs=true"),
])
def test_settings_the_engine_does_not_support_stop_in_one_line(setting, named, tmp_path, capsys):
    cfg = jax_config(tmp_path, "refused")
    save_config(cfg, tmp_path / "run.yaml")
    argv = ["--config", str(tmp_path / "run.yaml"), setting] + (["compile=true"] if "compile" in setting else [])
    assert cli(["pretrain", *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"engine=jax does not support {named}" in err[0] and "engine=torch" in err[0], err
    assert not Path(cfg.output_dir).exists()  # refused before anything was written


def test_settings_refused_together_and_every_task_accepted():
    with pytest.raises(ConfigError, match=r"engine=jax does not support cuda_graphs=true, compile_tuning=true \("):
        PretrainConfig(engine="jax", compile=True, cuda_graphs=True, compile_tuning=True)
    for task in ("classification", "token-classification", "qa", "similarity", "embedding"):
        assert FinetuneConfig(engine="jax", task=task, model="bert-tiny").task == task
    # what a JAX run does anyway is accepted: it compiles its step, and masks padding itself
    assert PretrainConfig(engine="jax", compile=True, cuda_graphs="auto", low_precision_residual=True).engine == "jax"
    assert PretrainConfig(engine="jax", parallel="fsdp").parallel == "fsdp"  # tests/jax/test_engine_fsdp.py
    assert FinetuneConfig(engine="jax", model="bert-tiny", unpadded=True, cuda_graphs="auto").unpadded


def test_without_the_extra_engine_jax_names_it_in_one_line(tmp_path, capsys, monkeypatch):
    """As where jax is not installed: the command stops before any work, exit 1, and says what to install."""
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` now fails as it does without the package
    monkeypatch.delitem(sys.modules, "bert_kit.jax.engine")
    cfg = jax_config(tmp_path, "no_jax")
    save_config(cfg, tmp_path / "run.yaml")
    assert cli(["pretrain", "--config", str(tmp_path / "run.yaml")]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ['bert-kit pretrain: error: engine=jax needs jax: pip install "bert-kit[jax]"'], err
    assert not Path(cfg.output_dir).exists()


def test_regression_rows_that_pad_a_batch_take_no_part_in_the_loss():
    """A short batch is padded to the rows of a full one (static shapes): its extra rows repeat row
    0's inputs and carry NaN targets, which the mean squared error leaves out, gradient included."""
    from bert_kit.jax.train import classification_loss

    logits, labels = np.array([[0.5], [1.0], [3.0], [7.0]], np.float32), np.array([1.0, 0.0, 2.0, np.nan], np.float32)
    loss, grad = jax.value_and_grad(lambda x: classification_loss(x, labels))(logits)
    assert float(loss) == pytest.approx(((0.5 - 1) ** 2 + 1.0 ** 2 + (3.0 - 2) ** 2) / 3)
    assert np.isfinite(grad).all() and grad[3, 0] == 0
    # the batch as the engine builds it (a short last batch of a regression run)
    host_batches = HostBatches(SimpleNamespace(max_length=32, batch_size=4), None, 0, 1)  # full batches: 4 rows
    ids = torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0], [2, 3, 0, 0]])
    padded = host_batches([{"input_ids": ids, "attention_mask": (ids > 0).long(),
                            "labels": torch.tensor([0.5, 1.5, 2.5])}], "train")
    assert padded["input_ids"].shape == (1, 4, 32) and padded["input_ids"].dtype == np.int32
    assert (padded["input_ids"][0, 3] == padded["input_ids"][0, 0]).all() and padded["attention_mask"][0, 3, :4].all()
    assert np.isnan(padded["labels"][0, 3]) and padded["labels"][0, :3].tolist() == [0.5, 1.5, 2.5]


def test_a_nan_loss_freezes_the_weights_and_is_raised_at_the_next_read():
    """As the torch engine's deferred checks: a step with a non-finite loss changes nothing from
    then on, the steps stay queued (no sync), and the window's read names the step that failed."""
    from bert_kit.training.trainer import NonFiniteLossError

    engine = tiny_engine(1)

    def batch(label: float) -> dict:
        ids = torch.randint(1, 40, (4, 10))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
                "labels": torch.tensor([label, 0.5, 1.0, 2.0])}

    for label in (1.0, 2.0):
        engine.step([batch(label)], lr=1e-3)
    losses, grad_norm, skipped = engine.read_window()
    assert set(losses) == {"loss"} and np.isfinite(losses["loss"]) and grad_norm > 0 and skipped == 0
    good = jax.tree.map(np.asarray, engine.state.params)
    for label in (float("inf"), 1.0):
        engine.step([batch(label)], lr=1e-3)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 3 \(loss=inf"):
        engine.read_window()
    with pytest.raises(NonFiniteLossError, match="at step 3"):
        engine.check_finite()  # before a checkpoint: the same error, nothing saved
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(good), jax.tree.leaves(engine.state.params)))


def test_the_backend_starts_in_a_thread_while_the_job_reads_its_data():
    """`JaxEngine.start_device` starts JAX's backends (a GPU's context and memory: seconds) in a
    thread, as the torch engine starts CUDA: none had started before, all have once it is done;
    device=cpu starts nothing. In a process of its own: this one's backends started long ago."""
    code = """
from jax._src import xla_bridge
from bert_kit.jax.train import start_backend
before = xla_bridge.backends_are_initialized()
thread = start_backend("auto")
thread.join(60)
print(before, thread.name, xla_bridge.backends_are_initialized(), start_backend("cpu"))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["False", "jax-start", "True", "None"], done.stderr


def test_a_fine_tune_does_not_take_the_gpus_memory_up_front(monkeypatch):
    """A fine-tune (its settings have a task) turns off JAX's preallocation of 75% of the GPU,
    before the backend starts; pretraining keeps it, and a user's own setting stands."""
    from types import SimpleNamespace

    from bert_kit.jax.engine import JaxEngine

    for task, given, expected in ((True, None, "false"), (False, None, None), (True, "true", "true")):
        if given is None:
            monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
        else:
            monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", given)
        cfg = SimpleNamespace(device="cpu", **({"task": "classification"} if task else {}))  # the tests' JAX cache
        JaxEngine.start_device(cfg)
        assert os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") == expected, (task, given)


def test_the_compiling_threads_end_with_the_steps_so_the_process_can_end_at_once():
    """`cli.exit_now` ends a process at once only when no thread but daemons is alive: the engine's
    compile pool is shut down when its steps end (`running`), queued programs dropped."""
    import time

    engine = tiny_engine(2)
    engine.pool.submit(time.sleep, 0.01).result()  # a compiling thread, idle now
    queued = engine.pool.submit(time.sleep, 0.5), engine.pool.submit(time.sleep, 0.5), \
        engine.pool.submit(time.sleep, 0.5), engine.pool.submit(time.sleep, 0.5), engine.pool.submit(time.sleep, 0.5)
    with engine.running():
        pass
    assert queued[-1].cancelled()  # more than the pool's threads: the last was still queued
    threads = list(engine.pool._threads)  # this pool's (other tests' engines may have their own)
    assert threads
    deadline = time.time() + 5
    while time.time() < deadline and any(t.is_alive() for t in threads):
        time.sleep(0.05)
    assert not any(t.is_alive() for t in threads)
