"""One exit-code rule for every command (bert_kit/cli/errors.py): 2 when the command or its inputs
are wrong, 1 when the run itself failed; and every numeric flag checked where it is declared.

Run: python -m pytest -q tests/bad_inputs/test_exit_codes.py
"""

from __future__ import annotations

import errno
import shutil

import pytest

from bert_kit.checks import ConfigError, CorruptFileError, InputNotFoundError
from bert_kit.cli.errors import describe

USAGE, FAILURE = 2, 1


class DistributedError(RuntimeError):
    """Stands in for bert_kit.training.distributed.DistributedError (recognised by name)."""


def unicode_error() -> UnicodeDecodeError:
    try:
        b"caf\xe9".decode("utf-8")
    except UnicodeDecodeError as e:
        return e
    raise AssertionError


@pytest.mark.parametrize("exc, code", [
    (ConfigError("lr=0.0 is out of range"), USAGE),
    (InputNotFoundError("train_file=x.tsv: file not found"), USAGE),
    (FileNotFoundError("model folder not found: runs/x"), USAGE),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "in.txt"), USAGE),
    (PermissionError(errno.EACCES, "Permission denied", "model.safetensors"), USAGE),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "data"), USAGE),
    (CorruptFileError("model.safetensors is truncated"), USAGE),
    (ValueError("train.tsv:3: label 'x' is not one of label_names"), USAGE),
    (KeyError("q.jsonl:2: needs keys 'question' and 'context'"), USAGE),
    (unicode_error(), USAGE),
    (RecursionError("maximum recursion depth exceeded while decoding a JSON array"), USAGE),
    (RuntimeError("Error while deserializing header: (os error 2)"), USAGE),
    (OSError(errno.ENOSPC, "No space left on device", "run/metrics.jsonl"), FAILURE),
    (OSError(errno.EIO, "Input/output error", "run/model.safetensors"), FAILURE),
    (RuntimeError("failed to write: (os error 28)"), FAILURE),
    (MemoryError(), FAILURE),
    (FloatingPointError("non-finite loss at step 3"), FAILURE),
    (DistributedError("rank 1 stopped"), FAILURE),
    (ImportError("pip install 'bert-kit[serve]'"), FAILURE),
    (TypeError("unsupported operand"), FAILURE),
])
def test_describe_follows_the_rule(exc, code):
    got, message = describe(exc)
    assert got == code, (exc, message)
    assert "\n" not in message and message
    assert ("report it" in message) == isinstance(exc, TypeError)  # only the unexpected asks to be reported


def write_bad_label_file(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("sentence\tlabel\na cat\t0\na dog\t1\na fish\tnan\n")
    return path


# (what, argv builder, text the error line holds): each a wrong input, exit 2
WRONG_INPUTS = {
    "predict: --input missing": (lambda a, t: ["predict", "--model", a.classifier, "--input", t / "nope.txt",
                                               "--output", t / "o.jsonl", "--device", "cpu"], "nope.txt"),
    "embed: --input missing": (lambda a, t: ["embed", "--model", a.encoder, "--input", t / "nope.txt",
                                             "--output", t / "o.npy", "--device", "cpu"], "nope.txt"),
    "fill-mask: model folder missing": (lambda a, t: ["fill-mask", "--model", t / "no-model", "a [MASK]"], "no-model"),
    "evaluate: model folder missing": (lambda a, t: ["evaluate", "--model", t / "no-model", "--data", a.train_tsv],
                                       "no-model"),
    "finetune: model folder missing": (lambda a, t: ["finetune", "--config", a.finetune_yaml,
                                                     f"model={t / 'no-model'}", f"output_dir={t / 'o'}"], "no-model"),
    "finetune: train_file missing": (lambda a, t: ["finetune", "--config", a.finetune_yaml, "train_file=trian.tsv",
                                                   f"output_dir={t / 'o'}"], "train_file=trian.tsv: file not found"),
    "finetune: bad data line": (lambda a, t: ["finetune", "--config", a.finetune_yaml,
                                              f"train_file={write_bad_label_file(t)}", f"output_dir={t / 'o'}"],
                                "bad.tsv:4: label 'nan' is not a finite number"),
    "embed: corrupt safetensors": (lambda a, t: ["embed", "--model", corrupt_copy(a, t), "--input", a.corpus,
                                                 "--output", t / "o.npy", "--device", "cpu"],
                                   "is not a readable safetensors file"),
    "embed: config.json nested too deeply": (lambda a, t: ["embed", "--model", deep_config_copy(a, t), "--input",
                                                           a.corpus, "--output", t / "o.npy", "--device", "cpu"],
                                             "config.json: JSON nested too deeply to read"),
    "pretrain: --resume a missing checkpoint": (lambda a, t: ["pretrain", "--config", a.pretrain_yaml,
                                                              f"output_dir={t / 'o'}", "--resume", t / "nowhere"],
                                                "nowhere"),
}


def deep_config_copy(assets, tmp_path):
    folder = tmp_path / "deep"
    shutil.copytree(assets.mlm, folder)
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    return folder


def corrupt_copy(assets, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(assets.mlm, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return folder


@pytest.mark.parametrize("what", list(WRONG_INPUTS))
def test_a_wrong_input_exits_2(cli, assets, tmp_path, what):
    argv, needle = WRONG_INPUTS[what]
    cli(*argv(assets, tmp_path)).one_line_error(needle, code=USAGE)


def test_a_non_finite_loss_exits_1(cli, assets, tmp_path, single_thread):
    result = cli("pretrain", "--config", assets.pretrain_yaml, "lr=1e18", "max_steps=3", f"output_dir={tmp_path / 'o'}")
    result.one_line_error("non-finite loss at step", code=FAILURE)


def test_a_full_disk_exits_1(cli, assets, tmp_path, monkeypatch):
    import bert_kit.cli.embed

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(bert_kit.cli.embed, "write_file", full)
    cli("embed", "--model", assets.encoder, "--input", assets.corpus, "--output", tmp_path / "v.npy",
        "--device", "cpu").one_line_error("no space left on the device writing", code=FAILURE)


# ---- numeric flags: one usage line naming the flag and the range --------------------------------------------

FLAGS = [
    ("embed", "--batch-size", "0", "argument --batch-size: 0 is out of range: expected an integer >= 1"),
    ("embed", "--batch-size", "nan", "argument --batch-size: 'nan' is not an integer: expected an integer >= 1"),
    ("embed", "--batch-size", "1e40", "argument --batch-size: '1e40' is not an integer"),
    ("embed", "--batch-size", "99999999999999999999", "at most 9.22e+18 in size"),
    ("embed", "--max-length", "-3", "argument --max-length: -3 is out of range: expected an integer >= 3"),
    ("fill-mask", "--top-k", "0", "argument --top-k: 0 is out of range: expected an integer >= 1"),
    ("evaluate", "--batch-size", "-1", "argument --batch-size: -1 is out of range"),
    ("evaluate", "--max-examples", "0", "argument --max-examples: 0 is out of range"),
    ("evaluate", "--word-column", "-1", "argument --word-column: -1 is out of range: expected an integer >= 0"),
    ("evaluate", "--tag-column", "1.5", "argument --tag-column: '1.5' is not an integer"),
    ("evaluate", "--split-articles", "0", "argument --split-articles: 0 is out of range"),
    ("evaluate", "--score-range", "0 inf", "argument --score-range: inf is out of range: expected a finite number"),
    ("predict", "--max-length", "2", "argument --max-length: 2 is out of range: expected an integer >= 3"),
    ("attention", "--max-length", "1", "argument --max-length: 1 is out of range"),
    ("demo", "--pretrain-steps", "0", "argument --pretrain-steps: 0 is out of range: expected an integer >= 1"),
    ("demo", "--finetune-epochs", "inf", "--finetune-epochs: inf is out of range: expected a finite number > 0"),
    ("demo", "--seed", "-1", "argument --seed: -1 is out of range: expected an integer in [0, 4294967295]"),
    ("tokenizer", "--min-frequency", "-1", "argument --min-frequency: -1 is out of range: expected an integer >= 0"),
]

REQUIRED = {"embed": ["--model", "m", "--input", "i.txt", "--output", "o.npy"], "fill-mask": ["--model", "m", "[MASK]"],
            "evaluate": ["--model", "m", "--data", "d.tsv"], "attention": ["--model", "m", "--text", "t"],
            "predict": ["--model", "m", "--input", "i.txt", "--output", "o.jsonl"], "demo": [],
            "tokenizer": ["train", "--files", "f.txt", "--output", "tok"]}


@pytest.mark.parametrize("command, flag, value, needle", FLAGS, ids=[f"{c} {f} {v}" for c, f, v, _ in FLAGS])
def test_a_numeric_flag_out_of_range_is_a_usage_error(cli, command, flag, value, needle):
    result = cli(command, *REQUIRED[command], flag, *value.split())
    line = result.one_line_error(needle, code=USAGE)
    assert line.startswith(f"bert-kit {command}")


def test_a_warning_is_one_line_naming_the_command(cli, assets, tmp_path):
    """Python printed a warning in two lines, the second the source line that raised it."""
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"model={assets.encoder}", "max_steps=1",
                 f"output_dir={tmp_path / 'run'}")
    assert result.code == 0, result.err
    warned = [line for line in result.err.splitlines() if "newly initialised" in line]
    assert len(warned) == 1 and warned[0].startswith("bert-kit pretrain: warning: BERTForPreTraining: mlm.decoder.bias")
    assert "warnings.warn" not in result.err and "NewWeightsWarning" not in result.err


def test_an_invalid_choice_of_a_flag_names_the_nearest(cli):
    result = cli("evaluate", "--model", "m", "--data", "d", "--precision", "bf61")
    assert result.code == USAGE and "invalid choice: 'bf61'" in result.err and "did you mean 'bf16'?" in result.err
    result = cli("tokenizer", "trian")
    assert result.code == USAGE and "did you mean 'train'?" in result.err


# ---- devices: a device this machine lacks, or a name that is no device, in every command that runs a model --
DEVICE_COMMANDS = {
    "predict": lambda a, t: ["predict", "--model", a.classifier, "--input", a.corpus, "--output", t / "o.jsonl"],
    "evaluate": lambda a, t: ["evaluate", "--model", a.classifier, "--data", a.train_tsv, "--output", t / "e.json"],
    "embed": lambda a, t: ["embed", "--model", a.encoder, "--input", a.corpus, "--output", t / "o.npy"],
    "fill-mask": lambda a, t: ["fill-mask", "--model", a.mlm, "the [MASK] sees"],
    "attention": lambda a, t: ["attention", "--model", a.mlm, "--text", "the cat", "--output", t / "a.png"],
    "demo": lambda a, t: ["demo", "--output", t / "demo"],
}


@pytest.mark.parametrize("device", ["mps", "xpu", "xpu:0"])
@pytest.mark.parametrize("command", list(DEVICE_COMMANDS))
def test_a_device_this_machine_lacks_exits_2(cli, assets, tmp_path, command, device):
    """--device mps on a machine without MPS ended in "please report it" (exit 1); cuda got exit 2."""
    pytest.importorskip("torch")
    import torch

    if device.startswith("mps") and torch.backends.mps.is_available() or device.startswith("xpu") and \
            hasattr(torch, "xpu") and torch.xpu.is_available():
        pytest.skip(f"this machine has {device}")
    result = cli(*DEVICE_COMMANDS[command](assets, tmp_path), "--device", device)
    result.one_line_error(f"device='{device}' but", "is not available on this machine", "use cpu or auto", code=USAGE)
    assert not (tmp_path / "demo").exists()  # refused before anything was written


@pytest.mark.parametrize("device", ["", "cuda:x", "gpu", "CPU", "mps:0 "])
def test_a_malformed_device_is_a_usage_error(cli, assets, tmp_path, device):
    result = cli(*DEVICE_COMMANDS["predict"](assets, tmp_path), "--device", device)
    result.one_line_error(f"argument --device: {device!r} is not a device", code=USAGE)


@pytest.mark.parametrize("device", ["mps", "xpu", "npu", ""])
def test_a_run_config_device_the_machine_lacks_exits_2(cli, assets, tmp_path, device):
    import torch

    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has mps")
    result = cli("finetune", "--config", assets.finetune_yaml, f"device={device}", f"output_dir={tmp_path / 'o'}")
    result.one_line_error(f"device={device!r}", code=USAGE)
