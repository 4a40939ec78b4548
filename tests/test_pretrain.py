"""Pretraining end to end on tiny configs (CPU): exact resume, signals, NaN stop, clear errors,
the CLI with its files, and the AMPTrainer's accumulation and precisions.

Run: .venv/bin/python -m pytest tests/test_pretrain.py -q
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

import bert_kit.amp
import bert_kit.pretrain
from bert_kit.amp import AMPTrainer, NonFiniteLossError
from bert_kit.checkpoint import latest_checkpoint, list_checkpoints, load_trainer_state
from bert_kit.cli import main as cli
from bert_kit.config import BertConfig
from bert_kit.heads import BERTForPreTraining
from bert_kit.model import set_low_precision_residual
from bert_kit.optim import create_optimizer
from bert_kit.precision import resolve_precision
from bert_kit.pretrain import PretrainConfig, plan_phases, pretrain
from bert_kit.progress import ProgressLogger, read_metrics
from bert_kit.runconfig import load_config
from bert_kit.tokenizer import train_tokenizer

torch.set_num_threads(1)  # tiny models: threads only add contention on a shared machine
REPO = Path(__file__).resolve().parents[1]
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
    monkeypatch.setattr(bert_kit.pretrain, "ProgressLogger", SignalAtStep)
    assert cli(["pretrain", "--config", str(cfg_file), *args]) == 143
    monkeypatch.setattr(bert_kit.pretrain, "ProgressLogger", ProgressLogger)
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
    from bert_kit.runconfig import save_config

    save_config(cfg, config_file)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "bert_kit", "pretrain", "--config", str(config_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    metrics = Path(cfg.output_dir) / "metrics.jsonl"
    try:
        deadline = time.time() + 45
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.time() < deadline, "training did not start"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
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


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    original, calls = bert_kit.amp.compute_mlm_loss, {"n": 0}

    def poisoned(logits, labels):
        calls["n"] += 1
        loss = original(logits, labels)
        return loss * float("nan") if calls["n"] == 13 else loss  # micro-batch 13 = step 13

    monkeypatch.setattr(bert_kit.amp, "compute_mlm_loss", poisoned)
    cfg = tiny_config(tmp_path, save_every=5, eval_every=0)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 13 .*mlm_loss=nan.*step-0000010"):
        pretrain(cfg)
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


def test_bad_config_and_data_give_clear_errors(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("max_steps: 2\n")

    def error_of(*argv: str) -> str:
        assert cli(["pretrain", *argv]) == 1
        return capsys.readouterr().err

    err = error_of("--config", str(tmp_path / "missing.yaml"))
    assert "config file not found" in err and "missing.yaml" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: 2\nlearning_rate: 0.1\n")
    err = error_of("--config", str(bad))
    assert "learning_rate" in err and "valid keys" in err and "warmup_steps" in err
    assert "max_steps: expected an integer, got 'ten'" in error_of("--config", str(good), "max_steps=ten")
    err = error_of("--config", str(good), f"train_files=[{tmp_path / 'nope.txt'}]", "train_tokenizer={vocab_size: 50}",
                   f"output_dir={tmp_path / 'o1'}")
    assert "nope.txt" in err

    broken = tmp_path / "train.jsonl"
    broken.write_text('{"text": "a fine first line."}\n{"text": oops}\n')
    err = error_of("--config", str(good), f"train_files=[{broken}]", "corpus_format=jsonl",
                   f"tokenizer={tmp_path / 'tok'}", f"output_dir={tmp_path / 'o2'}")
    assert "tokenizer folder not found" in err
    write_corpus(tmp_path / "c.txt")
    assert cli(["tokenizer", "train", "--files", str(tmp_path / "c.txt"), "--vocab-size", "80",
                "--output", str(tmp_path / "tok")]) == 0
    capsys.readouterr()
    err = error_of("--config", str(good), f"train_files=[{broken}]", "corpus_format=jsonl",
                   f"tokenizer={tmp_path / 'tok'}", f"output_dir={tmp_path / 'o3'}", "nsp=false")
    assert "train.jsonl:2" in err and "invalid JSON" in err
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00bad" * 10)
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
    # resuming a finished run trains nothing and evaluates the same weights on the same masks again
    again = pretrain(cfg, resume="latest")
    assert again["steps"] == 6 and again["train_tokens"] == 0
    assert again["test_mlm_loss"] == results["test_mlm_loss"]
    assert again["train_mlm_loss"] is not None


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
