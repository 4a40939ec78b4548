"""Bad run configs: every setting is checked where it is defined, and the command line says which.

Each bad value is one input; the outcome is one error line naming the key, the value and the
allowed range (exit code 2: the command is wrong), or, for values at the edge of their range,
a config that loads with the right value. Also: YAML files that are broken, not UTF-8, not a
mapping or carry Python tags; flags; `--debug`; and the exit codes a shell sees.

Run: python -m pytest -q tests/bad_inputs/test_run_configs.py
"""

from __future__ import annotations

import json
import math

import pytest

from bert_kit.tasks.finetuning import FinetuneConfig
from bert_kit.tasks.pretraining import PretrainConfig
from bert_kit.training.runconfig import load_config

USAGE = 2


def case(overrides: str, *needles: str, code: int = USAGE):
    return pytest.param(overrides.split("  "), needles, code, id=overrides)


# (override(s) separated by two spaces, text the error line must hold)
PRETRAIN_CASES = [
    case("clip_grad=-1", "clip_grad=-1.0", "out of range", ">= 0", "0 turns clipping off"),
    case("weight_decay=-1", "weight_decay=-1.0", ">= 0"),
    case("lr=0", "lr=0.0", "> 0"),
    case("lr=-1e-4", "lr=-0.0001", "> 0"),
    case("lr=nan", "lr=nan", "a finite number > 0"),
    case("lr=inf", "lr=inf", "a finite number > 0"),
    case("lr=fast", "lr: expected a number, got 'fast'"),
    case("max_steps=0", "max_steps=0", "an integer >= 1"),
    case("max_steps=2.5", "max_steps: expected an integer, got 2.5"),
    case("batch_size=0", "batch_size=0", "an integer >= 1"),
    case("grad_accum=-1", "grad_accum=-1", "an integer >= 1"),
    case("max_length=4", "max_length=4", ">= 5", "[CLS] A [SEP] B [SEP]"),
    case("max_length=2  nsp=false", "max_length=2", ">= 3"),
    case("max_length=100", "max_length=100", "64 positions", "max_position_embeddings"),
    case("phases=[{fraction: 1.0, max_length: 100}]", "max_length=100", "64 positions"),
    case("phases=[{fraction: 0.5}]", "phases: fractions must add up to 1"),
    case("phases=[{fraction: 1.0, seq_len: 8}]", "phases[0]: unknown key(s) ['seq_len']", "max_length"),
    case("phases=[{fraction: 1.0, batch_size: 0}]", "phases[0].batch_size=0", ">= 1"),
    case("phases=[{fraction: 0}]", "phases[0].fraction=0", "(0, 1]"),
    case("phases=[5]", "phases[0]: expected a mapping (key: value), got 5"),
    case("mask_probability=0", "mask_probability=0.0", "(0, 1)"),
    case("mask_probability=1.5", "mask_probability=1.5", "(0, 1)"),
    case("eval_fraction=1", "eval_fraction=1.0", "[0, 1)"),
    case("warmup_fraction=-0.1", "warmup_fraction=-0.1", "[0, 1)"),
    case("warmup_steps=-1", "warmup_steps=-1", "[0, 6]"),
    case("warmup_steps=100", "warmup_steps=100", "at most max_steps"),
    case("betas=[0.9]", "betas=[0.9] must be two numbers"),
    case("betas=[0.9, 1.0]", "betas[1]=1.0", "[0, 1)"),
    case("betas=[-0.1, 0.9]", "betas[0]=-0.1", "[0, 1)"),
    case("eps=0", "eps=0.0", "> 0"),
    case("min_lr_ratio=2", "min_lr_ratio=2.0", "[0, 1]"),
    case("short_seq_prob=1.5", "short_seq_prob=1.5", "[0, 1]"),
    case("log_every=0", "log_every=0", ">= 1"),
    case("eval_every=-1", "eval_every=-1", ">= 0"),
    case("eval_batches=0", "eval_batches=0", ">= 1"),
    case("save_every=-1", "save_every=-1", ">= 0"),
    case("keep_last=-1", "keep_last=-1", ">= 0", "0 keeps all"),
    case("num_workers=-1", "num_workers=-1", ">= 0"),
    case("shuffle_buffer=0", "shuffle_buffer=0", ">= 1"),
    case("seed=-1", "seed=-1", "[0, 4294967295]"),
    case("seed=4294967296", "seed=4294967296", "[0, 4294967295]"),
    case("dist_timeout_s=0", "dist_timeout_s=0.0", "(0, 1000000000]"),
    case("dist_timeout_s=1e15", "dist_timeout_s=1000000000000000.0", "(0, 1000000000]"),  # past a timedelta
    case("max_steps=1e30", "max_steps=1000000000000000019884624838656 is out of range", "at most 9.22e+18"),
    case("device=bogus", "device='bogus' is not a device", "cpu, cuda, cuda:N"),
    case("device=cuda:x", "device='cuda:x' is not a device"),
    case("device=cuda:99999999999999999999", "is not a device"),  # torch cannot parse the index
    case("model=", "model is empty: name a preset"),
    case("precision=fp8", "precision='fp8'", "'fp32'", "'bf16'"),
    case("schedule=cosinus", "schedule='cosinus'", "'cosine'"),
    case("optimizer=sgd", "optimizer='sgd'", "'adamw'"),
    case("corpus_format=csv", "corpus_format='csv'", "'jsonl'"),
    case("parallel=horovod", "parallel='horovod'", "'fsdp'"),
    case("nsp=maybe", "nsp: expected a boolean (true/false), got 'maybe'"),
    case("lerning_rate=0.1", "unknown key 'lerning_rate' (did you mean lr?)", "`bert-kit pretrain --help` lists"),
    case("lr", "override 'lr' is not of the form key=value"),
    case("model=bert-huge", "model='bert-huge' is neither a model folder, a config file nor a preset", "bert-tiny"),
    case("model.num_attention_heads=3", "hidden_size (32) must be divisible by num_attention_heads (3)"),
    case("model.hidden_dropout_prob=1", "hidden_dropout_prob=1", "[0, 1)"),
    case("model.layer_norm_eps=nan", "layer_norm_eps=nan", "> 0"),
    case("model.initializer_range=-1e-2", "initializer_range=-0.01", "> 0"),
    case("model.num_hidden_layers=0", "num_hidden_layers=0", ">= 1"),
    case("model=[1, 2]", "model: expected str | dict, got [1, 2]"),
    case("train_tokenizer={vocab_size: 3}", "train_tokenizer.vocab_size=3", ">= 6"),
    case("train_tokenizer={size: 100}", "train_tokenizer: unknown key(s) ['size']"),
    case("streaming=true", "streaming: true trains MLM only", "nsp: false"),
    case("streaming=true  nsp=false  eval_files=[]", "streaming: true needs eval_files"),
    case("cuda_graphs=true", "cuda_graphs and compile_tuning need compile: true"),
    case("segment_pairs=true  nsp=true", "segment_pairs: true is for MLM only", "nsp: false"),
    case("output_dir=", "output_dir='' must name a folder"),
]

FINETUNE_CASES = [
    case("epochs=inf", "epochs=inf", "a finite number > 0"),
    case("epochs=0", "epochs=0.0", "> 0"),
    case("epochs=nan", "epochs=nan", "> 0"),
    case("max_steps=0", "max_steps=0", ">= 1 or null"),
    case("clip_grad=-0.5", "clip_grad=-0.5", ">= 0"),
    case("weight_decay=-0.01", "weight_decay=-0.01", ">= 0"),
    case("eval_batch_size=0", "eval_batch_size=0", ">= 1"),
    case("max_length=1000", "max_length=1000", "64 positions"),
    case("max_length=2", "max_length=2", ">= 3"),
    case("task=qa  max_length=128  qa.doc_stride=70", "qa.doc_stride=70", "< 61", "qa.max_query_length 64"),
    case("task=qa  max_length=128  doc_stride=70", "qa.doc_stride=70", "< 61"),  # the old flat key
    case("task=qa  max_length=64", "qa.max_query_length=64", "max_length 64", "< 60"),
    case("qa.max_query_length=0", "qa.max_query_length=0", ">= 1"),
    case("n_best=0", "qa.n_best=0", ">= 1"),
    case("qa.max_answer_length=-3", "qa.max_answer_length=-3", ">= 1"),
    case("qa.doc_strid=3", "unknown key 'qa.doc_strid' (did you mean qa.doc_stride?)"),
    case("doc_strid=3", "unknown key 'doc_strid' (did you mean qa.doc_stride?)"),
    case("qa=5", "qa takes a mapping"),
    case("classifier_dropout=1", "classifier_dropout=1.0", "[0, 1)"),
    case("num_labels=0", "num_labels=0", ">= 1 or null", "1 = regression"),
    case("label_names=[a, a]", "label_names=['a', 'a'] must be distinct"),
    case("label_names=[]", "label_names=[] must be distinct names"),
    case("label_names=[a, b]  num_labels=3", "num_labels=3 contradicts the 2 label_names"),
    case("max_train_examples=-1", "max_train_examples=-1", ">= 1 or null"),
    case("max_eval_examples=0", "max_eval_examples=0", ">= 1 or null"),
    case("squad_train_articles=0", "qa.train_articles=0", ">= 1 or null"),
    case("task=ner", "task='ner'", "'token-classification'"),
    case("similarity.mode=both", "similarity.mode='both'", "'bi-encoder'"),
    case("similarity_mode=both", "similarity.mode='both'", "'bi-encoder'"),
    case("pooling=max", "similarity.pooling='max'", "'mean'"),
    case("similarity.loss=mse", "similarity.loss='mse'", "'cosent'"),
    case("warmup_fraction=1", "warmup_fraction=1.0", "[0, 1)"),
    case("tag_column=1.5", "ner.tag_column: expected an integer, got 1.5"),
    case("batch_size=-8", "batch_size=-8", ">= 1"),
    case("device=gpu", "device='gpu' is not a device"),
    case("lr=1e", "lr: expected float | 'auto', got '1e'"),
    case("cuda_graphs=sometimes", "cuda_graphs: expected bool | 'auto', got 'sometimes'"),
    # a metric the task does not report: refused with the settings, not after an epoch (nor never)
    case("metric=macro_f1", "metric='macro_f1' is not a validation metric of task classification",
         "accuracy, f1, precision", "macro averages"),
    case("metric=macro_f1  validation_file=null", "metric='macro_f1'"),
    case("task=qa  max_length=64  max_query_length=16  doc_stride=16  metric=accuracy", "metric='accuracy' is not a validation metric of task qa",
         "expected one of f1, exact_match"),
    case("task=similarity  similarity_mode=bi-encoder  metric=mse", "metric='mse'", "pearson, spearman"),
]


@pytest.mark.parametrize("overrides, needles, code", PRETRAIN_CASES)
def test_pretrain_setting(cli, assets, tmp_path, overrides, needles, code):
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={tmp_path / 'out'}", *overrides)
    line = result.one_line_error(*needles, code=code)
    assert str(assets.pretrain_yaml) in line or "override" in line  # where the bad value came from
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.parametrize("overrides, needles, code", FINETUNE_CASES)
def test_finetune_setting(cli, assets, tmp_path, overrides, needles, code):
    result = cli("finetune", "--config", assets.finetune_yaml, f"output_dir={tmp_path / 'out'}", *overrides)
    line = result.one_line_error(*needles, code=code)
    assert str(assets.finetune_yaml) in line or "override" in line
    assert not (tmp_path / "out").exists()


def test_device_cuda_without_a_gpu(cli, assets, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = cli("pretrain", "--config", assets.pretrain_yaml, "device=cuda", f"output_dir={tmp_path / 'out'}")
    result.one_line_error("device='cuda'", "CUDA is not available", "cpu", code=USAGE)


# ---- the config file itself -----------------------------------------------------------------------

def test_bad_value_in_the_file_names_its_line(cli, assets, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(assets.pretrain_yaml.read_text() + "clip_grad: -1\n")
    line_no = len(config.read_text().splitlines())
    result = cli("pretrain", "--config", config, f"output_dir={tmp_path / 'out'}")
    result.one_line_error(f"{config}:{line_no}: clip_grad=-1.0 is out of range", code=USAGE)


def test_unknown_key_in_the_file_names_its_line(cli, assets, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 2\nlr: 1.0e-3\nlerning_rate: 0.1\n")
    result = cli("pretrain", "--config", config)
    line = result.one_line_error(f"{config}:3: unknown key 'lerning_rate' (did you mean lr?); "
                                 "`bert-kit pretrain --help` lists the settings", code=USAGE)
    assert "max_steps" not in line  # a suggestion, not all the valid keys


def test_wrong_type_in_the_file(cli, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 2\nlr: [1, 2]\n")
    cli("pretrain", "--config", config).one_line_error(f"{config}:2: lr: expected a number, got [1, 2]", code=USAGE)


def test_config_not_utf8_names_file_and_line(cli, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_bytes(b"max_steps: 2\nlr: 1.0e-3\nname: caf\xe9\n")
    cli("pretrain", "--config", config).one_line_error(f"{config}:3: not UTF-8 text", "byte 0xe9", code=USAGE)


def test_config_invalid_yaml_names_file_and_line(cli, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 2\ntrain_files: [a.txt\nlr: 1\n")
    cli("pretrain", "--config", config).one_line_error(f"{config}:3: invalid YAML", code=USAGE)


def test_config_not_a_mapping(cli, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("- max_steps: 2\n- lr: 1\n")
    cli("finetune", "--config", config).one_line_error(f"{config}: expected a mapping of settings, got list",
                                                       code=USAGE)


def test_config_python_tag_is_refused_not_run(cli, tmp_path):
    marker = tmp_path / "pwned"
    config = tmp_path / "run.yaml"
    config.write_text(f"max_steps: 2\nlr: !!python/object/apply:os.system ['touch {marker}']\n")
    cli("pretrain", "--config", config).one_line_error(f"{config}:2: invalid YAML", code=USAGE)
    assert not marker.exists()


def test_config_file_missing(cli, tmp_path):
    cli("pretrain", "--config", tmp_path / "nope.yaml").one_line_error("config file not found", "nope.yaml",
                                                                       code=USAGE)


def test_config_file_is_a_folder(cli, tmp_path):
    cli("finetune", "--config", tmp_path).one_line_error(f"config file {tmp_path} is a folder", code=USAGE)


def test_no_config_and_no_overrides(cli):
    cli("pretrain").one_line_error("pass --config FILE", code=USAGE)
    cli("finetune").one_line_error("pass --config FILE", code=USAGE)


def test_task_flag_contradicts_the_file(cli, assets):
    cli("finetune", "--task", "qa", "--config", assets.finetune_yaml).one_line_error(
        "--task qa contradicts task: classification", code=USAGE)


def test_unknown_flag_is_a_usage_error(cli, assets):
    result = cli("pretrain", "--config", assets.pretrain_yaml, "--learning-rate", "3")
    assert result.code == USAGE and "unrecognized arguments: --learning-rate" in result.err
    assert "Traceback" not in result.err


# ---- values at the edge of their range load as given ----------------------------------------------------

@pytest.mark.parametrize("override, key, value", [
    ("clip_grad=0", "clip_grad", 0.0),  # no clipping
    ("weight_decay=0", "weight_decay", 0.0),
    ("warmup_steps=0", "warmup_steps", 0),
    ("warmup_steps=6", "warmup_steps", 6),  # = max_steps
    ("keep_last=0", "keep_last", 0),  # keep all
    ("max_steps=6e0", "max_steps", 6),  # a whole number written as a float
    ("lr=1e-3", "lr", 1e-3),  # YAML reads 1e-3 (no dot) as a string
    ("device= cpu", "device", "cpu"),
    ("seed=4294967295", "seed", 4294967295),
    ("betas=[0, 0.999]", "betas", [0.0, 0.999]),
    ("mask_probability=0.999", "mask_probability", 0.999),
])
def test_edge_values_load(assets, override, key, value):
    cfg = load_config(PretrainConfig, assets.pretrain_yaml, [override])
    assert getattr(cfg, key) == value


@pytest.mark.parametrize("text, value", [("false", False), ("true", True), ("auto", "auto")])
def test_finetune_cuda_graphs_takes_a_boolean_or_auto(assets, text, value):
    assert load_config(FinetuneConfig, assets.finetune_yaml, [f"cuda_graphs={text}"]).cuda_graphs == value


def test_config_with_byte_order_mark_loads(assets, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_bytes(b"\xef\xbb\xbf" + assets.pretrain_yaml.read_bytes())
    assert load_config(PretrainConfig, config).max_steps == 6


def test_python_callers_get_the_same_checks():
    with pytest.raises(ValueError, match=r"^lr='1e-4' is not a number: expected a finite number > 0$"):
        PretrainConfig(lr="1e-4")
    with pytest.raises(ValueError, match=r"^max_steps=1000.0 is not an integer"):
        PretrainConfig(max_steps=1000.0)
    with pytest.raises(ValueError, match=r"^epochs=inf is out of range"):
        FinetuneConfig(epochs=math.inf)
    with pytest.raises(ValueError, match=r"^schedule='Linear' is not a valid choice"):
        FinetuneConfig(schedule="Linear")


def test_clip_grad_zero_and_weight_decay_zero_train(cli, assets, tmp_path, single_thread):
    """The edge values are not only accepted: a run with them trains and finishes."""
    result = cli("pretrain", "--config", assets.pretrain_yaml, "clip_grad=0", "weight_decay=0", "max_steps=2",
                 f"output_dir={tmp_path / 'out'}")
    assert result.code == 0, result.err
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()


# ---- --debug, and what a shell sees ----------------------------------------------------------------

def test_debug_flag_shows_the_traceback_too(cli, assets, tmp_path):
    result = cli("pretrain", "--config", assets.pretrain_yaml, "clip_grad=-1", "--debug")
    assert result.code == USAGE
    assert "Traceback" in result.err and "ConfigError" in result.err
    assert result.err.strip().splitlines()[-1].startswith("bert-kit pretrain: error: ")


def test_debug_environment_variable(cli, assets, monkeypatch):
    monkeypatch.setenv("BERT_KIT_DEBUG", "1")
    result = cli("finetune", "--config", assets.finetune_yaml, "epochs=inf")
    assert result.code == USAGE and "Traceback" in result.err


def test_unexpected_error_is_one_line_with_a_hint(cli, assets, monkeypatch):
    import bert_kit.cli.common

    def broken(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")

    monkeypatch.setattr(bert_kit.cli.common, "load_config", broken)
    line = cli("pretrain", "--config", assets.pretrain_yaml).one_line_error("TypeError: unsupported operand",
                                                                           "--debug", code=1)
    assert "report it" in line


def test_exit_codes_seen_by_a_shell(cli_process, assets, tmp_path):
    usage = cli_process("pretrain", "--config", assets.pretrain_yaml, "weight_decay=-1", timeout=60)
    usage.one_line_error("weight_decay=-1.0", code=USAGE)
    missing = cli_process("fill-mask", "--model", tmp_path / "no-model", "a [MASK]", timeout=60)
    missing.one_line_error("no-model", code=USAGE)  # a wrong input, not a failed run


# ---- values as written, YAML that misleads, names that are close -----------------------------------------

def test_a_column_named_with_a_hash_is_text_not_a_comment(assets):
    """MRPC's columns are `#1 String` and `#2 String`."""
    cfg = load_config(FinetuneConfig, assets.finetune_yaml, ["text_column=#1 String", "text_pair_column=#2 String"])
    assert (cfg.text_column, cfg.text_pair_column) == ("#1 String", "#2 String")


@pytest.mark.parametrize("override, key, value", [
    ("output_dir=010", "output_dir", "010"),  # YAML 1.1: 8
    ("output_dir=yes", "output_dir", "yes"),  # YAML 1.1: True, refused
    ("output_dir=2024-01-01", "output_dir", "2024-01-01"),  # YAML 1.1: a date, refused
    ("output_dir=12:30", "output_dir", "12:30"),  # YAML 1.1: 750
    ("output_dir=0x1F", "output_dir", "0x1F"),  # YAML 1.1: 31
    ("label_names=[no, yes]", "label_names", ["no", "yes"]),  # YAML 1.1: [False, True], refused
    ("where={fold: 010}", "where", {"fold": "010"}),  # YAML 1.1: fold 8
    ("where={split: [train, 'dev']}", "where", {"split": ["train", "dev"]}),
    ("validation_where.fold=010", "validation_where", {"fold": "010"}),
    ("max_steps=010", "max_steps", 10),  # a count is a decimal number
    ("header=no", "header", False),  # a boolean setting takes yes/no
])
def test_values_are_typed_by_the_setting(assets, override, key, value):
    assert getattr(load_config(FinetuneConfig, assets.finetune_yaml, [override]), key) == value


def test_where_selects_the_fold_as_written(cli, assets, tmp_path, single_thread):
    """`where={fold: 010}` keeps the rows of fold "010" (YAML 1.1 read it as fold 8: no rows)."""
    rows = [f"the {w} cat\t{i % 2}\t{'010' if i < 8 else '8'}" for i, w in enumerate("a b c d e f g h i j".split())]
    (tmp_path / "folds.tsv").write_text("sentence\tlabel\tfold\n" + "\n".join(rows) + "\n")
    result = cli("finetune", "--config", assets.finetune_yaml, "train_file=folds.tsv", "validation_file=folds.tsv",
                 "where={fold: 010}", "validation_where={fold: '010'}", "max_steps=1", f"output_dir={tmp_path / 'o'}")
    assert result.code == 0, result.err
    assert json.loads((tmp_path / "o" / "results.json").read_text())["train_examples"] == 8


def test_an_output_dir_of_digits_is_that_folder(cli, assets, tmp_path, single_thread):
    result = cli("pretrain", "--config", assets.pretrain_yaml, "output_dir=010", "max_steps=1", "eval_every=0")
    assert result.code == 0, result.err
    assert (tmp_path / "010" / "final").is_dir() and not (tmp_path / "8").exists()


def test_duplicate_key_in_the_file_names_both_lines(cli, assets, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(assets.pretrain_yaml.read_text() + "lr: 5.0e-4\n")
    line_no = len(config.read_text().splitlines())
    first = next(i for i, line in enumerate(config.read_text().splitlines(), 1) if line.startswith("lr:"))
    cli("pretrain", "--config", config).one_line_error(
        f"{config}:{line_no}: duplicate key 'lr' (first on line {first}): keep one", code=USAGE)


def test_an_alias_bomb_is_refused_at_once(cli, assets, tmp_path):
    """Nine levels of nine aliases in `where:` (9**9 values) once ran for minutes and a gigabyte."""
    levels = ["  l0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"  l{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    config = tmp_path / "run.yaml"
    config.write_text(assets.finetune_yaml.read_text() + "where:\n" + "\n".join(levels) + "\n")
    line = cli("finetune", "--config", config).one_line_error("the alias *a", "expands this YAML past 10000 values",
                                                            code=USAGE)
    assert line.split(": error: ")[1].startswith(f"{config}:")


@pytest.mark.parametrize("yaml_text", ["where: " + "[" * 3000 + "]" * 3000,
                                       "where: " + "{a: " * 3000 + "1" + "}" * 3000])
def test_deep_yaml_is_refused_with_its_own_message(cli, assets, tmp_path, yaml_text):
    config = tmp_path / "run.yaml"
    config.write_text(assets.finetune_yaml.read_text() + yaml_text + "\n")
    line = cli("finetune", "--config", config).one_line_error("YAML nested more than 32 levels deep", code=USAGE)
    assert "RecursionError" not in line and "report it" not in line


def test_nested_default_variables(cli, assets, tmp_path, monkeypatch, single_thread):
    """`${A:-${B}}` with both unset once made a folder named `${NOPE_B}`."""
    monkeypatch.delenv("NOPE_A", raising=False)
    monkeypatch.delenv("NOPE_B", raising=False)
    cli("pretrain", "--config", assets.pretrain_yaml, "output_dir=runs/${NOPE_A:-${NOPE_B}}").one_line_error(
        "output_dir: 'runs/${NOPE_A:-${NOPE_B}}' names ${NOPE_B}, which is not set in the environment", code=USAGE)
    assert not (tmp_path / "runs").exists()
    cfg = load_config(PretrainConfig, assets.pretrain_yaml, ["output_dir=runs/${NOPE_A:-${NOPE_B:-x}}/y"])
    assert cfg.output_dir == "runs/x/y"


@pytest.mark.parametrize("command, override, needle", [
    ("finetune", "epoch=1",
     "unknown key 'epoch' (did you mean epochs?); `bert-kit finetune --help` lists the settings"),
    ("finetune", "learning_rate=1e-4", "unknown key 'learning_rate' (did you mean lr?)"),
    ("finetune", "num_train_epochs=2", "unknown key 'num_train_epochs' (did you mean epochs?)"),
    ("finetune", "task=clasification", "task='clasification' is not a valid choice: expected one of 'classification', "
                                       "'token-classification', 'qa', 'similarity', 'embedding', 'reranker'; "
                                       "did you mean 'classification'?"),
    ("pretrain", "precision=fp23", "did you mean 'fp32'?"),
    ("pretrain", "schedule=Linear", "did you mean 'linear'?"),
    ("pretrain", "batchsize=4", "unknown key 'batchsize' (did you mean batch_size?)"),
])
def test_close_matches_are_suggested(cli, assets, command, override, needle):
    config = assets.finetune_yaml if command == "finetune" else assets.pretrain_yaml
    line = cli(command, "--config", config, override).one_line_error(needle, code=USAGE)
    assert "valid keys" not in line and "eval_batch_size" not in line  # one suggestion, not all 67 keys


def test_an_unknown_command_gets_the_nearest(cli):
    result = cli("finetun", "--config", "x.yaml")
    assert result.code == USAGE
    assert "unknown command 'finetun' (did you mean finetune?)" in result.err and "Traceback" not in result.err


# ---- every file a run names is checked when its settings are read, before any model loads ---------------

def test_a_missing_train_file_names_the_setting(cli, assets, tmp_path):
    (tmp_path / "mydata").mkdir()
    (tmp_path / "mydata" / "train.csv").write_text("sentence,label\na,0\nb,1\n")
    cli("finetune", "--config", assets.finetune_yaml, "train_file=mydata/trian.csv").one_line_error(
        "train_file=mydata/trian.csv: file not found (did you mean mydata/train.csv?)", code=USAGE)
    config = tmp_path / "run.yaml"
    config.write_text(assets.finetune_yaml.read_text().replace(str(assets.train_tsv), "nowhere/train.tsv"))
    line_no = next(i for i, line in enumerate(config.read_text().splitlines(), 1) if line.startswith("train_file"))
    cli("finetune", "--config", config).one_line_error(
        f"{config}:{line_no}: train_file=nowhere/train.tsv: file not found (no folder nowhere)", code=USAGE)


def test_a_missing_validation_file_is_named_before_the_model_loads(cli, assets, tmp_path):
    """An STS run once loaded its model before it said `STS file not found`; the model here does
    not exist, so an error about the file shows that nothing was loaded first."""
    cli("finetune", "--config", assets.finetune_yaml, "task=similarity", "model=no/such-model",
        "validation_file=sts-dev.csv").one_line_error("validation_file=sts-dev.csv: file not found", code=USAGE)


@pytest.mark.parametrize("override, needle", [
    ("train_files=[corpus/*.txt]", "train_files[0]=corpus/*.txt: no file matches this pattern"),
    ("eval_files=[held-out.txt]", "eval_files[0]=held-out.txt: folder or file not found"),
    ("tokenizer=./my-tokenizer", "tokenizer=./my-tokenizer: folder or file not found"),
])
def test_pretraining_files_are_checked_with_the_settings(cli, assets, tmp_path, override, needle):
    cli("pretrain", "--config", assets.pretrain_yaml, override, f"output_dir={tmp_path / 'out'}").one_line_error(
        needle, code=USAGE)
    assert not (tmp_path / "out").exists()


# ---- bert-kit plot on a metrics.jsonl that holds other things than records ------------------------------------
@pytest.mark.parametrize("lines, needle", [
    (["[1, 2]"], "metrics.jsonl:1: a JSON array, not an object"),
    (['{"type": "train", "step": 1, "loss": 2.0}', '{"type": "train", "loss": 1.0}'], 'metrics.jsonl:2: no "step"'),
    (['{"type": "train", "step": "3", "loss": 2.0}'], 'metrics.jsonl:1: "step": "3" is not an integer'),
    (['{"type": "train", "step": true, "loss": 2.0}'], 'metrics.jsonl:1: "step": true is not an integer'),
    (['{"type": 7, "step": 1, "loss": 2.0}'], 'metrics.jsonl:1: "type": 7 is not a text'),
    (['"text"'], "metrics.jsonl:1: a JSON str, not an object"),
])
def test_plot_names_the_line_that_is_no_record(cli, tmp_path, lines, needle):
    """A metrics.jsonl of JSON arrays gave exit 1 and an AttributeError to report; a record without
    "step" printed only `error: step`."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    cli("plot", run).one_line_error(str(run / "metrics.jsonl"), needle, code=2)
    assert not (run / "loss_curve.png").exists()


def test_plot_skips_values_that_are_not_numbers(cli, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"type": "train", "step": 1, "loss": 2.0, "lr": 0.1}\n'
                                       '{"type": "train", "step": 2, "loss": "nan?", "lr": "x"}\n'
                                       '{"type": "train", "step": 3, "loss": 1.0, "lr": 0.05}\n')
    result = cli("plot", run)
    assert result.code == 0 and (run / "loss_curve.png").read_bytes().startswith(b"\x89PNG"), result.err


def test_a_run_reads_past_a_line_that_is_no_record(tmp_path, capsys):
    """The loop reads its own metrics.jsonl at the end of a run: a foreign line there is skipped, named."""
    from bert_kit.training.progress import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"type": "train", "step": 1, "loss": 2.0}\n[1]\n{"step": 2}\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert f"{tmp_path / 'metrics.jsonl'}:2: skipping a line that is no record (a JSON array, not an object)" in \
        capsys.readouterr().err


def test_a_metric_of_classes_on_score_labels_stops_before_training(cli, assets, tmp_path):
    """What the labels are (classes or scores) is known once the training file is read: before the
    model is built or a step taken."""
    scores = tmp_path / "scores.tsv"
    scores.write_text("sentence\tlabel\n" + "".join(f"the cat sat {i}\t{i / 10}\n" for i in range(8)))
    result = cli("finetune", "--config", assets.finetune_yaml, f"output_dir={tmp_path / 'out'}",
                 f"train_file={scores}", f"validation_file={scores}", "metric=accuracy")
    result.one_line_error("metric='accuracy' is not a validation metric of task classification on scores",
                          "pearson, spearman, mse", code=USAGE)
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_loss_as_metric_keeps_its_lowest_value(cli, assets, tmp_path):
    """best/ followed the highest value of every metric: `metric=loss` kept the worst model."""
    run = tmp_path / "run"
    result = cli("finetune", "--config", assets.finetune_yaml, f"output_dir={run}", "metric=loss", "eval_every=1",
                 "max_steps=6", "lr=1e-2")
    assert result.code == 0, result.err
    results = json.loads((run / "results.json").read_text())
    losses = {h["step"]: h["loss"] for h in results["history"]}
    assert len(set(losses.values())) > 1  # the evaluations differ: the choice is a real one
    assert results["best_value"] == min(losses.values()) and losses[results["best_step"]] == results["best_value"]


# ---- settings grouped under their task; the flat keys of earlier versions ---------------------------

FLAT = {"squad_train_articles": 3, "doc_stride": 32, "max_query_length": 16, "n_best": 5, "max_answer_length": 12,
        "skip_bad_answers": True, "tag_column": 2, "word_column": 1, "similarity_mode": "bi-encoder",
        "pooling": "cls", "similarity_loss": "cosent", "score_range": [1, 5]}
GROUPED = {"qa": {"train_articles": 3, "doc_stride": 32, "max_query_length": 16, "n_best": 5,
                  "max_answer_length": 12, "skip_bad_answers": True},
           "ner": {"tag_column": 2, "word_column": 1},
           "similarity": {"mode": "bi-encoder", "pooling": "cls", "loss": "cosent", "score_range": [1.0, 5.0]}}


def test_old_flat_keys_work_in_files_overrides_and_python_with_one_note(tmp_path, capsys, monkeypatch):
    import dataclasses

    import yaml

    from bert_kit.training import config_keys
    from bert_kit.training.runconfig import save_config

    monkeypatch.setattr(config_keys, "_noted", set())  # each note is printed once per process

    flat = tmp_path / "flat.yaml"
    flat.write_text(yaml.safe_dump({"task": "qa", "max_length": 64, **FLAT}))
    from_file = load_config(FinetuneConfig, flat)
    assert {k: dataclasses.asdict(getattr(from_file, k)) for k in GROUPED} == GROUPED
    notes = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and f"{flat}: settings moved under their task" in notes[0]
    assert "doc_stride -> qa.doc_stride" in notes[0] and "similarity_mode -> similarity.mode" in notes[0]

    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(yaml.safe_dump({"task": "qa", "max_length": 64, **GROUPED}))
    assert load_config(FinetuneConfig, grouped) == from_file and "note:" not in capsys.readouterr().err
    overridden = load_config(FinetuneConfig, grouped, ["doc_stride=8", "qa.n_best=7"])  # an old key overrides too
    assert (overridden.qa.doc_stride, overridden.qa.n_best) == (8, 7)
    assert "doc_stride -> qa.doc_stride" in capsys.readouterr().err

    with pytest.warns(FutureWarning, match="doc_stride -> qa.doc_stride"):
        from_python = FinetuneConfig(task="qa", max_length=64, **FLAT)
    assert from_python == from_file
    saved = save_config(from_python, tmp_path / "run_config.yaml")  # what a run saves: the groups
    assert yaml.safe_load(saved.read_text())["qa"]["doc_stride"] == 32
    assert not set(FLAT) & set(yaml.safe_load(saved.read_text()))

    both = tmp_path / "both.yaml"
    both.write_text("doc_stride: 32\nqa: {doc_stride: 64}\n")
    with pytest.raises(Exception, match=r"doc_stride=32 and qa.doc_stride=64 are the same setting: keep qa.doc_stride"):
        load_config(FinetuneConfig, both)


def test_a_bad_value_under_an_old_key_names_its_line(cli, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("task: qa\nmax_length: 64\nmax_query_length: 16\ndoc_stride: -4\n")
    cli("finetune", "--config", config).one_line_error(f"{config}:4: qa.doc_stride=-4 is out of range", code=USAGE)
    config.write_text("task: qa\nmax_length: 64\nqa:\n  max_query_length: 16\n  doc_strid: 4\n")
    cli("finetune", "--config", config).one_line_error(f"{config}:3:", "unknown key 'qa.doc_strid'",
                                                       "did you mean qa.doc_stride?", code=USAGE)


def test_a_run_saved_with_flat_keys_resumes(cli, assets, tmp_path):
    """A run of an earlier version: its run_config.yaml and its checkpoint's settings hold the flat
    keys. It resumes from its own run_config.yaml (with a note), and a resume still refuses a change
    that shapes the run, named as the setting is now."""
    import torch
    import yaml

    run = tmp_path / "run"
    assert cli("finetune", "--config", assets.finetune_yaml, f"output_dir={run}", "max_steps=2",
               "end_checkpoint=true").code == 0
    checkpoint = run / "checkpoints" / "step-0000002" / "trainer_state.pt"
    state = torch.load(checkpoint, weights_only=True)
    saved = state["run_config"]
    old = {k: v for k, v in saved.items() if k not in GROUPED}
    old.update({"doc_stride": 128, "max_query_length": 64, "n_best": 20, "max_answer_length": 30,
                "squad_train_articles": None, "skip_bad_answers": False, "tag_column": -1, "word_column": 0,
                "similarity_mode": "cross-encoder", "pooling": "mean", "similarity_loss": "cosine",
                "score_range": None})
    torch.save({**state, "run_config": old}, checkpoint)
    (run / "run_config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))

    out = cli("finetune", "--config", run / "run_config.yaml", "max_steps=3", "n_best=5", "--resume", "latest")
    assert out.code == 0, out.err
    assert "note:" in out.err and "cannot resume" not in out.err
    assert "resuming with changed settings: max_steps 2 -> 3, qa.n_best 20 -> 5" in out.err, out.err
    assert json.loads((run / "results.json").read_text())["steps"] == 3
    out = cli("finetune", "--config", run / "run_config.yaml", "max_steps=4", "qa.doc_stride=64", "--resume", "latest")
    out.one_line_error("cannot resume", "qa.doc_stride: 128 -> 64", "force_resume=true", code=USAGE)
