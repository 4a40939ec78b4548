"""benchmarks/jax_step_profile.py (and `jax_pretrain.py --profile`, which shares its count): the GPU's
kernels of a profile, counted once a step each (not again in the lines XLA derives from them); the
steps it records, on a CPU: a profile of the steps asked for, the engine's step as it was after;
`--blocks in-turn`: a scanned encoder's blocks called in turn."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("jax")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("jax_step_profile", ROOT / "benchmarks" / "jax_step_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def xspace(*kernels: tuple[str, str, float]) -> bytes:
    """A profile of one GPU whose streams ran `kernels` (stream, name, microseconds), XLA's op line
    over them, and a host plane."""
    from jax.profiler import ProfileData

    names = sorted({name for _, name, _ in kernels} | {"fusion_op"})
    ids = {name: i + 1 for i, name in enumerate(names)}
    lines = {}
    for stream, name, us in kernels:
        lines.setdefault(stream, []).append(f"events {{ metadata_id: {ids[name]} duration_ps: {int(us * 1e6)} }}")
    lines["XLA Ops"] = [f"events {{ metadata_id: {ids['fusion_op']} duration_ps: 999000000 }}"]
    text = "planes { id: 1 name: \"/device:GPU:0\" "
    text += " ".join(f"lines {{ id: {i} name: \"{line}\" {' '.join(events)} }}"
                     for i, (line, events) in enumerate(lines.items(), 1))
    text += " ".join(f" event_metadata {{ key: {i} value {{ id: {i} name: \"{name}\" }} }}" for name, i in ids.items())
    text += " } planes { id: 2 name: \"/host:CPU\" lines { id: 1 name: \"python\" } }"
    return ProfileData.text_proto_to_serialized_xspace(text)


def test_kernels_are_summed_over_streams_and_files_per_step_and_listed_longest_first(bench, tmp_path):
    (tmp_path / "a" / "host").mkdir(parents=True)
    (tmp_path / "a" / "host" / "one.xplane.pb").write_bytes(xspace(
        ("Stream #13(Compute)", "gemm", 30.0), ("Stream #13(Compute)", "fusion_1", 10.0),
        ("Stream #14(Compute)", "gemm", 30.0), ("Stream #7(MemcpyD2D)", "memcpy", 2.0)))
    (tmp_path / "b.xplane.pb").write_bytes(xspace(("Stream #13(Compute)", "fusion_1", 10.0),
                                                  ("Stream #7(MemcpyD2D)", "memcpy", 2.0)))
    total, kernels = bench.kernel_times(tmp_path, steps=2)
    assert kernels == {"gemm": (pytest.approx(0.03), 1), "fusion_1": (pytest.approx(0.01), 1),
                       "memcpy": (pytest.approx(0.002), 1)}  # an XLA op line's 999 us: not a kernel
    assert total == pytest.approx(0.042)
    assert set(bench.kernel_times(tmp_path, steps=2, grouped=True)[1]) == {"gemm", "fusion", "memcpy"}  # fusion_1
    shown = bench.table(total, kernels, top=2).splitlines()
    assert shown[0] == "GPU: 0.042 ms a step in 3 kernels"
    assert [line.split()[-1] for line in shown[2:]] == ["gemm", "fusion_1"]


def test_the_steps_asked_for_are_recorded_and_the_engine_is_left_as_it_was(bench, tmp_path, minilm_path, data_dir):
    import bert_kit.jax.engine as engine
    from bert_kit.config import BertConfig
    from bert_kit.model import BERTModel
    from bert_kit.tokenizer import get_tokenizer

    folder = tmp_path / "encoder"
    torch.manual_seed(0)
    BERTModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(folder)
    get_tokenizer(minilm_path).save(folder)
    sst2, step = tmp_path / "sst2", engine.JaxEngine.step
    sst2.mkdir()
    for name, n in (("train.tsv", 24), ("dev.tsv", 8)):
        lines = (data_dir / "sst2" / name).read_text().splitlines()
        (sst2 / name).write_text("\n".join(lines[: n + 1]) + "\n")
    settings = ["--config", str(ROOT / "configs" / "finetune_sst2.yaml"), f"model={folder}", "engine=jax",
                f"train_file={sst2 / 'train.tsv'}", f"validation_file={sst2 / 'dev.tsv'}", "max_steps=5",
                "batch_size=4", "max_length=32", "precision=fp32", "max_eval_examples=8",
                f"output_dir={tmp_path / 'run'}", f"jax_cache={tmp_path / 'cache'}"]
    ms = bench.profile_run(settings, 2, 4, tmp_path / "profile")
    assert ms > 0 and list((tmp_path / "profile").rglob("*.xplane.pb"))
    assert engine.JaxEngine.step is step
    with pytest.raises(SystemExit, match="before step 6"):  # a run of 5 steps has no 6th to record
        bench.profile_run([*settings[:-2], f"output_dir={tmp_path / 'again'}", f"jax_cache={tmp_path / 'cache'}"],
                          2, 7, tmp_path / "profile2")
    assert engine.JaxEngine.step is step


def test_it_says_it_needs_a_gpu_and_checks_its_steps():
    script = [sys.executable, str(ROOT / "benchmarks" / "jax_step_profile.py"), "--model", "m", "--data-dir", "d"]
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(script, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "no GPU here (JAX's backend is cpu)" in out.stderr
    out = subprocess.run([*script, "--steps", "1:5"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "want A:B with 1 < A < B" in out.stderr


def test_in_turn_runs_a_scanned_encoders_blocks_one_after_the_other(bench, monkeypatch):
    from flax import nnx

    import bert_kit.jax as bj
    import bert_kit.jax.model as model
    from tests.jax.common import max_abs, padded_batch, tiny

    config = tiny(num_hidden_layers=3)
    classifier = bj.BERTForSequenceClassification(config, num_labels=2, rngs=nnx.Rngs(0))
    batch = padded_batch(config, [9, 4], 9)
    loop = classifier(**batch)
    classifier.bert.encoder.scan = True
    scanned, called = [], []
    monkeypatch.setattr(model, "scan_blocks", lambda *args: scanned.append(1) or bench.blocks_in_turn(*args))
    block = model.TransformerEncoderBlock.__call__
    monkeypatch.setattr(model.TransformerEncoderBlock, "__call__",
                        lambda self, *args: called.append(1) or block(self, *args))
    assert max_abs(classifier(**batch), loop) == 0.0 and scanned == [1] and len(called) == 3
