"""Bad model folders and checkpoints: every command that loads one says which file is broken.

Inputs: truncated, empty or garbage `model.safetensors` in each of the eight commands that load
weights; broken `config.json`; weights that do not fit the config; pickles that would run code
(refused, and the payload never runs); broken tokenizer files; missing folders. Outcome: one
error line naming the file, exit code 1 (the run failed), no traceback.

Checkpoints: a corrupt newest checkpoint (trainer_state.pt truncated, empty, garbage, an unsafe
or foreign pickle; model.safetensors truncated) is reported in one line and the run resumes
from the previous complete one, ending with the same weights as an uninterrupted run; a corrupt
checkpoint named directly, or none readable at all, is an error.

Run: python -m pytest -q tests/bad_inputs/test_model_folders.py
"""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WRONG_INPUT = 2  # exit code of a wrong input: a missing or corrupt model, tokenizer or checkpoint (1: a failed run)


def truncate(path: Path, keep: int | float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(keep if keep >= 1 else len(data) * keep)])


WEIGHT_DAMAGE = {
    "header-cut": lambda p: truncate(p, 100),
    "data-cut": lambda p: truncate(p, 0.5),
    "empty": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(random.Random(0).randbytes(4096)),
}


def command(name: str, folder: Path, assets, tmp: Path) -> list:
    """argv of command `name` loading model folder `folder`."""
    return {
        "fill-mask": ["fill-mask", "--model", folder, "the [MASK] cat"],
        "embed": ["embed", "--model", folder, "--input", assets.corpus, "--output", tmp / "e.npy", "--max-length", 32],
        "attention": ["attention", "--model", folder, "--text", "the cat", "--output", tmp / "a.png"],
        "convert": ["convert", "--input", folder, "--output", tmp / "converted"],
        "evaluate": ["evaluate", "--model", folder, "--data", assets.train_tsv, "--output", tmp / "m.json"],
        "predict": ["predict", "--model", folder, "--input", assets.corpus, "--output", tmp / "p.jsonl"],
        "finetune": ["finetune", "--config", assets.finetune_yaml, f"model={folder}", f"output_dir={tmp / 'ft'}"],
        "pretrain": ["pretrain", "--config", assets.pretrain_yaml, f"model={folder}", f"output_dir={tmp / 'pre'}"],
    }[name]


def source_of(name: str) -> str:
    """Which asset folder the command needs: a fine-tuned classifier, or an MLM model."""
    return "classifier" if name in ("evaluate", "predict") else "mlm"


COMMANDS = ["fill-mask", "embed", "attention", "convert", "evaluate", "predict", "finetune", "pretrain"]


@pytest.mark.parametrize("damage", list(WEIGHT_DAMAGE))
@pytest.mark.parametrize("name", COMMANDS)
def test_broken_weights(cli, assets, tmp_path, single_thread, name, damage):
    folder = assets.copy(source_of(name), tmp_path / "model")
    WEIGHT_DAMAGE[damage](folder / "model.safetensors")
    result = cli(*command(name, folder, assets, tmp_path))
    result.one_line_error(f"{folder / 'model.safetensors'} is not a readable safetensors file", "truncated or corrupt",
                          code=WRONG_INPUT)


CONFIG_DAMAGE = {
    "invalid-json": (b'{"hidden_size": 32,\n  "num_hidden_layers" 2}\n', ["config.json:2: invalid JSON"]),
    "not-utf8": (b'{"model_type": "bert",\n "note": "caf\xe9"}\n', ["config.json:2: not UTF-8 text"]),
    "a-list": (b"[1, 2]\n", ["config.json: expected a mapping"]),
    "t5": (None, ["model_type 't5' is a model family bert-kit does not build; it builds bert, roberta"]),
    "heads-3": (None, ["hidden_size (32) must be divisible by num_attention_heads (3)"]),
    "layers-0": (None, ["num_hidden_layers=0 is out of range", ">= 1"]),
    "dropout-2": (None, ["hidden_dropout_prob=2", "[0, 1)"]),
    "missing": (None, ["config.json"]),
}
CONFIG_CHANGES = {"t5": {"model_type": "t5"}, "heads-3": {"num_attention_heads": 3},
                  "layers-0": {"num_hidden_layers": 0}, "dropout-2": {"hidden_dropout_prob": 2}}


@pytest.mark.parametrize("damage", list(CONFIG_DAMAGE))
@pytest.mark.parametrize("name", ["fill-mask", "embed", "evaluate"])
def test_broken_config_json(cli, assets, tmp_path, name, damage):
    folder = assets.copy(source_of(name), tmp_path / "model")
    config = folder / "config.json"
    raw, needles = CONFIG_DAMAGE[damage]
    if damage == "missing":
        config.unlink()
    elif raw is not None:
        config.write_bytes(raw)
    else:
        config.write_text(json.dumps({**json.loads(config.read_text()), **CONFIG_CHANGES[damage]}))
    result = cli(*command(name, folder, assets, tmp_path))
    line = result.one_line_error(*needles, code=WRONG_INPUT)
    assert str(folder) in line


@pytest.mark.parametrize("name", ["fill-mask", "embed", "convert"])
def test_weights_that_do_not_fit_the_config(cli, assets, tmp_path, name):
    folder = assets.copy("mlm", tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=64, intermediate_size=128)
    (folder / "config.json").write_text(json.dumps(config))
    result = cli(*command(name, folder, assets, tmp_path))
    line = result.one_line_error(f"{folder} does not match", "shape mismatch", "checkpoint (", code=WRONG_INPUT)
    assert "\n" not in line


class Payload:
    """Unpickling this runs `touch MARKER`: what a hostile checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("pickler", ["torch-zip", "raw-pickle"])
@pytest.mark.parametrize("name", ["fill-mask", "embed", "convert"])
def test_unsafe_pytorch_model_bin_is_refused(cli, assets, tmp_path, name, pickler):
    folder = assets.copy("mlm", tmp_path / "model")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "payload-ran"
    weights = {k: v for k, v in load_file(assets.mlm / "model.safetensors").items()}
    weights["evil"] = Payload(marker)
    if pickler == "torch-zip":
        torch.save(weights, folder / "pytorch_model.bin")
    else:
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps(weights, protocol=2))
    result = cli(*command(name, folder, assets, tmp_path))
    result.one_line_error(f"{folder / 'pytorch_model.bin'} is not a safe checkpoint", "refuses to unpickle",
                          code=WRONG_INPUT)
    assert not marker.exists()


def test_truncated_pytorch_model_bin(cli, assets, tmp_path):
    folder = assets.copy("mlm", tmp_path / "model")
    (folder / "model.safetensors").unlink()
    torch.save(load_file(assets.mlm / "model.safetensors"), folder / "pytorch_model.bin")
    truncate(folder / "pytorch_model.bin", 0.5)
    result = cli(*command("convert", folder, assets, tmp_path))
    result.one_line_error(f"{folder / 'pytorch_model.bin'} is truncated", code=WRONG_INPUT)


def test_garbage_tokenizer_json(cli, assets, tmp_path):
    folder = assets.copy("mlm", tmp_path / "model")
    (folder / "tokenizer.json").write_text('{"model": {"type": "WordPiece", "vocab": 12}}')
    cli(*command("embed", folder, assets, tmp_path)).one_line_error(f"cannot read {folder / 'tokenizer.json'}",
                                                                    code=WRONG_INPUT)


def test_vocab_txt_not_utf8(cli, assets, tmp_path):
    folder = assets.copy("mlm", tmp_path / "model")
    (folder / "tokenizer.json").unlink()
    vocab = (folder / "vocab.txt").read_bytes().split(b"\n")
    vocab[7] = b"caf\xe9"
    (folder / "vocab.txt").write_bytes(b"\n".join(vocab))
    cli(*command("fill-mask", folder, assets, tmp_path)).one_line_error(f"{folder / 'vocab.txt'}:8: not UTF-8 text",
                                                                        code=WRONG_INPUT)


def test_tokenizer_config_not_json(cli, assets, tmp_path):
    folder = assets.copy("mlm", tmp_path / "model")
    (folder / "tokenizer_config.json").write_text("{'do_lower_case': True}")
    cli(*command("attention", folder, assets, tmp_path)).one_line_error(
        f"{folder / 'tokenizer_config.json'}:1: invalid JSON", code=WRONG_INPUT)


def test_no_tokenizer_files(cli, assets, tmp_path):
    folder = assets.copy("mlm", tmp_path / "model")
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        (folder / name).unlink()
    cli(*command("fill-mask", folder, assets, tmp_path)).one_line_error("no tokenizer.json or vocab.txt", str(folder),
                                                                        code=WRONG_INPUT)


@pytest.mark.parametrize("name", ["fill-mask", "embed", "evaluate", "convert", "attention"])
def test_model_folder_missing(cli, assets, tmp_path, name):
    result = cli(*command(name, tmp_path / "no-such-model", assets, tmp_path))
    result.one_line_error("no-such-model", code=WRONG_INPUT)


def test_model_is_a_file(cli, assets, tmp_path):
    cli(*command("embed", assets.corpus, assets, tmp_path)).one_line_error(str(assets.corpus), code=WRONG_INPUT)


def test_fill_mask_on_an_encoder_without_mlm_head(cli, assets, tmp_path):
    cli(*command("fill-mask", assets.encoder, assets, tmp_path)).one_line_error("has no MLM head weights",
                                                                                code=WRONG_INPUT)


def test_evaluate_a_folder_that_records_no_task(cli, assets, tmp_path):
    cli(*command("evaluate", assets.mlm, assets, tmp_path)).one_line_error("does not record its task", "--task",
                                                                           code=WRONG_INPUT)


# ---- checkpoints ---------------------------------------------------------------------------------------

STATE_DAMAGE = {
    "state-cut": lambda ckpt, tmp: truncate(ckpt / "trainer_state.pt", 1000),
    "state-empty": lambda ckpt, tmp: (ckpt / "trainer_state.pt").write_bytes(b""),
    "state-garbage": lambda ckpt, tmp: (ckpt / "trainer_state.pt").write_bytes(random.Random(1).randbytes(2048)),
    "state-payload": lambda ckpt, tmp: torch.save({"format_version": 1, "x": Payload(tmp / "payload-ran")},
                                                  ckpt / "trainer_state.pt"),
    "state-foreign": lambda ckpt, tmp: torch.save([1, 2, 3], ckpt / "trainer_state.pt"),
    "weights-cut": lambda ckpt, tmp: truncate(ckpt / "model.safetensors", 0.5),
}
STATE_MESSAGE = {
    "state-cut": "trainer_state.pt is truncated: its zip archive has no end", "state-empty": "trainer_state.pt is empty",
    "state-garbage": "trainer_state.pt is truncated or corrupt",
    "state-payload": "trainer_state.pt is not a safe checkpoint",
    "state-foreign": "trainer_state.pt: not a bert-kit trainer state",
    "weights-cut": "model.safetensors is not a readable safetensors file",
}


def weights_of(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.mark.parametrize("damage", list(STATE_DAMAGE))
def test_corrupt_newest_checkpoint_falls_back(cli, assets, tmp_path, single_thread, damage):
    run = assets.copy("run", tmp_path / "run")
    newest = run / "checkpoints" / "step-0000006"
    STATE_DAMAGE[damage](newest, tmp_path)
    (run / "results.json").unlink()  # as a crash while step 6 was saved leaves the run: unfinished
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "--resume", "latest")
    assert result.code == 0, result.err
    warnings = [ln for ln in result.err.splitlines() if ln.startswith("warning: skipping checkpoint step-0000006")]
    assert len(warnings) == 1 and STATE_MESSAGE[damage] in warnings[0], result.err
    assert "error:" not in result.err
    assert f"resuming from {run / 'checkpoints' / 'step-0000004'} at step 4" in result.out
    assert not (tmp_path / "payload-ran").exists()
    # steps 5 and 6 trained again from the step-4 checkpoint: the very weights of the uninterrupted run
    resumed, straight = weights_of(run / "final"), weights_of(assets.run / "final")
    assert resumed.keys() == straight.keys()
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=0)


@pytest.mark.parametrize("damage", ["state-cut", "state-payload", "weights-cut"])
def test_corrupt_checkpoint_named_directly_is_an_error(cli, assets, tmp_path, damage):
    run = assets.copy("run", tmp_path / "run")
    newest = run / "checkpoints" / "step-0000006"
    STATE_DAMAGE[damage](newest, tmp_path)
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "--resume", newest)
    result.one_line_error(f"cannot resume from {newest}", STATE_MESSAGE[damage], "earlier checkpoint", code=WRONG_INPUT)
    assert not (tmp_path / "payload-ran").exists()


def test_resume_without_config_from_a_corrupt_checkpoint(cli, assets, tmp_path):
    run = assets.copy("run", tmp_path / "run")
    newest = run / "checkpoints" / "step-0000006"
    (newest / "trainer_state.pt").write_bytes(b"")
    cli("pretrain", "--resume", newest).one_line_error(f"cannot resume from {newest}", "is empty", code=WRONG_INPUT)


def test_every_checkpoint_corrupt(cli, assets, tmp_path):
    run = assets.copy("run", tmp_path / "run")
    for ckpt in (run / "checkpoints").glob("step-*"):
        truncate(ckpt / "trainer_state.pt", 500)
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "--resume", "latest")
    result.one_line_error("no complete checkpoint", "3 corrupt checkpoint(s) skipped", code=WRONG_INPUT)
    assert len([ln for ln in result.err.splitlines() if ln.startswith("warning: skipping")]) == 3


@pytest.mark.parametrize("where", ["missing", "empty-folder", "file"])
def test_resume_from_nothing(cli, assets, tmp_path, where):
    target = tmp_path / "nothing"
    if where == "empty-folder":
        target.mkdir()
    elif where == "file":
        target.write_text("not a checkpoint")
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={tmp_path / 'out'}", "--resume", target)
    result.one_line_error(f"no checkpoint at {target}", code=WRONG_INPUT)


def test_resume_latest_in_a_fresh_folder(cli, assets, tmp_path):
    result = cli("finetune", "--config", assets.finetune_yaml, f"output_dir={tmp_path / 'new'}", "--resume", "latest")
    result.one_line_error("no complete checkpoint", str(tmp_path / "new"), code=WRONG_INPUT)


def test_finetune_resume_skips_a_corrupt_newest_checkpoint(cli, assets, tmp_path, single_thread):
    out = tmp_path / "ft"
    first = cli("finetune", "--config", assets.finetune_yaml, f"output_dir={out}")
    assert first.code == 0, first.err
    (out / "checkpoints" / "step-0000004" / "trainer_state.pt").write_bytes(b"\x00" * 100)
    (out / "results.json").unlink()  # a crash while step 4 was saved
    result = cli("finetune", "--config", assets.finetune_yaml, f"output_dir={out}", "--resume", "latest")
    assert result.code == 0, result.err
    assert "warning: skipping checkpoint step-0000004" in result.err and "error:" not in result.err
    assert f"resuming from {out / 'checkpoints' / 'step-0000002'} at step 2" in result.out
