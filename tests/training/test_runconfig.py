"""Run settings: YAML + key=value overrides -> dataclass, with errors that name the culprit.

Run: .venv/bin/python -m pytest tests/training/test_runconfig.py -q
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

import pytest
import yaml

from bert_kit.training.runconfig import (add_config_arguments, apply_overrides, coerce, config_from_dict, field_help,
                                load_config, save_config)


@dataclass
class Settings:
    """A small stand-in for a run config."""

    lr: float = 1e-4  # peak learning rate
    steps: int = 10  # optimizer steps
    name: str = "run"
    flag: bool = False
    schedule: Literal["linear", "cosine"] = "linear"
    """decay after warmup"""
    warmup: int | None = None  # optional warmup steps
    files: list[str] = field(default_factory=list)
    model: dict | str = "bert-mini"


def test_yaml_and_overrides_are_coerced_to_field_types(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1e-3\nsteps: 20\nfiles: a.txt\nschedule: cosine\n")
    cfg = load_config(Settings, path, ["steps=30", "flag=yes", "warmup=null", "name=123", "lr=2.5e-4"])
    assert cfg.lr == 2.5e-4 and isinstance(cfg.lr, float)
    assert cfg.steps == 30 and isinstance(cfg.steps, int)
    assert cfg.flag is True
    assert cfg.warmup is None
    assert cfg.name == "123"  # a number given for a str field stays text
    assert cfg.files == ["a.txt"]  # a single file name becomes a one-element list
    assert cfg.schedule == "cosine"
    # YAML's "1e-3" (no dot) is a string; coercion still makes it a float
    assert load_config(Settings, path).lr == pytest.approx(1e-3, rel=0, abs=0)


def test_unknown_key_is_named_with_the_valid_keys(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1.0e-3\nlearning_rate: 3\n")
    with pytest.raises(ValueError) as err:
        load_config(Settings, path)
    message = str(err.value)
    assert "learning_rate" in message and str(path) in message
    for key in ("lr", "steps", "schedule", "files"):
        assert key in message
    with pytest.raises(ValueError, match=r"unknown key 'stepz'.*valid keys: lr, steps"):
        load_config(Settings, None, ["stepz=3"])


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config(Settings, missing)


def test_bad_override_types_give_clear_errors():
    with pytest.raises(ValueError, match=r"steps: expected an integer, got 'abc'"):
        load_config(Settings, None, ["steps=abc"])
    with pytest.raises(ValueError, match=r"steps: expected an integer, got 1.5"):
        load_config(Settings, None, ["steps=1.5"])
    with pytest.raises(ValueError, match=r"flag: expected a boolean"):
        load_config(Settings, None, ["flag=maybe"])
    with pytest.raises(ValueError, match=r"schedule='cos' is not a valid choice: expected one of 'linear', 'cosine'"):
        load_config(Settings, None, ["schedule=cos"])
    with pytest.raises(ValueError, match="not of the form key=value"):
        load_config(Settings, None, ["steps"])
    with pytest.raises(ValueError, match="lr: expected a number"):
        config_from_dict(Settings, {"lr": [1, 2]})


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("lr: 1\nsteps: [1, 2\nname: x\n")
    with pytest.raises(ValueError, match=r"broken.yaml:\d+: invalid YAML"):
        load_config(Settings, path)


def test_dotted_override_sets_a_key_inside_a_mapping():
    data = apply_overrides({"model": "bert-mini"}, ["model.hidden_dropout_prob=0.0"], Settings)
    assert data["model"] == {"preset": "bert-mini", "hidden_dropout_prob": 0.0}
    data = apply_overrides({"model": {"preset": "bert-tiny"}}, ["model.num_hidden_layers=3"], Settings)
    assert data["model"] == {"preset": "bert-tiny", "num_hidden_layers": 3}


def test_coerce_union_and_lists():
    assert coerce("7", int | None, "x") == 7
    assert coerce("none", int | None, "x") is None
    assert coerce(["1", 2.0], list[int], "x") == [1, 2]
    with pytest.raises(ValueError, match=r"x\[1\]: expected an integer"):
        coerce([1, "b"], list[int], "x")


def test_save_and_reload_round_trip(tmp_path):
    cfg = load_config(Settings, None, ["steps=42", "files=[a, b]", "schedule=cosine"])
    path = save_config(cfg, tmp_path / "out" / "run_config.yaml")
    assert yaml.safe_load(path.read_text())["steps"] == 42
    assert load_config(Settings, path) == cfg


def test_help_comes_from_comments_and_attribute_docstrings():
    helps = field_help(Settings)
    assert helps["lr"] == "peak learning rate"
    assert helps["schedule"] == "decay after warmup"
    assert helps["warmup"] == "optional warmup steps"
    assert "name" not in helps
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Settings)
    text = parser.format_help()
    assert "peak learning rate" in text and "'linear' | 'cosine'" in text
    args = parser.parse_args(["--config", "x.yaml", "lr=1", "steps=2"])
    assert args.config == "x.yaml" and args.overrides == ["lr=1", "steps=2"]


def test_pretrain_config_validates_ranges_and_phases():
    from bert_kit.tasks.pretraining import PretrainConfig

    with pytest.raises(ValueError, match=r"overrides: batch_size=0 is out of range: expected an integer >= 1"):
        load_config(PretrainConfig, None, ["batch_size=0"])
    with pytest.raises(ValueError, match=r"phases\[1\]: unknown key\(s\) \['seq_len'\]"):
        PretrainConfig(phases=[{"fraction": 0.5}, {"fraction": 0.5, "seq_len": 512}])
    with pytest.raises(ValueError, match="fractions must add up to 1"):
        PretrainConfig(phases=[{"fraction": 0.5}, {"fraction": 0.4}])
    with pytest.raises(ValueError, match=r"train_tokenizer: unknown key\(s\) \['size'\]"):
        load_config(PretrainConfig, None, ["train_tokenizer={size: 100}"])
    help_text = field_help(PretrainConfig)
    assert "peak learning rate" in help_text["lr"]


def test_environment_variables_and_the_data_root(tmp_path, monkeypatch):
    (tmp_path / "root" / "sst2").mkdir(parents=True)
    (tmp_path / "root" / "sst2" / "train.tsv").write_text("sentence\tlabel\n")
    (tmp_path / "run.yaml").write_text("name: ${RUN_NAME:-plain}\nfiles:\n  - ${BERT_KIT_DATA}/sst2/train.tsv\n"
                                       "  - ${BERT_KIT_DATA}/sst2/*.tsv\nmodel: {preset: '${PRESET}'}\n")
    monkeypatch.setenv("BERT_KIT_DATA", str(tmp_path / "root"))
    monkeypatch.setenv("PRESET", "bert-tiny")
    monkeypatch.delenv("RUN_NAME", raising=False)
    cfg = load_config(Settings, tmp_path / "run.yaml")
    train = str(tmp_path / "root" / "sst2" / "train.tsv")
    assert cfg.files == [train, str(tmp_path / "root" / "sst2" / "*.tsv")]
    assert cfg.name == "plain" and cfg.model == {"preset": "bert-tiny"}
    monkeypatch.setenv("RUN_NAME", "mine")
    assert load_config(Settings, tmp_path / "run.yaml", ["files=[a.txt]"]).name == "mine"  # overrides win
    # unset, the data root is ./data: a missing file says which setting, where, and where to get data
    monkeypatch.delenv("BERT_KIT_DATA")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        load_config(Settings, tmp_path / "run.yaml")
    message = str(e.value)
    assert f"{tmp_path / 'run.yaml'}: files[0]: data/sst2/train.tsv not found" in message
    assert "BERT_KIT_DATA is not set, so the data root is ./data" in message and "docs/data.md" in message
    monkeypatch.setenv("BERT_KIT_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"nowhere/sst2/train.tsv not found \(BERT_KIT_DATA=.*nowhere\)"):
        load_config(Settings, tmp_path / "run.yaml")
    (tmp_path / "bad.yaml").write_text("name: ${NOT_SET_ANYWHERE}\n")
    with pytest.raises(ValueError, match=r"bad.yaml:1: name: .* names \$\{NOT_SET_ANYWHERE\}, which is not set"):
        load_config(Settings, tmp_path / "bad.yaml")
    # a regular expression's $ and {n} are left alone
    assert config_from_dict(Settings, {"name": r"^\d{2}$"}).name == r"^\d{2}$"


def test_every_shipped_config_reads_its_data_below_the_root(tmp_path, monkeypatch):
    """configs/*.yaml: all keys valid, every data path below ${BERT_KIT_DATA} (present here as empty
    files), models named by hub name or preset, never by a folder a fresh clone lacks."""
    from pathlib import Path

    from bert_kit.tasks.finetuning import FinetuneConfig
    from bert_kit.tasks.pretraining import PretrainConfig

    configs = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
    datasets = {"sst2": ["train.tsv", "dev.tsv"], "stsb": ["sts-train.csv", "sts-dev.csv", "sts-test.csv"],
                "conll2003": ["train.txt", "valid.txt", "test.txt"], "squad-v1.1": ["dev-v1.1.json"],
                "wikitext-2": ["train.txt", "valid.txt", "test.txt"]}
    for part in ("wiki", "gutenberg", "heldout"):  # the pretraining corpus, as distributed
        (tmp_path / "corpus" / part).mkdir(parents=True)
    for folder, names in datasets.items():
        (tmp_path / folder).mkdir()
        for name in names:
            (tmp_path / folder / name).write_text("")
    monkeypatch.setenv("BERT_KIT_DATA", str(tmp_path))
    checked = 0
    for path in configs:
        raw = yaml.safe_load(path.read_text())
        if "task" in raw:
            cfg = load_config(FinetuneConfig, path)
            files = [cfg.train_file] + ([cfg.validation_file] if cfg.validation_file else [])
            assert cfg.model == "sentence-transformers/all-MiniLM-L6-v2", path
        elif "train_files" in raw:
            cfg = load_config(PretrainConfig, path)
            files = [f for f in cfg.train_files + cfg.eval_files if not f.startswith("corpus/")]  # your own
            assert "/" not in str(cfg.model), path  # presets, hub names
            # a tokenizer folder is a hub name, or the output of a command the config's header shows
            assert "/" not in str(cfg.tokenizer or "") or cfg.tokenizer.startswith("runs/"), path
        else:
            continue  # numpy_ref.yaml: the NumPy engine's synthetic task reads no files
        assert all(f.startswith(str(tmp_path)) for f in files), (path, files)
        assert files or path.name == "pretrain_bert_base.yaml"  # that one reads your own corpus
        checked += 1
    assert checked == 10
