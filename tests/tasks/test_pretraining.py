"""Pretraining end to end on tiny configs (CPU): exact resume, signals, NaN stop, clear errors,
the CLI with its files, and the AMPTrainer's accumulation and precisions.

Run: .venv/bin/python -m pytest tests/tasks/test_pretraining.py -q
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bert_kit.training.clock
import bert_kit.training.engine
import bert_kit.training.trainer
import bert_kit.tasks.pretraining
import bert_kit.training.loop
from bert_kit.training.trainer import AMPTrainer, NonFiniteLossError
from bert_kit.training.checkpoint import latest_checkpoint, list_checkpoints, load_trainer_state
from bert_kit.checks import ConfigError
from bert_kit.cli import main as cli
from bert_kit.config import BertConfig
from bert_kit.heads import BERTForPreTraining
from bert_kit.kernels.residual import set_low_precision_residual
from bert_kit.training.optim import create_optimizer
from bert_kit.training.precision import resolve_precision
from bert_kit.tasks.pretraining import PretrainConfig, plan_phases, pretrain
from bert_kit.training.progress import ProgressLogger, read_metrics
from bert_kit.training.runconfig import load_config, save_config
from bert_kit.tokenizer_training import train_tokenizer
from bert_kit.training.losses import compute_mlm_loss
from tests.fake_clock import FakeClock

torch.set_num_threads(1)  # tiny models: threads only add contention on a shared machine
REPO = Path(__file__).resolve().parents[2]
RESULT_KEYS = ("train_mlm_loss", "train_nsp_loss", "test_mlm_loss", "test_nsp_loss", "test_nsp_accuracy")
TINY_MODEL = {"preset": "bert-tiny", "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
              "max_position_embeddings": 64}


def write_corpus(path: Path, n_docs: int = 30, seed: int = 0) -> Path:
    """Blank-line separated documents of simple, learnable sentences."""
    rng = random.Random(seed)
    adj = "red big small old new happy sad quick".split()
    noun = "cat dog bird fish horse mouse tree house".split()
    verb = "sees likes chases finds eats hears".split()
    docs = [" ".join(f"The {rng.choice(adj)} {rng.choice(noun)} {rng.choice(verb)} the {rng.choice(noun)}."
                     for _ in range(5)) for _ in range(n_docs)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


def tiny_config(tmp_path: Path, name: str = "run", **overrides) -> PretrainConfig:
    """A 2-layer, 32-wide model on a 30-document corpus; tokenizer trained once per tmp_path
    (WordPiece training breaks frequency ties differently from run to run, so runs that must
    match share one tokenizer folder)."""
    corpus, tok = tmp_path / "corpus.txt", tmp_path / "tokenizer"
    if not corpus.exists():
        write_corpus(corpus)
        train_tokenizer([str(corpus)], vocab_size=120, min_frequency=1).save(tok)
    settings = dict(model=TINY_MODEL, tokenizer=str(tok), train_files=[str(corpus)], max_length=32, batch_size=4,
                    max_steps=20, lr=1e-3, eval_every=5, eval_batches=2, save_every=50, log_every=1,
                    eval_fraction=0.1, output_dir=str(tmp_path / name))
    settings.update(overrides)
    return PretrainConfig(**settings)


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["type"] == "train"}


class SignalAtStep(ProgressLogger):
    """A ProgressLogger that sends this process `signum` once the bar reaches `at_step`."""

    at_step, signum = 10, signal.SIGTERM

    def update(self, step, **postfix):
        super().update(step, **postfix)
        if step == self.at_step:
            signal.raise_signal(self.signum)


def test_resume_is_bit_exact(tmp_path, monkeypatch):
    # two phases (boundary at step 14, after the resume point), grad accumulation in the first,
    # dropout on, evaluation every 5 steps: everything a resume must reproduce
    phases = [{"fraction": 0.7, "max_length": 24, "grad_accum": 2}, {"fraction": 0.3, "max_length": 32}]
    straight = tiny_config(tmp_path, "straight", phases=phases)
    results_a = pretrain(straight)
    assert results_a["steps"] == 20 and results_a["stopped"] is None

    # the same run, stopped by SIGTERM after step 10 (through the CLI: exit code 143), then resumed
    interrupted = tmp_path / "interrupted"
    args = [f"output_dir={interrupted}"]
    cfg_file = tmp_path / "straight" / "run_config.yaml"
    monkeypatch.setattr(bert_kit.training.loop, "ProgressLogger", SignalAtStep)
    assert cli(["pretrain", "--config", str(cfg_file), *args]) == 143
    monkeypatch.setattr(bert_kit.training.loop, "ProgressLogger", ProgressLogger)
    assert latest_checkpoint(interrupted).name == "step-0000010"
    assert not (interrupted / "final").exists()
    assert cli(["pretrain", "--config", str(cfg_file), *args, "--resume", "latest"]) == 0

    a, b = train_losses(tmp_path / "straight"), train_losses(interrupted)
    assert sorted(a) == sorted(b) == list(range(1, 21))
    torch.testing.assert_close(torch.tensor([b[s] for s in range(1, 21)], dtype=torch.float64),
                               torch.tensor([a[s] for s in range(1, 21)], dtype=torch.float64), rtol=0, atol=0)
    wa = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    wb = load_file(interrupted / "final" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=0, msg=k)
    lengths = {r["step"]: r["max_length"] for r in read_metrics(interrupted) if r["type"] == "train"}
    assert lengths[14] == 24 and lengths[15] == 32  # the phase switch happened after the resume


def test_sigint_saves_a_checkpoint_and_exits_130(tmp_path):
    cfg = tiny_config(tmp_path, max_steps=100_000, eval_every=0, save_every=100_000)
    config_file = tmp_path / "run.yaml"
    from bert_kit.training.runconfig import save_config

    save_config(cfg, config_file)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "bert_kit", "pretrain", "--config", str(config_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    metrics = Path(cfg.output_dir) / "metrics.jsonl"
    try:
        deadline = time.time() + 300  # only a hang fails: start-up takes what a busy machine needs
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.time() < deadline, "training did not start"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)  # a step and a save; only a hang fails
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr.decode()[-2000:]
    assert "SIGINT received" in stderr.decode()
    ckpt = latest_checkpoint(Path(cfg.output_dir))
    assert ckpt is not None
    step = load_trainer_state(ckpt)["step"]
    logged = max(train_losses(Path(cfg.output_dir)))
    assert step >= 3 and step == logged  # the step in flight was finished, then saved
    results = json.loads((Path(cfg.output_dir) / "results.json").read_text())
    assert results["stopped"] == "SIGINT" and results["steps"] == step


def _use_fused_adamw(monkeypatch) -> None:
    """The loop's optimizer as a fused AdamW (as on CUDA): the trainer then checks losses on the device."""
    make = bert_kit.training.engine.create_optimizer

    def fused_adamw(model, *args, **kwargs):
        groups = [{k: v for k, v in g.items() if k != "fused"} for g in make(model, *args, **kwargs).param_groups]
        return torch.optim.AdamW(groups, fused=True)

    monkeypatch.setattr(bert_kit.training.engine, "create_optimizer", fused_adamw)


@pytest.mark.parametrize("deferred", [False, True])
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys, deferred):
    """deferred: with a fused AdamW (as on CUDA) the trainer checks losses on the device and the
    loop reads the flag at log steps and before checkpoints; the outcome must be the same."""
    original, calls = bert_kit.tasks.pretraining.compute_mlm_loss, {"n": 0}
    if deferred:
        _use_fused_adamw(monkeypatch)
        monkeypatch.setattr(bert_kit.training.trainer.AMPTrainer, "check_finite", _counting(bert_kit.training.trainer.AMPTrainer.check_finite))

    def poisoned(logits, labels):
        calls["n"] += 1
        loss = original(logits, labels)
        return loss * float("nan") if calls["n"] == 13 else loss  # micro-batch 13 = step 13

    monkeypatch.setattr(bert_kit.tasks.pretraining, "compute_mlm_loss", poisoned)
    cfg = tiny_config(tmp_path, save_every=5, eval_every=0)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 13 .*mlm_loss=nan.*step-0000010"):
        pretrain(cfg)
    assert _counting.calls > 0 if deferred else True
    out = Path(cfg.output_dir)
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["step-0000005", "step-0000010"]
    assert not (out / "final").exists()
    weights = load_file(out / "checkpoints" / "step-0000010" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert [r["step"] for r in read_metrics(out) if r["type"] == "error"] == [13]

    # from the command line: one clear line and exit code 1
    calls["n"] = 0
    code = cli(["pretrain", "--config", str(out / "run_config.yaml"), f"output_dir={tmp_path / 'cli'}"])
    err = capsys.readouterr().err
    assert code == 1 and "non-finite loss at step 13" in err and "Last good checkpoint" in err


def _counting(fn):
    def wrapper(self, *args, **kwargs):
        _counting.calls += self.deferred
        return fn(self, *args, **kwargs)
    return wrapper


_counting.calls = 0


def test_bad_config_and_data_give_clear_errors(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("max_steps: 2\n")

    def error_of(*argv: str, code: int = 2) -> str:
        assert cli(["pretrain", *argv]) == code  # 2: the command or its inputs are wrong; 1: the run failed
        return capsys.readouterr().err

    err = error_of("--config", str(tmp_path / "missing.yaml"), code=2)
    assert "config file not found" in err and "missing.yaml" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: 2\nlearning_rate: 0.1\n")
    err = error_of("--config", str(bad), code=2)
    assert "unknown key 'learning_rate' (did you mean lr?)" in err and "bert-kit pretrain --help" in err
    assert "max_steps: expected an integer, got 'ten'" in error_of("--config", str(good), "max_steps=ten", code=2)
    err = error_of("--config", str(good), f"train_files=[{tmp_path / 'nope.txt'}]", "train_tokenizer={vocab_size: 50}",
                   f"output_dir={tmp_path / 'o1'}")
    assert "nope.txt" in err

    broken = tmp_path / "train.jsonl"
    broken.write_text('{"text": "a fine first line."}\n{"text": oops}\n')
    err = error_of("--config", str(good), f"train_files=[{broken}]", "corpus_format=jsonl",
                   f"tokenizer={tmp_path / 'tok'}", f"output_dir={tmp_path / 'o2'}")
    assert f"tokenizer={tmp_path / 'tok'}: folder or file not found" in err  # named before the data is read
    write_corpus(tmp_path / "c.txt")
    assert cli(["tokenizer", "train", "--files", str(tmp_path / "c.txt"), "--vocab-size", "80",
                "--output", str(tmp_path / "tok")]) == 0
    capsys.readouterr()
    err = error_of("--config", str(good), f"train_files=[{broken}]", "corpus_format=jsonl",
                   f"tokenizer={tmp_path / 'tok'}", f"output_dir={tmp_path / 'o3'}", "nsp=false")
    assert "train.jsonl:2" in err and "invalid JSON" in err
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfebad" * 10)
    err = error_of("--config", str(good), f"train_files=[{binary}]", f"tokenizer={tmp_path / 'tok'}",
                   f"output_dir={tmp_path / 'o4'}")
    assert "binary.txt" in err and "not UTF-8" in err


def test_cli_end_to_end_on_wikitext(tmp_path, data_dir, capsys):
    lines = (data_dir / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("".join(lines[:470]))  # the first 8 articles
    tok = tmp_path / "tok"
    assert cli(["tokenizer", "train", "--files", str(corpus), "--vocab-size", "600", "--output", str(tok)]) == 0
    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {json.dumps(TINY_MODEL)}\ntokenizer: {tok}\ntrain_files: [{corpus}]\n"
                      "corpus_format: wikitext\nmax_length: 64\nbatch_size: 8\nmax_steps: 30\nlr: 2.0e-3\n"
                      f"eval_fraction: 0.25\neval_every: 10\neval_batches: 2\nsave_every: 10\nkeep_last: 2\n"
                      f"log_every: 5\noutput_dir: {run}\n")
    results_file = tmp_path / "results.json"
    assert cli(["pretrain", "--config", str(config), "seed=3", "--output", str(results_file)]) == 0
    capsys.readouterr()
    results = json.loads(results_file.read_text())
    for key in RESULT_KEYS + ("test_perplexity", "tokens_per_second", "steps", "wall_time_s"):
        assert results[key] is not None, key
    assert results["steps"] == 30 and 0 <= results["test_nsp_accuracy"] <= 1
    assert results["train_mlm_loss"] < results["initial_train_mlm_loss"] - 0.3  # it learns
    assert math.isclose(results["test_perplexity"], math.exp(results["test_mlm_loss"]), rel_tol=1e-9)
    records = read_metrics(run)
    assert [r["step"] for r in records if r["type"] == "train"] == [1, 5, 10, 15, 20, 25, 30]
    assert [r["step"] for r in records if r["type"] == "eval"] == [10, 20, 30]
    assert (run / "loss_curve.png").stat().st_size > 1000
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step-0000020", "step-0000030"]
    assert load_config(PretrainConfig, run / "run_config.yaml").seed == 3

    model = BERTForPreTraining.from_pretrained(run / "final")
    assert model.config.vocab_size == len((tok / "vocab.txt").read_text().splitlines())
    assert cli(["fill-mask", "--model", str(run / "final"), "the [MASK] of the game .", "--top-k", "3", "--json"]) == 0
    predictions = json.loads(capsys.readouterr().out)["predictions"]
    assert len(predictions) == 1 and len(predictions[0]) == 3
    (run / "loss_curve.png").unlink()
    assert cli(["plot", str(run)]) == 0 and (run / "loss_curve.png").is_file()
    assert cli(["convert", "--input", str(run / "final"), "--output", str(tmp_path / "mlm"), "--head", "mlm"]) == 0
    assert json.loads((tmp_path / "mlm" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert (tmp_path / "mlm" / "vocab.txt").is_file()


def test_mlm_only_packed_run_uses_the_token_cache(tmp_path, capsys):
    cfg = tiny_config(tmp_path, nsp=False, max_steps=6, eval_every=3, tokenizer=None, tensorboard=True,
                      whole_word_masking=True, train_tokenizer={"vocab_size": 100, "min_frequency": 1})
    results = pretrain(cfg)
    # TensorBoard is optional: logged to when installed, a one-line notice otherwise
    tb_dir = Path(cfg.output_dir) / "tensorboard"
    assert tb_dir.is_dir() or "tensorboard package is not installed" in capsys.readouterr().err
    assert results["train_nsp_loss"] is None and results["test_nsp_loss"] is None
    assert results["test_mlm_loss"] is not None
    assert any((Path(cfg.output_dir) / "token_cache").glob("*.tokens"))
    final_config = json.loads((Path(cfg.output_dir) / "final" / "config.json").read_text())
    assert final_config["architectures"] == ["BertForMaskedLM"]
    # resuming a finished run trains nothing and evaluates the same weights on the same masks again;
    # its results describe the whole run, from the run's records
    again = pretrain(cfg, resume="latest")
    assert again["steps"] == 6 and again["train_tokens"] == results["train_tokens"] > 0
    assert again["test_mlm_loss"] == results["test_mlm_loss"]
    assert again["train_mlm_loss"] is not None


def test_dropout_setting_pretrains_without_dropout_and_saves_the_models_rates(tmp_path):
    no_dropout = {**TINY_MODEL, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    in_config = pretrain(tiny_config(tmp_path, "in_config", model=no_dropout, max_steps=8, eval_every=4))
    setting = pretrain(tiny_config(tmp_path, "setting", dropout=0.0, max_steps=8, eval_every=4))
    with_dropout = pretrain(tiny_config(tmp_path, "with_dropout", max_steps=8, eval_every=4))
    a, b, c = (train_losses(tmp_path / name) for name in ("in_config", "setting", "with_dropout"))
    assert a == b  # the same training as a model whose config has no dropout
    assert b != c
    assert setting["test_mlm_loss"] == in_config["test_mlm_loss"] != with_dropout["test_mlm_loss"]
    saved = json.loads((tmp_path / "setting" / "final" / "config.json").read_text())
    assert saved["hidden_dropout_prob"] == saved["attention_probs_dropout_prob"] == 0.1  # for fine-tuning
    with pytest.raises(ConfigError, match="dropout"):
        tiny_config(tmp_path, dropout=1.0)


def test_the_run_says_which_fast_path_it_took(tmp_path, capsys):
    """One line on the console, results.json's "fast_path" and run_config.yaml's first line (a
    comment: the file still loads as the run's config) name what `fast_path.apply` put on."""
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=0, device="cpu", precision="fp32")
    results = pretrain(cfg)
    assert "fast path: none (CPU: eager SDPA)" in capsys.readouterr().out.splitlines()
    assert results["fast_path"] == "none (CPU: eager SDPA)"
    run_config = Path(cfg.output_dir) / "run_config.yaml"
    assert run_config.read_text().splitlines()[0] == "# fast path: none (CPU: eager SDPA)"
    assert load_config(PretrainConfig, run_config) == cfg


@pytest.mark.parametrize("eval_batches", [2, 50])
def test_periodic_evaluations_read_the_held_out_loader_once(tmp_path, monkeypatch, eval_batches):
    """The periodic evaluations score the same batches: kept after the first read, not masked again
    by the loader (and its workers started) at every evaluation, also when the held-out set has fewer
    batches than eval_batches. The last one reads it all."""
    import bert_kit.tasks.pretraining as pretraining

    class Counting:
        def __init__(self, loader):
            self.loader, self.passes = loader, 0

        def set_epoch(self, epoch: int) -> None:
            self.loader.set_epoch(epoch)

        def __iter__(self):
            self.passes += 1
            return iter(self.loader)

    made, phase_loaders = [], pretraining.phase_loaders

    def counting(*args, **kwargs):
        loader, eval_loader, about = phase_loaders(*args, **kwargs)
        made.append(Counting(eval_loader))
        return loader, made[-1], about

    monkeypatch.setattr(pretraining, "phase_loaders", counting)
    pretrain(tiny_config(tmp_path, max_steps=20, eval_every=5, eval_batches=eval_batches, eval_fraction=0.3))
    evals = [r for r in read_metrics(tmp_path / "run") if r["type"] == "eval"]
    assert [r["step"] for r in evals] == [5, 10, 15, 20] and evals[-1]["final"]
    assert len(made) == 1 and made[0].passes == 2  # the first evaluation's batches, then the whole set
    assert evals[0]["mlm_tokens"] == evals[1]["mlm_tokens"] == evals[2]["mlm_tokens"]
    assert (evals[2]["mlm_tokens"] < evals[3]["mlm_tokens"]) == (eval_batches == 2)  # 50: the whole set


def test_the_train_loader_knows_where_the_phase_ends(tmp_path, monkeypatch):
    """So that its last epoch starts no workers for an epoch nobody reads."""
    from bert_kit.data.pretraining import ResumableDataLoader

    calls, stop_after = [], ResumableDataLoader.stop_after
    monkeypatch.setattr(ResumableDataLoader, "stop_after",
                        lambda self, n: calls.append((self.epoch, self.batch_index, n)) or stop_after(self, n))
    pretrain(tiny_config(tmp_path, max_steps=6, grad_accum=2, eval_every=0))
    assert calls == [(0, 0, 12)]


def test_plan_phases_splits_steps():
    cfg = PretrainConfig(max_steps=101, max_length=512, batch_size=8,
                         phases=[{"fraction": 0.9, "max_length": 128, "batch_size": 64}, {"fraction": 0.1}])
    p = plan_phases(cfg)
    assert [(x.start, x.end, x.max_length, x.batch_size) for x in p] == [(0, 91, 128, 64), (91, 101, 512, 8)]


def _batch(seed: int, n: int = 4) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (n, 12), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, 2:5] = ids[:, 2:5]  # the same number of masked tokens in every row
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
            "labels": labels, "next_sentence_label": torch.arange(n) % 2}


def _tiny_model() -> BERTForPreTraining:
    torch.manual_seed(0)
    return BERTForPreTraining(BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=16,
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def test_grad_accumulation_matches_one_large_batch():
    fp32 = resolve_precision("fp32", "cpu", verbose=False)
    big = _batch(0, 8)
    halves = [{k: v[:4] for k, v in big.items()}, {k: v[4:] for k, v in big.items()}]
    m1, m2 = _tiny_model(), _tiny_model()
    t1 = AMPTrainer(m1, create_optimizer(m1, "adamw", 1e-2), None, fp32, grad_accum=1, clip_grad=0.5)
    t2 = AMPTrainer(m2, create_optimizer(m2, "adamw", 1e-2), None, fp32, grad_accum=2, clip_grad=0.5)
    t1.mlm_step(big)
    t2.mlm_step(halves[0])
    assert t2.step == 0 and not t2.last["stepped"]
    t2.mlm_step(halves[1])
    assert t2.step == 1 and t2.last["stepped"]
    torch.testing.assert_close(t2.last["grad_norm"], t1.last["grad_norm"], rtol=1e-5, atol=1e-6)
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("low_precision_residual", [False, True])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_on_cpu(precision, low_precision_residual):
    prec = resolve_precision(precision, "cpu", verbose=False)
    model = set_low_precision_residual(_tiny_model(), low_precision_residual)
    trainer = AMPTrainer(model, create_optimizer(model, "adamw", 1e-3), None, prec)
    assert trainer.scaler.is_enabled() == (precision == "fp16")
    losses = [trainer.mlm_step(_batch(0)) for _ in range(5)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert next(model.parameters()).dtype == torch.float32  # master weights stay fp32


def test_classification_step_learns_a_fixed_batch():
    from bert_kit.heads import BERTForSequenceClassification

    torch.manual_seed(0)
    model = BERTForSequenceClassification(_tiny_model().config, num_labels=3)
    trainer = AMPTrainer(model, create_optimizer(model, "adamw", 1e-2), None,
                         resolve_precision("fp32", "cpu", verbose=False), grad_accum=2)
    batch = _batch(1, 4)
    batch = {**batch, "labels": torch.tensor([0, 1, 2, 1])}
    losses = [trainer.classification_step(batch) for _ in range(20)]
    assert trainer.step == 10
    assert losses[-1] < 0.5 * losses[0], losses


def test_prediction_slots_give_the_same_step_as_labels():
    """`mlm_slots` (static shapes for a compiled run): same loss, gradients and weights as the
    variable-size masked positions, and the padded slots count for nothing."""
    from bert_kit.heads import with_prediction_slots

    batch = _batch(1, 8)
    slotted = with_prediction_slots(batch, share=0.2, multiple=16)
    n = int((batch["labels"] != -100).sum())
    assert slotted["masked_index"].shape == slotted["masked_labels"].shape == (32,)  # 0.2 * 96 -> 20 -> 32
    assert int((slotted["masked_labels"] != -100).sum()) == n
    assert with_prediction_slots(batch, share=0.01, multiple=16)["masked_index"].shape == (32,)  # n = 24 fits
    fp32 = resolve_precision("fp32", "cpu", verbose=False)
    m1, m2 = _tiny_model(), _tiny_model()
    t1 = AMPTrainer(m1, create_optimizer(m1, "adamw", 1e-2), None, fp32)
    t2 = AMPTrainer(m2, create_optimizer(m2, "adamw", 1e-2), None, fp32, mlm_slots=0.2)
    for seed in (1, 2):
        assert t2.mlm_step(_batch(seed, 8)) == pytest.approx(t1.mlm_step(_batch(seed, 8)), rel=1e-6)
        torch.testing.assert_close(t2.last["grad_norm"], t1.last["grad_norm"], rtol=1e-5, atol=1e-7)
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=k)
    # evaluation with slots reports the same metrics as with labels
    from bert_kit.training.losses import compute_mlm_loader_loss

    loader = [_batch(3, 8), _batch(4, 5)]
    plain = compute_mlm_loader_loss(m1, loader)
    slots = compute_mlm_loader_loss(m1, loader, prediction_slots=0.2)
    assert slots.keys() == plain.keys() and slots["mlm_tokens"] == plain["mlm_tokens"]
    for k in plain:
        assert slots[k] == pytest.approx(plain[k], rel=1e-5), k


def test_mlm_loss_over_padded_slots_ignores_them_and_is_zero_when_empty():
    logits = torch.randn(6, 10)
    targets = torch.tensor([3, 1, 7, -100, -100, -100])
    expected = torch.nn.functional.cross_entropy(logits[:3], targets[:3])
    torch.testing.assert_close(compute_mlm_loss(logits, targets), expected)
    assert compute_mlm_loss(logits, torch.full((6,), -100)).item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("compiled", [False, True])
def test_mlm_loss_gradient_is_cross_entropys_on_padded_vocabulary_logits(dtype, compiled):
    # the logits as the compiled MLM head returns them: a view of a vocabulary padded to 64
    from bert_kit.training.losses import summed_cross_entropy

    torch.manual_seed(0)
    padded = (torch.randn(24, 128) * 4).to(dtype).requires_grad_()
    targets = torch.randint(0, 100, (24,))
    targets[::3] = -100
    loss_fn = torch.compile(compute_mlm_loss, dynamic=False) if compiled else compute_mlm_loss
    ours = loss_fn(padded[:, :100], targets) * 3.0
    (grad,) = torch.autograd.grad(ours, padded)
    reference = torch.nn.functional.cross_entropy(padded[:, :100].float(), targets, ignore_index=-100) * 3.0
    (expected,) = torch.autograd.grad(reference, padded)
    torch.testing.assert_close(ours, reference, rtol=1e-6, atol=1e-6)
    assert grad.dtype == dtype and not grad[:, 100:].any() and not grad[::3].any()
    torch.testing.assert_close(grad, expected.to(dtype), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6)
    total = summed_cross_entropy(padded[:, :100], targets)
    assert total.item() == pytest.approx(reference.item() / 3.0 * 16, rel=1e-5)  # 16 labelled rows


def test_cuda_graphs_settings_are_checked(tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="works on CUDA GPUs"):
            pretrain(tiny_config(tmp_path, compile=True, cuda_graphs=True))
    with pytest.raises(ValueError, match="need compile: true"):
        PretrainConfig(cuda_graphs=True)
    with pytest.raises(ValueError, match="grad_accum 1 in every phase"):
        PretrainConfig(compile=True, cuda_graphs=True, phases=[{"fraction": 0.9}, {"fraction": 0.1, "grad_accum": 8}])
    PretrainConfig(compile=True, cuda_graphs=True, compile_tuning=True)  # fine on its own
    with pytest.raises(ValueError, match="cuda_graphs"):
        PretrainConfig(compile=True, cuda_graphs="yes")


def test_cuda_graphs_auto_turns_on_only_where_graphs_can_run():
    """auto: one config for a GPU, a CPU and torchrun; true where graphs cannot run is an error
    (raised before the corpus is read)."""
    from bert_kit.tasks.pretraining import use_cuda_graphs

    cpu, gpu = torch.device("cpu"), torch.device("cuda")  # only the device type is looked at
    auto = PretrainConfig(compile=True, cuda_graphs="auto")
    assert use_cuda_graphs(auto, gpu) is True
    assert use_cuda_graphs(auto, cpu) is False
    assert use_cuda_graphs(PretrainConfig(compile=False, cuda_graphs="auto"), gpu) is False
    assert use_cuda_graphs(PretrainConfig(compile=True, cuda_graphs="auto", grad_accum=2), gpu) is False
    assert use_cuda_graphs(PretrainConfig(compile=True, cuda_graphs=False), gpu) is False
    assert use_cuda_graphs(PretrainConfig(compile=True, cuda_graphs=True), gpu) is True
    with pytest.raises(ValueError, match="cuda_graphs: true works on CUDA GPUs.*here cpu"):
        use_cuda_graphs(PretrainConfig(compile=True, cuda_graphs=True), cpu)


@pytest.mark.slow
def test_compiled_run_trains_on_static_shapes(tmp_path):
    """compile=true: batches padded to max_length, fixed prediction slots, the loss compiled; the
    run learns like the eager one (dropout draws differ) and evaluates without recompiling."""
    import torch._dynamo

    torch._dynamo.reset()
    eager = pretrain(tiny_config(tmp_path, "eager", max_steps=30, eval_every=10, lr=3e-3))
    compiled = pretrain(tiny_config(tmp_path, "compiled", max_steps=30, eval_every=10, lr=3e-3, compile=True))
    assert compiled["test_mlm_loss"] < compiled["initial_train_mlm_loss"] - 1.0  # 4.75 -> 3.4
    assert compiled["test_mlm_loss"] == pytest.approx(eager["test_mlm_loss"], abs=0.15)
    evals = [r for r in read_metrics(tmp_path / "compiled") if r["type"] == "eval"]
    assert len(evals) == 3 and evals[-1]["mlm_tokens"] > 0
    torch._dynamo.reset()


def test_deferred_checks_skip_updates_from_the_first_bad_step_and_raise_later():
    """deferred_checks: no loss read back per step; a NaN at step 3 leaves the weights of step 2
    (the fused optimizer skips steps 3 and 4 on the device) and check_finite names step 3."""
    fp32 = resolve_precision("fp32", "cpu", verbose=False)

    def trainer_for(model, deferred):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        return AMPTrainer(model, opt, None, fp32, deferred_checks=deferred)

    reference, model = _tiny_model(), _tiny_model()
    t_ref, t = trainer_for(reference, False), trainer_for(model, True)
    assert t.deferred and not t_ref.deferred
    for seed in (1, 2):
        loss = t.mlm_step(_batch(seed))
        assert torch.is_tensor(loss) and loss.item() == pytest.approx(t_ref.mlm_step(_batch(seed)), rel=1e-6)
    t.check_finite()  # nothing bad yet
    bad = _batch(3)
    bad["input_ids"] = bad["input_ids"].clone()
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[bad["input_ids"][0, 0]] = float("nan")
    t.mlm_step(bad)
    with torch.no_grad():  # repair the row: step 4 is finite but must not be applied either
        model.bert.embeddings.word_embeddings.weight[bad["input_ids"][0, 0]] = \
            reference.bert.embeddings.word_embeddings.weight[bad["input_ids"][0, 0]]
    t.mlm_step(_batch(4))
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 3 .*mlm_loss=nan"):
        t.check_finite()
    for (k, a), b in zip(reference.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=k)
    assert t.optimizer.state[next(model.parameters())]["step"].item() == 2  # skipped steps not counted
    assert not hasattr(t.optimizer, "found_inf")


def test_the_warm_up_step_of_a_new_batch_shape_leaves_no_gradients():
    """With CUDA graphs each new batch shape takes one eager step before its capture. That step must
    end with every gradient set to None: the capture then allocates them in the graphs' pool and
    its backward writes them (no zeroing, no adding), so no gradient outlives a step and memory the
    graphs share holds nothing a later replay reads (tests/tasks/test_finetuning_gpu.py runs the
    graphs themselves, with new shapes between replays)."""
    fp32 = resolve_precision("fp32", "cpu", verbose=False)
    model, reference = _tiny_model(), _tiny_model()
    t = AMPTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True), None, fp32,
                   deferred_checks=True)
    t_ref = AMPTrainer(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True), None, fp32,
                       deferred_checks=True)
    t.graphs = {}  # as cuda_graphs=True sets it on a GPU; on a CPU only the warm-up steps can run
    for i, n in enumerate((4, 3)):  # another shape: another warm-up
        t.mlm_step(_batch(i + 1, n=n))
        t_ref.mlm_step(_batch(i + 1, n=n))
        assert all(p.grad is None for p in model.parameters())
    assert list(t.graphs.values()) == ["warm", "warm"] and t.step == 2
    for (k, a), b in zip(reference.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=k)  # the warm-ups are ordinary steps


@pytest.mark.parametrize("deferred", [False, True])
def test_a_non_finite_gradient_of_a_finite_loss_skips_the_step_and_many_in_a_row_stop(deferred):
    """An inf gradient with a finite loss (one bad batch): clipping it would write NaN into every
    weight, so that step's update is skipped (weights and optimizer moments untouched) and training
    goes on. MAX_SKIPPED_IN_A_ROW such steps in a row stop the run with an error naming the gradient."""
    fp32 = resolve_precision("fp32", "cpu", verbose=False)
    reference, model = _tiny_model(), _tiny_model()
    t = AMPTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True), None, fp32, clip_grad=1.0,
                   deferred_checks=deferred)
    t_ref = AMPTrainer(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True), None, fp32,
                       clip_grad=1.0)

    def same_weights():
        for (k, a), b in zip(reference.state_dict().items(), model.state_dict().values()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=k)

    t.mlm_step(_batch(1)), t_ref.mlm_step(_batch(1))
    embeddings = model.bert.embeddings.word_embeddings.weight
    hook = embeddings.register_hook(lambda g: g + float("inf"))
    t.mlm_step(_batch(2))  # skipped
    hook.remove()
    t.check_finite()
    assert (t.step, t.skipped_steps) == (2, 1)
    same_weights()  # those of step 1
    t.mlm_step(_batch(3)), t_ref.mlm_step(_batch(3))  # training goes on, as if batch 2 had not been
    same_weights()
    assert t.optimizer.state[embeddings]["step"].item() == 2

    hook = embeddings.register_hook(lambda g: g + float("inf"))
    from bert_kit.training.trainer import MAX_SKIPPED_IN_A_ROW
    last = 3 + MAX_SKIPPED_IN_A_ROW
    with pytest.raises(NonFiniteLossError, match=rf"non-finite gradient in {MAX_SKIPPED_IN_A_ROW} steps in a row, "
                                                 rf"the last at step {last} \(loss=\d.*grad_norm=(inf|nan)\)"):
        for i in range(MAX_SKIPPED_IN_A_ROW):
            t.mlm_step(_batch(4 + i))
        t.check_finite()
    hook.remove()
    assert t.skipped_steps == 1 + MAX_SKIPPED_IN_A_ROW
    same_weights()  # still those of steps 1 and 3


@pytest.mark.parametrize("deferred", [False, True])
def test_a_run_survives_one_batch_with_a_non_finite_gradient(tmp_path, monkeypatch, capsys, deferred):
    """The whole loop: step 7's gradient is NaN with a finite loss; the step is skipped, the run
    ends normally, and the train record, the console and results.json say so."""
    original, calls = bert_kit.tasks.pretraining.compute_mlm_loss, {"n": 0}
    if deferred:
        _use_fused_adamw(monkeypatch)

    def poisoned(logits, labels):
        calls["n"] += 1
        loss = original(logits, labels)
        return loss + torch.sqrt(logits.sum() * 0.0) if calls["n"] == 7 else loss  # + 0, gradient NaN

    monkeypatch.setattr(bert_kit.tasks.pretraining, "compute_mlm_loss", poisoned)
    cfg = tiny_config(tmp_path, eval_every=0, log_every=5)
    results = pretrain(cfg)
    out = Path(cfg.output_dir)
    assert results["steps"] == cfg.max_steps and results["skipped_steps"] == 1
    assert (out / "final" / "model.safetensors").is_file()
    assert all(torch.isfinite(t).all() for t in load_file(out / "final" / "model.safetensors").values())
    assert [(r["step"], r["skipped_steps"]) for r in read_metrics(out) if "skipped_steps" in r] == [(10, 1)]
    printed = capsys.readouterr()
    assert "step 10: 1 step(s) since the last record skipped: non-finite gradient" in printed.out + printed.err


def test_deferred_checks_need_a_fused_optimizer():
    fp32 = resolve_precision("fp32", "cpu", verbose=False)
    model = _tiny_model()
    plain = AMPTrainer(model, create_optimizer(model, "adamw", 1e-3), None, fp32, deferred_checks=True)
    assert not plain.deferred  # the default CPU AdamW cannot skip an update on its own: reads losses back
    assert isinstance(plain.mlm_step(_batch(0)), float)


STEP_S, SAVE_S, EVAL_S = 0.1, 0.2, 0.1  # what a step, a checkpoint or model folder, an evaluation "take"
UNPATCHED = (AMPTrainer.train_step, bert_kit.tasks.pretraining.PretrainingJob.evaluate,
             bert_kit.training.loop.save_checkpoint, bert_kit.training.loop.write_folder_atomically)


def fake_work(monkeypatch, clock: FakeClock, first_step_s: float = STEP_S, eval_s: float = EVAL_S) -> None:
    """The loop on `clock`: every train step, checkpoint, model folder and evaluation advances it by
    a fixed amount (the first step by `first_step_s`), whatever the machine's speed."""
    clock.install(monkeypatch, bert_kit.training.clock)
    loop, (train_step, evaluate, save_checkpoint, write_folder) = bert_kit.training.loop, UNPATCHED

    def step(self, batch, loss_fn):
        clock.sleep(first_step_s if self.step == 0 else STEP_S)
        return train_step(self, batch, loss_fn)

    def timed(work, seconds):
        def call(*args, **kwargs):
            clock.sleep(seconds)
            return work(*args, **kwargs)
        return call

    monkeypatch.setattr(AMPTrainer, "train_step", step)
    monkeypatch.setattr(bert_kit.tasks.pretraining.PretrainingJob, "evaluate", timed(evaluate, eval_s))
    monkeypatch.setattr(loop, "save_checkpoint", timed(save_checkpoint, SAVE_S))
    monkeypatch.setattr(loop, "write_folder_atomically", timed(write_folder, SAVE_S))


def test_results_say_where_the_time_went(tmp_path, monkeypatch):
    """results.json "timings": launch to the first step, the first step, the other steps, the
    evaluations, checkpoints and the end add up to the wall time; on the fake clock, exactly."""
    clock = FakeClock()
    fake_work(monkeypatch, clock, first_step_s=3.0)
    cfg = tiny_config(tmp_path, max_steps=10, eval_every=5, save_every=5, log_every=1)
    results = pretrain(cfg)
    # 9 steps of 0.1 s; evaluations at step 5 and at the end; the checkpoint of step 5 (the end's is
    # written while the run ends: on this clock, no wait); final/ at the end
    assert results["timings"] == pytest.approx({"start_s": 0.0, "first_step_s": 3.0, "train_s": 0.9, "eval_s": 0.2,
                                                "save_s": SAVE_S, "end_s": SAVE_S}, abs=1e-6)
    assert sum(results["timings"].values()) == pytest.approx(results["wall_time_s"], abs=1e-3)
    on_disk = json.loads((Path(cfg.output_dir) / "results.json").read_text())
    assert on_disk["timings"] == results["timings"]


def test_a_time_budget_ends_the_run_and_drives_the_schedule(tmp_path, monkeypatch):
    """time_budget: the clock ends the run, the lr warms up and decays over the training time,
    final/ is written inside the budget; a resumed run gets only what is left. On a fake clock
    (tests/fake_clock.py): a step takes 0.1 s, a save 0.2 s, whatever the machine."""
    budget = 12.0
    clock = FakeClock()
    fake_work(monkeypatch, clock)
    cfg = tiny_config(tmp_path, max_steps=None, time_budget=f"{budget:g}s", warmup_fraction=0.2, eval_every=0,
                      save_every=0, log_every=1)
    results = pretrain(cfg)
    out = Path(cfg.output_dir)
    assert results["stopped"] is None and results["steps"] > 40 and (out / "final" / "model.safetensors").is_file()
    assert budget - 6 < results["wall_time_s"] <= budget  # the reserve (5 s) kept the end (eval, save) inside
    lrs = [r["lr"] for r in read_metrics(out) if r["type"] == "train"]
    peak = max(lrs)
    assert peak == pytest.approx(cfg.lr, rel=0.2)  # warmed up to the peak ...
    assert lrs.index(peak) > 5 and lrs[-1] < 0.35 * cfg.lr  # ... from below, then decayed with the clock
    state = torch.load(out / "checkpoints" / f"step-{results['steps']:07d}" / "trainer_state.pt", weights_only=True)
    assert 0 < state["budget_used_s"] <= budget

    # a first step that compiles for a third of the budget does not spend the warm-up: the lr rises
    # over the steps after it (it jumped to the peak at step 2, and a BERT stalled at unigram loss)
    fake_work(monkeypatch, clock, first_step_s=budget / 3)
    slow = tiny_config(tmp_path, "slow_first_step", max_steps=None, time_budget=f"{budget:g}s",
                       warmup_fraction=0.2, eval_every=0, save_every=0, log_every=1)
    results = pretrain(slow)
    lrs = [r["lr"] for r in read_metrics(Path(slow.output_dir)) if r["type"] == "train"]
    assert results["steps"] > 20 and lrs[1] < 0.5 * max(lrs) and max(lrs) == pytest.approx(slow.lr, rel=0.2)
    assert lrs[-1] < 0.35 * slow.lr and results["wall_time_s"] <= budget

    # evaluations that take most of the training time: the schedule runs on the clock, so the lr
    # still warms up and decays within it (it followed training time alone: here it never left
    # its warm-up, and in a 6-minute GPU run it ended at 7% of the peak)
    fake_work(monkeypatch, clock, eval_s=0.4)
    slow_eval = tiny_config(tmp_path, "slow_eval", max_steps=None, time_budget=f"{budget:g}s",
                            warmup_fraction=0.2, eval_every=5, save_every=0, log_every=1)
    results = pretrain(slow_eval)
    lrs = [r["lr"] for r in read_metrics(Path(slow_eval.output_dir)) if r["type"] == "train"]
    assert results["steps"] > 20 and max(lrs) == pytest.approx(slow_eval.lr, rel=0.2)  # warmed up ...
    assert lrs[-1] < 0.25 * slow_eval.lr and results["wall_time_s"] <= budget  # ... and decayed

    # interrupted at step 3 and resumed with the same budget: both sessions together stay within
    # it (give or take the stop's checkpoint, which the budget does not count)
    fake_work(monkeypatch, clock)
    monkeypatch.setattr(SignalAtStep, "at_step", 3)
    monkeypatch.setattr(bert_kit.training.loop, "ProgressLogger", SignalAtStep)
    again = tiny_config(tmp_path, "again", max_steps=None, time_budget=f"{budget:g}s", eval_every=0, save_every=0)
    first = pretrain(again)
    assert first["stopped"] == "SIGTERM" and first["steps"] == 3
    monkeypatch.setattr(bert_kit.training.loop, "ProgressLogger", ProgressLogger)
    second = pretrain(again, resume="latest")
    assert second["stopped"] is None and second["steps"] > 30
    assert budget - 6 < first["wall_time_s"] + second["wall_time_s"] <= budget + SAVE_S


def test_the_last_step_of_a_time_budget_is_recorded_and_its_time_counted_once(tmp_path, monkeypatch):
    """The budget ends between log steps: the last step still gets its train record, and the
    records' seconds add up to the steps' time on the fake clock (a step 0.1 s), no step twice."""
    fake_work(monkeypatch, FakeClock())
    cfg = tiny_config(tmp_path, max_steps=None, time_budget="9s", eval_every=0, save_every=0, log_every=7)
    results = pretrain(cfg)
    records = [r for r in read_metrics(Path(cfg.output_dir)) if r["type"] == "train"]
    assert results["steps"] % 7 != 0 and records[-1]["step"] == results["steps"]
    assert sum(r["seconds"] for r in records) == pytest.approx(results["steps"] * STEP_S, abs=1e-3)


def test_the_command_counts_its_start_up_against_the_time_budget(tmp_path, monkeypatch):
    """`bert-kit pretrain` hands the run the time of the process's launch, so start-up (importing
    torch, the interpreter's own start) counts against a time budget; a run's clock counts from
    what it is handed. Bounds that a slow machine only widens: the launch lies between the moment
    the parent started the process and the child's first line of code."""
    cfg = tiny_config(tmp_path, max_steps=2, eval_every=0, save_every=0)
    save_config(cfg, tmp_path / "run.yaml")
    seen = tmp_path / "started.json"
    code = ("import json, sys, time\n"
            "first_line, seen = time.time(), sys.argv[2]\n"
            "time.sleep(1.0)  # start-up the run must count\n"
            "import bert_kit.training.loop as loop\n"
            "start_run = loop.start_run\n"
            "def spy(cfg, resume, started=None, engine=None):\n"
            "    open(seen, 'w').write(json.dumps({'started': started, 'first_line': first_line}))\n"
            "    return start_run(cfg, resume, started, engine)\n"
            "loop.start_run = spy\n"
            "sys.argv = ['bert-kit', 'pretrain', '--config', sys.argv[1]]\n"
            "from bert_kit.cli import main\n"
            "sys.exit(main())\n")
    before_launch = time.time()
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "run.yaml"), str(seen)], check=True,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    times = json.loads(seen.read_text())
    # /proc counts in 10 ms ticks; a clock from the run's start would be >= 1 s past the first line
    assert before_launch - 0.1 <= times["started"] <= times["first_line"] + 0.1
    assert json.loads((Path(cfg.output_dir) / "results.json").read_text())["wall_time_s"] >= 1.0

    # a run handed a clock that started 6 s ago has 6 s less of its budget (fake clock: exact)
    budget = 15.0
    clock = FakeClock()
    fake_work(monkeypatch, clock)
    timed = tiny_config(tmp_path, "late", max_steps=None, time_budget=f"{budget:g}s", eval_every=0, save_every=0)
    results = pretrain(timed, started=clock.time() - 6.0)
    steps = (budget - 6.0 - 5.0) / STEP_S  # the budget less start-up and the end's 5 s reserve
    assert abs(results["steps"] - steps) <= 2 and budget - 6 < results["wall_time_s"] <= budget


def test_a_time_budget_keeps_time_for_a_slow_last_evaluation(tmp_path, monkeypatch):
    """Where the last evaluation is slow (a CPU: 20 held-out batches took 130 s against 35 s a step)
    and no periodic one timed it, the budget keeps time for it from the step time: the run ended
    134 s past a 150 s budget (283.6 s). On a fake clock a step takes 0.1 s and an evaluation
    batch a third of that: 7 s for 210 batches, more than the fixed 5 s reserve."""
    budget, batches = 20.0, 210
    fake_work(monkeypatch, FakeClock(), eval_s=STEP_S / 3 * batches)
    cfg = tiny_config(tmp_path, max_steps=None, time_budget=f"{budget:g}s", eval_every=0, save_every=0,
                      eval_batches=batches)
    results = pretrain(cfg)
    assert results["stopped"] is None and results["steps"] > 3
    assert results["wall_time_s"] <= budget  # with only the 5 s reserve: 22 s


def test_compiled_runs_get_prediction_slots_from_the_loader_workers():
    """compile: the training batches arrive with fixed prediction slots (built in the DataLoader's
    workers, not between steps), the same as `with_prediction_slots` on the plain batch; evaluation
    batches and uncompiled runs get none."""
    from types import SimpleNamespace

    from bert_kit.heads import with_prediction_slots
    from bert_kit.tasks.pretraining import make_loader, prediction_slots

    tokenizer = SimpleNamespace(pad_token_id=0, mask_token_id=4, vocab_size=1000, special_token_ids=frozenset(range(5)))
    examples = [{"input_ids": torch.tensor([2, *range(100 + i, 140 + i), 3])} for i in range(24)]
    cfg = PretrainConfig(seed=3, compile=True, num_workers=2, max_length=64, mask_probability=0.25)
    assert prediction_slots(cfg) == pytest.approx(0.30) and prediction_slots(PretrainConfig()) is None
    slotted = list(make_loader(cfg, examples, tokenizer, 6, True, torch.device("cpu")))
    plain = list(make_loader(PretrainConfig(seed=3, max_length=64, mask_probability=0.25, num_workers=2),
                             examples, tokenizer, 6, True, torch.device("cpu")))
    assert len(slotted) == len(plain) == 4
    for batch in slotted:  # 30% of the 6 x 64 positions, rounded up to 64 slots
        assert batch["masked_index"].shape == batch["masked_labels"].shape == (128,)
        want = with_prediction_slots({"labels": batch["labels"]}, prediction_slots(cfg))
        assert torch.equal(batch["masked_index"], want["masked_index"])
        assert torch.equal(batch["masked_labels"], want["masked_labels"])
        assert (batch["masked_labels"] != -100).sum() == (batch["labels"] != -100).sum() > 0
    evaluation = next(iter(make_loader(cfg, examples, tokenizer, 6, False, torch.device("cpu"))))
    assert "masked_index" not in evaluation and "masked_index" not in plain[0]
