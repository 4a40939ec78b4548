"""Run settings: YAML + key=value overrides -> dataclass, with errors that name the culprit.

Run: .venv/bin/python -m pytest tests/training/test_runconfig.py -q
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from bert_kit.checks import ConfigError
from bert_kit.training.runconfig import (add_config_arguments, apply_overrides, coerce, config_from_dict,
                                         config_to_dict, field_help, load_config, read_yaml, save_config)


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


def test_unknown_key_is_named_with_the_nearest_valid_one(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1.0e-3\nlearning_rate: 3\n")
    with pytest.raises(ValueError) as err:
        load_config(Settings, path)
    assert str(err.value) == (f"{path}:2: unknown key 'learning_rate' (did you mean lr?); "
                              "the settings are the fields of Settings")  # not a list of every key
    with pytest.raises(ValueError, match=r"^override 'stepz=3': unknown key 'stepz' \(did you mean steps\?\); see"):
        load_config(Settings, None, ["stepz=3"], settings_help="see --help")
    with pytest.raises(ValueError, match=r"^overrides: unknown keys 'step' \(did you mean steps\?\), 'zzz';"):
        config_from_dict(Settings, {"step": 1, "zzz": 2}, "overrides")
    with pytest.raises(ValueError, match=r"schedule='cosin' is not a valid choice: .*; did you mean 'cosine'\?$"):
        load_config(Settings, None, ["schedule=cosin"])
    path.write_text("lr: 1.0e-3\nsearch:\n  lr: loguniform(1e-5, 3e-4)\n")  # a tune config given to finetune
    with pytest.raises(ValueError, match=r":2: unknown key 'search' \(a search: block is read by `bert-kit tune "):
        load_config(Settings, path)


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
    assert config_from_dict(Settings, data).model == {"preset": "bert-mini", "hidden_dropout_prob": 0.0}
    data = apply_overrides({"model": {"preset": "bert-tiny"}}, ["model.num_hidden_layers=3"], Settings)
    assert config_from_dict(Settings, data).model == {"preset": "bert-tiny", "num_hidden_layers": 3}


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


CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.fixture()
def shipped_inputs(tmp_path, monkeypatch):
    """What the shipped configs read, as empty files: the data sets below ${BERT_KIT_DATA}, your own
    corpus/ and the tokenizer folder a config's header writes (in the working directory), and a
    local copy of bert-base-uncased's vocabulary in a Hugging Face cache. Returns the data root."""
    root = tmp_path / "data"
    datasets = {"sst2": ["train.tsv", "dev.tsv"], "stsb": ["sts-train.csv", "sts-dev.csv", "sts-test.csv"],
                "conll2003": ["train.txt", "valid.txt", "test.txt"], "squad-v1.1": ["dev-v1.1.json"],
                "wikitext-2": ["train.txt", "valid.txt", "test.txt"], "glue/CoLA": ["train.tsv", "dev.tsv"],
                "goemotions": ["train.tsv", "dev.tsv", "test.tsv"],
                "nfcorpus": ["corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/dev.tsv", "qrels/test.tsv"]}
    for part in ("wiki", "gutenberg", "heldout"):  # the pretraining corpus, as distributed
        (root / "corpus" / part).mkdir(parents=True)
    for folder, names in datasets.items():
        (root / folder).mkdir(parents=True)
        for name in names:
            (root / folder / name).parent.mkdir(exist_ok=True)
            (root / folder / name).write_text("")
    (root / "goemotions" / "emotions.txt").write_text("\n".join(f"emotion{i}" for i in range(28)))
    work = tmp_path / "work"
    (work / "runs" / "long_documents").mkdir(parents=True)  # what benchmarks/long_documents.py --keep writes
    for name in ("train.tsv", "test.tsv"):
        (work / "runs" / "long_documents" / name).write_text("")
    (work / "corpus").mkdir(parents=True)
    (work / "corpus" / "a.txt").write_text("")
    (work / "runs" / "cram_tokenizer").mkdir(parents=True)
    snapshot = tmp_path / "hub" / "models--bert-base-uncased" / "snapshots" / "0"
    snapshot.mkdir(parents=True)
    (snapshot / "vocab.txt").write_text("[PAD]\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("BERT_KIT_DATA", str(root))
    monkeypatch.chdir(work)
    return root


def config_class(path: Path):
    from bert_kit.tasks.finetuning import FinetuneConfig
    from bert_kit.tasks.pretraining import PretrainConfig

    raw = yaml.safe_load(path.read_text())
    return FinetuneConfig if "task" in raw else PretrainConfig if "train_files" in raw else None


def read_shipped(cls, path: Path):
    """The config of a shipped file; a `bert-kit tune` config's settings without its search: block."""
    if "search" in yaml.safe_load(path.read_text()):
        from bert_kit.tasks.search import read_search

        return read_search(path, [])[1]
    return load_config(cls, path)


def test_every_shipped_config_reads_its_data_below_the_root(shipped_inputs, capsys):
    """configs/*.yaml: all keys valid and current (no note of a moved key), every data path below
    ${BERT_KIT_DATA} (present here as empty files) or written by a command the config's header
    shows (runs/...), models named by hub name or preset, never by a folder a fresh clone lacks."""
    checked = 0
    for path in CONFIGS:
        cls = config_class(path)
        if cls is None:
            continue  # numpy_ref.yaml: the NumPy engine's synthetic task reads no files
        cfg = read_shipped(cls, path)
        if hasattr(cfg, "task"):
            files = [cfg.train_file] + ([cfg.validation_file] if cfg.validation_file else [])
            if cfg.distill is not None:  # the student: a part of the teacher, a run of another shipped config
                assert cfg.model == cfg.distill.teacher and cfg.distill.teacher.startswith("runs/"), path
            else:
                assert cfg.model == "sentence-transformers/all-MiniLM-L6-v2", path
        else:
            files = [f for f in cfg.train_files + cfg.eval_files if not f.startswith("corpus/")]  # your own
            assert "/" not in str(cfg.model), path  # presets, hub names
            # a tokenizer folder is a hub name, or the output of a command the config's header shows
            assert "/" not in str(cfg.tokenizer or "") or cfg.tokenizer.startswith("runs/"), path
        made = [f for f in files if f.startswith("runs/")]  # by the command its header shows
        assert made == [] or f"--keep {Path(made[0]).parent}" in path.read_text(), (path, made)
        assert all(f.startswith(str(shipped_inputs)) for f in files if f not in made), (path, files)
        assert files or path.name == "pretrain_bert_base.yaml"  # that one reads your own corpus
        checked += 1
    assert checked == 19
    assert "note:" not in capsys.readouterr().err


def assert_same_values(reference, got, where: str) -> None:
    """Every number and boolean that PyYAML's YAML 1.1 reading gives (`reference`) is in `got`."""
    if isinstance(reference, dict):
        assert isinstance(got, dict), where
        for key, value in reference.items():
            assert_same_values(value, got[str(key)], f"{where}.{key}")
    elif isinstance(reference, list):
        assert isinstance(got, list) and len(got) == len(reference), where
        for i, (a, b) in enumerate(zip(reference, got)):
            assert_same_values(a, b, f"{where}[{i}]")
    elif isinstance(reference, (bool, int, float)) and reference is not None:
        assert type(got) is type(reference) or (type(reference) is int and type(got) is float), (where, got)
        assert got == reference, (where, got, reference)


def test_shipped_configs_keep_their_numbers_and_booleans(shipped_inputs):
    """Reading plain scalars as text typed by the setting changes no value of a shipped config:
    nested model mappings, phases and lists (betas, score_range) keep their numbers."""
    import dataclasses

    seen = set()
    for path in CONFIGS:
        cls = config_class(path)
        if cls is None:
            continue
        reference = yaml.safe_load(path.read_text())
        reference.pop("search", None)  # ranges, not settings (tests/tasks/test_search.py)
        cfg = read_shipped(cls, path)
        values = dataclasses.asdict(cfg)
        for key, value in reference.items():
            assert_same_values(value, values[key], f"{path.name}: {key}")
            seen.add(key)
        yaml.safe_dump(values)  # plain types only: the run config is saved as YAML
    assert {"model", "lr", "betas", "nsp", "max_steps", "batch_size"} <= seen


# ---- YAML read as text, typed by the setting ----------------------------------------------------------

def test_an_override_value_is_the_text_as_typed():
    """MRPC's text column is named `#1 String`: not a YAML comment, nor a mapping for `a: b`."""
    cfg = load_config(Settings, None, ["name=#1 String", "files=#a.txt"])
    assert cfg.name == "#1 String" and cfg.files == ["#a.txt"]
    assert load_config(Settings, None, ["name=a: b"]).name == "a: b"
    assert load_config(Settings, None, ["name=[x]"]).name == "[x]"  # a text setting takes no YAML list
    assert load_config(Settings, None, ["files=[a, '#b']"]).files == ["a", "#b"]  # a list setting does


@pytest.mark.parametrize("text", ["010", "0x1F", "12:30", "yes", "no", "on", "2024-01-01", "1e3", ".inf", "0o17"])
def test_a_text_setting_keeps_the_text_as_written(tmp_path, text):
    """YAML 1.1 would read these as 8, 31, 750, True, False, True, a date, ...: a name or a path
    stays text, in a config file and in an override."""
    (tmp_path / "run.yaml").write_text(f"name: {text}\nfiles: [{text}, b]\n")
    cfg = load_config(Settings, tmp_path / "run.yaml")
    assert (cfg.name, cfg.files) == (text, [text, "b"])
    cfg = load_config(Settings, None, [f"name={text}", f"files=[{text}]"])
    assert (cfg.name, cfg.files) == (text, [text])


def test_a_number_setting_reads_decimal_numbers_only(tmp_path):
    assert load_config(Settings, None, ["steps=010"]).steps == 10  # YAML 1.1: octal 8
    (tmp_path / "run.yaml").write_text("steps: 010\nlr: 1e-4\nflag: no\nwarmup: ~\n")
    cfg = load_config(Settings, tmp_path / "run.yaml")
    assert (cfg.steps, cfg.lr, cfg.flag, cfg.warmup) == (10, 1e-4, False, None)
    assert coerce(".inf", float, "x") == float("inf") and coerce("-.Inf", float, "x") == -float("inf")  # YAML's
    for text in ("0x1F", "12:30", "0o17"):
        with pytest.raises(ConfigError, match=rf"^overrides: steps: expected an integer, got '{text}'$"):
            load_config(Settings, None, [f"steps={text}"])
    # a mapping whose values the type does not name reads numbers and true/false as YAML 1.2 does
    cfg = load_config(Settings, None, ["model={hidden_size: 010, dropout: 0.1, act: gelu, x: 0x1F, y: yes, z: true}"])
    assert cfg.model == {"hidden_size": 10, "dropout": 0.1, "act": "gelu", "x": "0x1F", "y": "yes", "z": True}
    yaml.safe_dump(config_to_dict(cfg))  # plain types: the run config is saved as YAML


def test_duplicate_keys_are_refused_with_their_lines(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 1.0e-3\nsteps: 2\nlr: 2.0e-3\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:3: duplicate key 'lr' \(first on line 1\)"):
        load_config(Settings, path)
    path.write_text("model:\n  hidden_size: 64\n  hidden_size: 128\n")
    with pytest.raises(ConfigError, match=r"run.yaml:3: duplicate key 'hidden_size' \(first on line 2\)"):
        load_config(Settings, path)
    with pytest.raises(ConfigError, match=r"^override 'model=\{a: 1, a: 2\}': duplicate key 'a'"):
        load_config(Settings, None, ["model={a: 1, a: 2}"])
    path.write_text("base: &base {a: 1, b: 2}\n")  # a merge key's values may be overridden: not duplicates
    assert read_yaml(path)["base"] == {"a": "1", "b": "2"}
    path.write_text("model:\n  <<: {a: 1, b: 2}\n  b: 3\n")
    assert load_config(Settings, path).model == {"a": 1, "b": 3}


def test_aliases_that_expand_past_the_bound_are_refused(tmp_path):
    """Five levels of nine aliases are 59,049 values: refused at the alias, before anything expands
    (nine levels, the 'billion laughs', once ran for minutes); a few aliases are fine."""
    levels = ["  l0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"  l{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 5)]
    path = tmp_path / "run.yaml"
    path.write_text("model:\n" + "\n".join(levels) + "\n")
    with pytest.raises(ConfigError, match=r"run.yaml:6: the alias \*a3 expands this YAML past 10000 values"):
        load_config(Settings, path)
    path.write_text("files: &f [a.txt, b.txt]\nmodel: {x: *f, y: *f}\n")
    assert load_config(Settings, path).model == {"x": ["a.txt", "b.txt"], "y": ["a.txt", "b.txt"]}
    path.write_text("model: &m {self: *m}\n")
    with pytest.raises(ConfigError, match=r"run.yaml:1: the alias \*m refers to a node that holds it"):
        load_config(Settings, path)


def test_deep_nesting_is_refused_with_a_message(tmp_path):
    """Not a RecursionError (nor the catch-all 'unexpected ... please report it')."""
    path = tmp_path / "run.yaml"
    path.write_text("model: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"run.yaml:1: YAML nested more than 32 levels deep"):
        load_config(Settings, path)
    with pytest.raises(ConfigError, match=r"^override 'model=\[{54}\.\.\.': YAML nested more than 32 levels deep"):
        load_config(Settings, None, ["model=" + "[" * 5000])


def test_defaults_of_variables_may_hold_variables(monkeypatch):
    for name in ("NOPE_A", "NOPE_B"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SET_B", "b")
    expanded = {"${NOPE_A:-${SET_B}}/x": "b/x", "${NOPE_A:-${NOPE_B:-c}}": "c", "${SET_B:-${NOPE_B}}": "b",
                "${NOPE_A:-}": "", "x${NOPE_A:-{y}}": "x{y}", "${NOPE_A:-a}${SET_B}": "ab", r"^\d{2}$": r"^\d{2}$"}
    for text, value in expanded.items():
        assert config_from_dict(Settings, {"name": text}).name == value, text
    with pytest.raises(ConfigError, match=r"names \$\{NOPE_B\}, which is not set in the environment"):
        config_from_dict(Settings, {"name": "${NOPE_A:-${NOPE_B}}"})
    for text in ("${NOPE_A", "${1X}", "${A:=x}", "a${}b", "${NOPE_A:-${B}", "${NOPE_A:-a}x${"):
        with pytest.raises(ConfigError, match=r"has a '\$\{' that is not a variable: write \$\{NAME\}"):
            config_from_dict(Settings, {"name": text})


def test_huge_numbers_are_out_of_range_not_overflows():
    from bert_kit.tasks.pretraining import PretrainConfig

    with pytest.raises(ConfigError, match=r"max_steps=1\d{30} is out of range: expected an integer >= 1 or null, "
                                          r"at most 9.22e\+18 in size"):
        load_config(PretrainConfig, None, ["max_steps=1e30"])
    with pytest.raises(ConfigError, match=r"^overrides: steps: expected an integer, got '1111.*' \(5002 characters\)$"):
        load_config(Settings, None, ["steps=" + "1" * 5000])


def test_a_fine_tune_begun_with_the_old_adam_epsilon_resumes_saying_so(tmp_path):
    """Fine-tuning's eps default went from 1e-6 to 1e-8: a run whose run_config.yaml holds 1e-6
    resumes (a change it names), while a change that shapes the run is still refused."""
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from bert_kit.training.resume import settings_changes
    from bert_kit.training.runconfig import config_to_dict

    (tmp_path / "t.tsv").write_text("sentence\tlabel\na\t0\n")
    cfg = FinetuneConfig(task="classification", model="m", train_file=str(tmp_path / "t.tsv"))
    saved = {**config_to_dict(cfg), "eps": 1e-6}
    changed, refused = settings_changes(saved, cfg)
    assert changed == {"eps": (1e-6, 1e-8)} and refused == {}
    changed, refused = settings_changes({**saved, "batch_size": cfg.batch_size + 1}, cfg)
    assert "batch_size" in refused and "eps" not in refused
