"""`bert-kit finetune ... engine=jax` on cuts of the real SST-2 and CoNLL-2003 files (CPU): the same
losses as the torch engine from the same weights and batches (dropout off, fp32; the last batch
padded with rows that carry no label), best/ scored by `bert-kit evaluate` (PyTorch) as the JAX run
scored it, and a torch run's checkpoint refused by the JAX engine. Regression's padded rows:
tests/jax/test_engine.py.

Run: .venv/bin/python -m pytest tests/jax/test_engine_finetune.py -q
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from bert_kit.checks import ConfigError  # noqa: E402
from bert_kit.cli import main as cli  # noqa: E402
from bert_kit.config import BertConfig  # noqa: E402
from bert_kit.jax.engine import STATE_FILE  # noqa: E402
from bert_kit.model import BERTModel  # noqa: E402
from bert_kit.tasks.finetuning import FinetuneConfig, finetune  # noqa: E402
from bert_kit.tokenizer import get_tokenizer  # noqa: E402
from bert_kit.training.checkpoint import latest_checkpoint  # noqa: E402
from bert_kit.training.progress import read_metrics  # noqa: E402


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, minilm_path):
    """A random 1-layer, 32-wide encoder without dropout (the engines then compute the same steps),
    with MiniLM's tokenizer."""
    folder = tmp_path_factory.mktemp("encoder")
    torch.manual_seed(0)
    BERTModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)).save_pretrained(folder)
    get_tokenizer(minilm_path).save(folder)
    return folder


@pytest.fixture(scope="module")
def sst2(data_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sst2")
    for name, n in (("train.tsv", 44), ("dev.tsv", 24)):
        lines = (data_dir / "sst2" / name).read_text().splitlines()
        (folder / name).write_text("\n".join(lines[: n + 1]) + "\n")
    return folder / "train.tsv", folder / "dev.tsv"


def config(encoder: Path, out: Path, engine: str, **overrides) -> FinetuneConfig:
    # batches of 12 over 44 examples: the fourth holds 8, which the JAX engine pads to 12 rows
    settings = dict(model=str(encoder), output_dir=str(out), engine=engine, batch_size=12, lr=1e-3, log_every=1,
                    precision="fp32", device="cpu", seed=3, max_steps=4, max_length=32, eval_every=2,
                    end_checkpoint=True)  # the checkpoints the resume below is refused
    return FinetuneConfig(**{**settings, **overrides})


def records(out: Path, kind: str) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(out) if r["type"] == kind}


def assert_same_steps(jax_run: Path, torch_run: Path, tolerance: float = 1e-4) -> None:
    got, expected = records(jax_run, "train"), records(torch_run, "train")
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
    for step, r in expected.items():
        assert abs(got[step]["loss"] - r["loss"]) <= tolerance, (step, got[step]["loss"], r["loss"])
        assert got[step]["lr"] == r["lr"] and got[step]["examples"] == r["examples"]  # the schedule, the data
        assert abs(got[step]["grad_norm"] - r["grad_norm"]) <= tolerance * max(1.0, r["grad_norm"])


def assert_same_evaluations(jax_run: Path, torch_run: Path, keys: tuple[str, ...], tolerance: float) -> None:
    got, expected = records(jax_run, "eval"), records(torch_run, "eval")
    assert sorted(got) == sorted(expected) == [2, 4]
    for step in got:
        for key in keys:
            assert abs(got[step][key] - expected[step][key]) <= tolerance, (step, key, got[step], expected[step])


def test_classification_takes_torchs_steps_and_evaluate_agrees(encoder, sst2, tmp_path):
    train, dev = sst2
    files = dict(train_file=str(train), validation_file=str(dev), label_names=["negative", "positive"])
    finetune(config(encoder, tmp_path / "torch", "torch", **files))
    results = finetune(config(encoder, tmp_path / "jax", "jax", **files))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    assert_same_evaluations(tmp_path / "jax", tmp_path / "torch", ("loss",), 1e-4)
    assert_same_evaluations(tmp_path / "jax", tmp_path / "torch", ("accuracy",), 0.0)

    # best/ is the torch engine's folder: `bert-kit evaluate` (PyTorch) scores it as the JAX run did
    best = tmp_path / "jax" / "best"
    assert results["best_model"] == str(best) and (best / "model.safetensors").is_file()
    assert json.loads((best / "config.json").read_text())["id2label"] == {"0": "negative", "1": "positive"}
    assert cli(["evaluate", "--model", str(best), "--data", str(dev), "--output", str(tmp_path / "eval.json")]) == 0
    scored = json.loads((tmp_path / "eval.json").read_text())
    kept = results["best_metrics"]
    assert abs(scored["loss"] - kept["loss"]) <= 1e-4 and scored["accuracy"] == kept["accuracy"]
    assert (latest_checkpoint(tmp_path / "jax") / STATE_FILE).is_file()

    # a torch run's checkpoint, extended: the engine is a setting that shapes the run, and forced, it is
    # still refused
    with pytest.raises(ConfigError, match="engine: 'torch' -> 'jax'"):
        finetune(config(encoder, tmp_path / "torch", "jax", max_steps=6, **files), resume="latest")
    with pytest.raises(ValueError, match=r"step-0000004 was written by engine=torch: resume it with engine=torch"):
        finetune(config(encoder, tmp_path / "torch", "jax", max_steps=6, force_resume=True, **files), resume="latest")


def test_lamb_takes_torchs_steps(encoder, sst2, tmp_path):
    """optimizer=lamb: each matrix's update scaled by its trust ratio, biases and LayerNorm not
    (`bert_kit.training.optim.LAMB`); decay on, so the decoupled term enters the ratio."""
    train, dev = sst2
    files = dict(train_file=str(train), validation_file=str(dev), optimizer="lamb", weight_decay=0.1, lr=1e-2)
    finetune(config(encoder, tmp_path / "torch", "torch", **files))
    finetune(config(encoder, tmp_path / "jax", "jax", **files))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    end = "checkpoints/step-0000004/model.safetensors"
    got, expected = (load_file(tmp_path / run / end) for run in ("jax", "torch"))
    assert sorted(got) == sorted(expected)
    for name in expected:  # (Adam's m / sqrt(v) on rare tokens' rows amplifies float noise to ~6e-5)
        torch.testing.assert_close(got[name], expected[name], atol=1e-4, rtol=1e-4, msg=name)
    # AdamW's steps are not these: the ratio moves the weights
    finetune(config(encoder, tmp_path / "adamw", "jax", **{**files, "optimizer": "adamw"}))
    adamw = load_file(tmp_path / "adamw" / end)
    assert max((adamw[n] - expected[n]).abs().max().item() for n in expected) > 1e-3


def scale_of(run: Path, step: int) -> tuple[float, int]:
    """(loss scale, finite steps since it changed) in a checkpoint's optimizer.safetensors."""
    saved = load_file(run / "checkpoints" / f"step-{step:07d}" / STATE_FILE)
    return float(saved["loss_scale"]), int(saved["good_steps"])


def test_fp16_scales_the_loss_as_torchs_grad_scaler_and_resumes_with_its_scale(encoder, sst2, tmp_path,
                                                                               monkeypatch):
    """precision=fp16: float16 compute with a dynamic loss scale (GradScaler's rules). Its losses are
    the fp32 run's; from a scale that overflows this model's fp16 gradients, the first steps are
    skipped, each halving it, and training goes on (not counted as non-finite skips); a resumed run
    carries the scale on as the straight one."""
    import bert_kit.jax.train as jax_train

    train, dev = sst2
    files = dict(train_file=str(train), validation_file=str(dev), max_steps=8, eval_every=0, save_every=4,
                 schedule="constant", warmup_steps=0)
    finetune(config(encoder, tmp_path / "fp32", "jax", **files))
    results = finetune(config(encoder, tmp_path / "fp16", "jax", precision="fp16", **files))
    assert "fp16 compute + dynamic loss scaling" in results["precision"] and "many times slower" in results["precision"]
    got, expected = records(tmp_path / "fp16", "train"), records(tmp_path / "fp32", "train")
    for step, r in expected.items():
        assert abs(got[step]["loss"] - r["loss"]) <= 2e-3 and got[step]["grad_norm"] == pytest.approx(
            r["grad_norm"], rel=5e-3), step
    assert scale_of(tmp_path / "fp16", 8) == (2.0 ** 16, 8)  # no overflow: the scale never moved

    monkeypatch.setattr(jax_train, "INIT_SCALE", 2.0 ** 26)
    results = finetune(config(encoder, tmp_path / "high", "jax", precision="fp16", **files))
    norms = [records(tmp_path / "high", "train")[step]["grad_norm"] for step in range(1, 9)]
    overflowed = sum(not math.isfinite(n) for n in norms)
    assert 1 <= overflowed < 8 and all(math.isfinite(n) for n in norms[overflowed:]), norms
    assert scale_of(tmp_path / "high", 8) == (2.0 ** (26 - overflowed), 8 - overflowed)
    assert results["skipped_steps"] == 0 and results["stopped"] is None

    # growth after GROWTH_INTERVAL finite steps, and a resume that carries the scale on
    monkeypatch.setattr(jax_train, "INIT_SCALE", 2.0 ** 16)
    monkeypatch.setattr(jax_train, "GROWTH_INTERVAL", 3)
    finetune(config(encoder, tmp_path / "straight", "jax", precision="fp16", **files))
    assert scale_of(tmp_path / "straight", 4) == (2.0 ** 17, 1) and scale_of(tmp_path / "straight", 8) == (2.0 ** 18, 2)
    finetune(config(encoder, tmp_path / "resumed", "jax", precision="fp16", **{**files, "max_steps": 4}))
    finetune(config(encoder, tmp_path / "resumed", "jax", precision="fp16", **files), resume="latest")
    assert scale_of(tmp_path / "resumed", 8) == scale_of(tmp_path / "straight", 8)
    end = "checkpoints/step-0000008/model.safetensors"
    resumed, straight = (load_file(tmp_path / run / end) for run in ("resumed", "straight"))
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], atol=0, rtol=0, msg=name)


def test_long_texts_in_windows_take_torchs_steps_and_pool_alike(encoder, sst2, tmp_path):
    """long_text chunks: the windows are the JAX engine's examples as they are torch's, and each
    evaluation pools a text's windows the same way (`ClassificationTask.score`)."""
    train, dev = sst2
    files = dict(train_file=str(train), validation_file=str(dev), label_names=["negative", "positive"],
                 max_length=16, classification={"long_text": "chunks", "chunk_stride": 4})
    finetune(config(encoder, tmp_path / "torch", "torch", **files))
    finetune(config(encoder, tmp_path / "jax", "jax", **files))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    evals, expected = records(tmp_path / "jax", "eval"), records(tmp_path / "torch", "eval")
    for step in evals:
        assert evals[step]["num_examples"] == 24  # texts, not windows
        assert abs(evals[step]["loss"] - expected[step]["loss"]) <= 1e-4
        assert evals[step]["accuracy"] == expected[step]["accuracy"]


def test_class_weights_take_torchs_steps(encoder, sst2, tmp_path):
    train, dev = sst2
    files = dict(train_file=str(train), validation_file=str(dev), label_names=["negative", "positive"],
                 classification={"class_weights": [0.3, 2.0]})
    finetune(config(encoder, tmp_path / "torch", "torch", **files))
    finetune(config(encoder, tmp_path / "jax", "jax", **files))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")


def test_a_run_takes_the_programs_an_earlier_run_of_its_settings_traced(encoder, sst2, tmp_path, monkeypatch):
    """The train step and evaluation a run traced (`jax.trace_cache`) are read back by a run of the
    same settings, which takes the same steps; a run whose head differs in one constant (a class
    weight) traces its own, and takes the steps of a run that keeps no traced programs."""
    import bert_kit.jax.engine as engine_module
    from bert_kit.jax.compilation import kept
    from bert_kit.jax.trace_cache import TraceCache

    counts = []
    original = TraceCache.load

    def load(self, fn, options, args, *rest):
        before = (self.traced, self.loaded)
        program = original(self, fn, options, args, *rest)
        counts.append((fn.__name__, self.traced - before[0], self.loaded - before[1]))
        return program

    monkeypatch.setattr(TraceCache, "load", load)
    train, dev = sst2
    files = dict(train_file=str(train), validation_file=str(dev), label_names=["negative", "positive"], seed=17)

    def run(name, weights):
        counts.clear()
        finetune(config(encoder, tmp_path / name, "jax", classification={"class_weights": weights}, **files))
        kept()  # the programs it wrote once compiled (a process's exit waits for them)
        return [(r["loss"], r["grad_norm"]) for r in records(tmp_path / name, "train").values()], list(counts)

    first, traced = run("first", [0.7, 1.9])
    again, loaded = run("again", [0.7, 1.9])
    other, other_counts = run("other", [0.7, 2.9])
    monkeypatch.setattr(engine_module, "kept_traces", lambda: None)
    untraced, _ = run("untraced", [0.7, 2.9])
    assert {name for name, _, _ in traced} == {"initial_leaves", "train_step", "outputs"}
    assert all(t == 1 and r == 0 for _, t, r in traced), traced  # (settings no other test runs)
    assert all(t == 0 and r == 1 for _, t, r in loaded) and len(loaded) == len(traced)
    assert all(t == 1 and r == 0 for _, t, r in other_counts)
    assert again == first  # the same program: the same numbers
    assert other == untraced != first


def test_label_sets_take_torchs_steps_and_score_as_it_does(encoder, sst2, tmp_path):
    """Several labels per text (JSON lists, rows with none among them), balanced pos_weight and
    thresholds tuned on the validation set: the JAX engine's steps and scores are the torch engine's."""
    texts = [line.split("\t")[0] for line in sst2[0].read_text().splitlines()[1:]]
    sets = [["joy"], ["anger", "joy"], [], ["fear"], ["joy", "fear"]]
    for name, rows in (("train", texts[:44]), ("dev", texts[20:44])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": t, "labels": sets[i % 5]}) + "\n"
                                                        for i, t in enumerate(rows)))
    files = dict(train_file=str(tmp_path / "train.jsonl"), validation_file=str(tmp_path / "dev.jsonl"),
                 text_column="text", label_column="labels",
                 classification={"class_weights": "balanced", "threshold": "tune"})
    finetune(config(encoder, tmp_path / "torch", "torch", **files))
    results = finetune(config(encoder, tmp_path / "jax", "jax", **files))
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    assert_same_evaluations(tmp_path / "jax", tmp_path / "torch", ("loss",), 1e-4)
    assert_same_evaluations(tmp_path / "jax", tmp_path / "torch", ("f1", "f1_micro", "f1_samples", "subset_accuracy"),
                            1e-6)
    best = json.loads((tmp_path / "jax" / "best" / "config.json").read_text())
    assert best["problem_type"] == "multi_label_classification" and results["metric"] == "f1"


def test_token_classification_on_conll_and_evaluate_agrees(encoder, data_dir, tmp_path):
    def cut(name: str, n_lines: int) -> Path:  # whole sentences; train holds every tag of the validation lines
        lines = (data_dir / "conll2003" / name).read_text().splitlines()[:n_lines]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        return tmp_path / name

    valid = cut("valid.txt", 120)
    cfg = config(encoder, tmp_path / "run", "jax", task="token-classification", train_file=str(cut("train.txt", 800)),
                 validation_file=str(valid), lr=5e-3)
    results = finetune(cfg)
    best = tmp_path / "run" / "best"
    assert results["best_model"] == str(best) and results["metric"] == "f1"
    assert cli(["evaluate", "--model", str(best), "--data", str(valid), "--output", str(tmp_path / "eval.json")]) == 0
    scored, kept = json.loads((tmp_path / "eval.json").read_text()), results["best_metrics"]
    for key in ("f1", "precision", "recall", "accuracy"):
        assert abs(scored[key] - kept[key]) <= 1e-4, key
    assert kept["accuracy"] > 0.3  # a trained head: "O" alone is most of the words


def test_a_short_fine_tune_is_compiled_sooner_and_takes_torchs_steps(minilm_path, sst2, tmp_path, monkeypatch,
                                                                      capsys):
    """On a GPU, a fine-tune of at most SHORT_MAX_STEPS steps traces one block (`BertEncoder.scan`)
    and runs its gradients and its update as two programs, compiled ahead, with the loop's losses; a
    longer one calls the blocks in turn in one program a step, as a CPU does (here the CPU is taken
    for a GPU, then not)."""
    import bert_kit.jax.engine as engine
    import bert_kit.jax.model as model
    from bert_kit.jax.compilation import AheadOfTime

    folder = tmp_path / "two-layers"
    torch.manual_seed(0)
    BERTModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)).save_pretrained(folder)
    get_tokenizer(minilm_path).save(folder)
    traced, scan_blocks, compiled, compile = [], model.scan_blocks, [], AheadOfTime.compile
    monkeypatch.setattr(model, "scan_blocks", lambda *args: traced.append(1) or scan_blocks(*args))
    monkeypatch.setattr(AheadOfTime, "compile", lambda self, args: compiled.append(self.fn.__name__)
                        or compile(self, args))
    monkeypatch.setattr(engine, "SHORT_PLATFORMS", ("gpu", "cpu"))
    monkeypatch.setattr(engine, "COMPILE_AHEAD_ON_CPU", True)
    train, dev = sst2
    files = dict(train_file=str(train), validation_file=str(dev), label_names=["negative", "positive"])
    finetune(config(folder, tmp_path / "torch", "torch", **files))
    finetune(config(folder, tmp_path / "jax", "jax", **files))
    assert traced  # 4 steps: scanned
    assert sorted(set(compiled) - {"outputs", "initial_leaves"}) == ["gradients", "update"]
    assert compiled.count("update") == 1
    assert "compiled ahead does not take" not in capsys.readouterr().err
    assert_same_steps(tmp_path / "jax", tmp_path / "torch")
    traced.clear(), compiled.clear()
    monkeypatch.setattr(engine, "SHORT_MAX_STEPS", 3)
    finetune(config(folder, tmp_path / "loop", "jax", **files))
    assert not traced and set(compiled) - {"outputs", "initial_leaves"} == {"train_step"}
    assert_same_steps(tmp_path / "loop", tmp_path / "torch")
    monkeypatch.setattr(engine, "SHORT_MAX_STEPS", 500)
    monkeypatch.setattr(engine, "SHORT_PLATFORMS", ("gpu",))
    finetune(config(folder, tmp_path / "cpu", "jax", **files))
    assert not traced
