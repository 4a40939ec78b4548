"""The NumPy runner: the shipped config learns the synthetic task (MLM and NSP losses fall, NSP
accuracy far above chance) in well under a minute, the CLI writes its JSON, and bad YAML gives
errors that name the file, the key or the line.

Run: .venv/bin/python -m pytest tests/numpy_ref/test_runner.py -q
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bert_kit.numpy_ref import BertRunner, RunConfig, main

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "numpy_ref.yaml"
TINY = {"steps": 3, "num_train_batches": 2, "num_test_batches": 4, "batch_size": 4, "log_every": 1}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_shipped_config_learns_the_synthetic_task():
    results = BertRunner(CONFIG).run()
    # Chance: MLM ~ ln(24) = 3.2 (the untrained model is at ~3.35), NSP ln 2 = 0.69.
    assert results["initial_test_mlm_loss"] > 3.0
    assert results["test_mlm_loss"] < 0.5 * results["initial_test_mlm_loss"]
    assert results["train_mlm_loss"] < 0.5 * results["initial_test_mlm_loss"]
    assert results["test_nsp_loss"] < 0.3 < results["initial_test_nsp_loss"]
    assert results["train_nsp_loss"] < 0.3
    assert results["test_nsp_accuracy"] > 0.9


def test_defaults_equal_the_shipped_config():
    assert BertRunner(None).config == BertRunner(CONFIG).config


def test_main_prints_and_writes_json(tmp_path, capsys):
    config = write(tmp_path, "".join(f"{k}: {v}\n" for k, v in TINY.items()))
    output = tmp_path / "out" / "results.json"
    results = main(["--config", str(config), "--output", str(output)])
    written = json.loads(output.read_text())
    assert written == json.loads(capsys.readouterr().out)
    assert set(written) >= {"train_mlm_loss", "train_nsp_loss", "test_mlm_loss", "test_nsp_loss",
                            "test_nsp_accuracy"}
    assert all(math.isfinite(written[k]) for k in ("test_mlm_loss", "test_nsp_loss"))  # test set has both kinds
    assert written == results


def test_module_entry_point(tmp_path):
    config = write(tmp_path, "".join(f"{k}: {v}\n" for k, v in TINY.items()))
    output = tmp_path / "results.json"
    command = [sys.executable, "-m", "bert_kit.numpy_ref", "--config", str(config), "--output", str(output)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "step 3/3" in proc.stderr  # progress is logged
    assert 0.0 <= json.loads(output.read_text())["test_nsp_accuracy"] <= 1.0
    bad = subprocess.run([sys.executable, "-m", "bert_kit.numpy_ref", "--config", str(tmp_path / "nope.yaml")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "config file not found" in bad.stderr


def test_unknown_key_names_it_and_lists_valid_keys(tmp_path):
    path = write(tmp_path, "steps: 5\nlearning_rate: 0.1\n")
    with pytest.raises(ValueError, match=r"run.yaml: unknown key\(s\) \['learning_rate'\]; valid keys: \[.*'lr'"):
        BertRunner(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file not found: .*absent.yaml"):
        BertRunner(tmp_path / "absent.yaml")


def test_yaml_syntax_error_gives_the_line(tmp_path):
    path = write(tmp_path, "steps: 5\nlr: [0.1\nseed: 1\n")
    with pytest.raises(ValueError, match=r"run.yaml:3: invalid YAML: expected ',' or '\]'"):
        BertRunner(path)
    with pytest.raises(ValueError, match="top level must be a mapping"):
        BertRunner(write(tmp_path, "- steps\n- lr\n"))
    with pytest.raises(ValueError, match=r"run.yaml:3: duplicate key 'steps' \(first on line 1\)"):
        BertRunner(write(tmp_path, "steps: 5\nlr: 0.1\nsteps: 50\n"))  # the last one won, silently


def test_bad_values_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="steps must be int, got 'ten'"):
        BertRunner(write(tmp_path, "steps: ten\n"))
    with pytest.raises(ValueError, match=r"dim_model \(30\) must be divisible by num_heads \(4\)"):
        BertRunner(write(tmp_path, "dim_model: 30\nnum_heads: 4\n"))
    with pytest.raises(ValueError, match="dtype must be one of"):
        BertRunner(write(tmp_path, "dtype: float16\n"))
    assert BertRunner(write(tmp_path, "lr: 5e-1\n")).config.lr == 0.5  # YAML 1.1 gives the string "5e-1"
    with pytest.raises(ValueError, match="lr must be float, got 'fast'"):
        BertRunner(write(tmp_path, "lr: fast\n"))
    with pytest.raises(ValueError, match="lr must be > 0"):
        RunConfig(lr=0.0)
    with pytest.raises(ValueError, match="unknown key"):
        BertRunner(overrides={"stepz": 1})
