"""Disk problems: output locations that cannot be used, and a disk that fills up mid-run.

Output locations (a file where a folder should be, a folder where a file should be, a
read-only folder) are refused before any work, with one error line naming the location and
exit code 2. A full disk is simulated where each writer reports it in its own way (Python:
OSError(ENOSPC) without a file name, from writes to /dev/full; torch.save: a RuntimeError;
safetensors and tokenizers: "os error 28" from Rust): the error line names the file being written, the exit code is 1, the
last complete checkpoint stays usable and a resumed run ends with the weights of a run that
never failed. As root, permission bits do not stop writes, so a read-only folder is simulated
by refusing file creation in it at the OS call.

Run: python -m pytest -q tests/bad_inputs/test_disk.py
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bert_kit.training.checkpoint import latest_checkpoint

USAGE, FAILURE = 2, 1


def commands(assets, tmp: Path, out: Path) -> dict[str, list]:
    """argv of each command with its output at `out`."""
    return {
        "pretrain-output_dir": ["pretrain", "--config", assets.pretrain_yaml, f"output_dir={out}"],
        "finetune-output_dir": ["finetune", "--config", assets.finetune_yaml, f"output_dir={out}"],
        "pretrain--output": ["pretrain", "--config", assets.pretrain_yaml, f"output_dir={tmp / 'run'}",
                             "--output", out],
        "finetune--output": ["finetune", "--config", assets.finetune_yaml, f"output_dir={tmp / 'run'}",
                             "--output", out],
        "predict": ["predict", "--model", assets.classifier, "--input", assets.corpus, "--output", out],
        "evaluate": ["evaluate", "--model", assets.classifier, "--data", assets.train_tsv, "--output", out],
        "embed": ["embed", "--model", assets.encoder, "--input", assets.corpus, "--output", out, "--max-length", 32],
        "attention": ["attention", "--model", assets.mlm, "--text", "the cat", "--output", out],
        "attention-npy": ["attention", "--model", assets.mlm, "--text", "the cat", "--output", tmp / "a.png",
                          "--save-npy", out],
        "plot": ["plot", assets.run, "--output", out],
        "convert": ["convert", "--input", assets.mlm, "--output", out],
        "tokenizer": ["tokenizer", "train", "--files", assets.corpus, "--vocab-size", 60, "--output", out],
        "demo": ["demo", "--output", out],
    }


FOLDER_OUTPUTS = ["pretrain-output_dir", "finetune-output_dir", "convert", "tokenizer", "demo"]
FILE_OUTPUTS = ["pretrain--output", "finetune--output", "predict", "evaluate", "embed", "attention", "attention-npy",
                "plot"]


@pytest.mark.parametrize("name", FOLDER_OUTPUTS)
def test_output_folder_is_a_file(cli, assets, tmp_path, name):
    out = tmp_path / "taken"
    out.write_text("someone's notes\n")
    cli(*commands(assets, tmp_path, out)[name]).one_line_error(f"{out} is a file, not a folder", code=USAGE)
    assert out.read_text() == "someone's notes\n"


@pytest.mark.parametrize("name", ["pretrain-output_dir", "finetune-output_dir", "embed", "predict"])
def test_output_under_a_file(cli, assets, tmp_path, name):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    out = blocker / "sub" / ("out.npy" if name == "embed" else "out")
    cli(*commands(assets, tmp_path, out)[name]).one_line_error(f"{blocker} is a file, not a folder", code=USAGE)


@pytest.mark.parametrize("name", FILE_OUTPUTS)
def test_output_file_is_a_folder(cli, assets, tmp_path, name):
    out = tmp_path / "results"
    out.mkdir()
    cli(*commands(assets, tmp_path, out)[name]).one_line_error(f"{out} is a folder: name a file", code=USAGE)


@pytest.fixture()
def unwritable(monkeypatch):
    """unwritable(folder, code): creating files in `folder` fails with `code` (EACCES or EROFS).
    Without root, permission bits do it too; the OS call is refused either way."""
    real_open, real_mkdir = os.open, os.mkdir

    def refuse(folder: Path, code: int = errno.EACCES) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o555)

        def inside(path) -> bool:
            return Path(os.fsdecode(path)).absolute().is_relative_to(folder.absolute())

        def fake_open(path, flags, *args, **kwargs):
            if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | getattr(os, "O_TMPFILE", 0)):
                raise OSError(code, os.strerror(code), os.fsdecode(path))
            return real_open(path, flags, *args, **kwargs)

        def fake_mkdir(path, *args, **kwargs):
            if inside(path):
                raise OSError(code, os.strerror(code), os.fsdecode(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "mkdir", fake_mkdir)
        return folder

    yield refuse
    monkeypatch.undo()


@pytest.mark.parametrize("code, reason", [(errno.EACCES, "Permission denied"), (errno.EROFS, "Read-only file system")])
@pytest.mark.parametrize("name", ["pretrain-output_dir", "finetune-output_dir", "convert", "embed"])
def test_output_in_a_read_only_folder(cli, assets, tmp_path, unwritable, name, code, reason):
    locked = unwritable(tmp_path / "locked", code)
    out = locked / ("vectors.npy" if name == "embed" else "out")
    cli(*commands(assets, tmp_path, out)[name]).one_line_error(f"cannot write in {locked} ({reason})",
                                                               "writable location", code=USAGE)


def test_unreadable_weights(cli, assets, tmp_path, monkeypatch):
    import safetensors.torch

    def denied(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(safetensors.torch, "load_file", denied)
    cli("convert", "--input", assets.mlm, "--output", tmp_path / "out").one_line_error(
        f"permission denied: {assets.mlm / 'model.safetensors'}", code=USAGE)  # a wrong input, not a failed run


# ---- a disk that fills up -----------------------------------------------------------------------

def full_file(path, mode: str = "w", *args, **kwargs):
    """`open(path, mode)` on a full disk: /dev/full under the file's name, so writes fail in C with
    OSError(ENOSPC) and no file name, exactly as Python reports a full disk."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    f = open("/dev/full", mode.replace("x", "w"), *args, **kwargs)
    (f.buffer.raw if hasattr(f, "buffer") else f.raw).name = str(path)
    return f


def fills_up(after: int):
    """A replacement for torch.save: `after` calls succeed, then the disk is full (torch reports
    a RuntimeError that names no file, and leaves a partial file)."""
    real_save, calls = torch.save, [0]

    def save(obj, f, *args, **kwargs):
        calls[0] += 1
        if calls[0] <= after:
            return real_save(obj, f, *args, **kwargs)
        Path(f).write_bytes(b"PK\x03\x04 partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    return save


@pytest.fixture()
def disk_full(monkeypatch):
    """The file system reports no free space (how a RuntimeError from torch.save is recognised)."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 << 30, 10 << 30, 0))


def test_full_disk_while_saving_a_checkpoint(cli, assets, tmp_path, monkeypatch, disk_full, single_thread):
    run = tmp_path / "run"
    monkeypatch.setattr(torch, "save", fills_up(after=1))  # step 2 saved, step 4 hits the full disk
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}")
    result.one_line_error("no space left on the device writing",
                          str(run / "checkpoints" / "step-0000004.tmp" / "trainer_state.pt"), "--resume latest",
                          code=FAILURE)
    assert latest_checkpoint(run) == run / "checkpoints" / "step-0000002"
    monkeypatch.undo()  # space was freed
    resumed = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "--resume", "latest")
    assert resumed.code == 0, resumed.err
    assert "resuming from" in resumed.out and "step-0000002 at step 2" in resumed.out
    final, straight = load_file(run / "final" / "model.safetensors"), load_file(assets.run / "final" / "model.safetensors")
    for key in straight:
        torch.testing.assert_close(final[key], straight[key], rtol=0, atol=0)


@pytest.mark.parametrize("writer", ["safetensors", "tokenizer"])
def test_full_disk_in_rust_writers(cli, assets, tmp_path, monkeypatch, writer):
    """safetensors and tokenizers report "(os error 28)" in an exception that names no file."""
    import safetensors.torch

    message = "No space left on device (os error 28)"
    if writer == "safetensors":
        def save_file(*args, **kwargs):
            raise safetensors.SafetensorError(f"Error while serializing: I/O error: {message}")

        monkeypatch.setattr(safetensors.torch, "save_file", save_file)
        argv, written = commands(assets, tmp_path, tmp_path / "out")["convert"], "model.safetensors.tmp"
    else:
        import bert_kit.tokenizer_training

        real_train = bert_kit.tokenizer_training.train_tokenizer

        class FullBackend:
            def __init__(self, backend):
                self._backend = backend

            def __getattr__(self, name):
                return getattr(self._backend, name)

            def save(self, path, *args):
                raise Exception(message)  # what the Rust writer raises

        def train(*args, **kwargs):
            tokenizer = real_train(*args, **kwargs)
            tokenizer.backend = FullBackend(tokenizer.backend)
            return tokenizer

        monkeypatch.setattr(bert_kit.tokenizer_training, "train_tokenizer", train)
        argv, written = commands(assets, tmp_path, tmp_path / "out")["tokenizer"], "tokenizer.json"
    cli(*argv).one_line_error("no space left on the device writing", str(tmp_path / "out"), written, code=FAILURE)


def test_full_disk_while_logging_metrics(cli, assets, tmp_path, monkeypatch, single_thread):
    import bert_kit.training.progress

    run = tmp_path / "run"
    monkeypatch.setattr(bert_kit.training.progress, "open", full_file, raising=False)
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}")
    result.one_line_error(f"no space left on the device writing {run / 'metrics.jsonl'}", code=FAILURE)


def fills_up_for(name: str):
    """`open` for bert_kit.outputs: the temporary file of output `name` is on a full disk."""
    def fake_open(path, mode="r", *args, **kwargs):
        if Path(path).name.startswith(f".{name}.") and "w" in mode:
            return full_file(path, mode, *args, **kwargs)
        return open(path, mode, *args, **kwargs)

    return fake_open


def test_full_disk_while_writing_predictions(cli, assets, tmp_path, monkeypatch):
    import bert_kit.outputs

    out = tmp_path / "predictions.jsonl"
    out.write_text("the previous predictions\n")
    monkeypatch.setattr(bert_kit.outputs, "open", fills_up_for(out.name), raising=False)
    cli(*commands(assets, tmp_path, out)["predict"]).one_line_error(
        f"no space left on the device writing {out}", code=FAILURE)
    assert out.read_text() == "the previous predictions\n"  # never half a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.jsonl"]  # no temporary file left


def test_full_disk_while_writing_embeddings(cli, assets, tmp_path, monkeypatch):
    import numpy as np

    def save(file, array, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "vectors.npy"
    monkeypatch.setattr(np, "save", save)
    cli(*commands(assets, tmp_path, out)["embed"]).one_line_error(f"no space left on the device writing {out}",
                                                                  code=FAILURE)


@pytest.mark.parametrize("name, written", [("evaluate", "metrics.json"), ("pretrain-results", "results.json")])
def test_full_disk_while_writing_json(cli, assets, tmp_path, monkeypatch, single_thread, name, written):
    import bert_kit.outputs

    monkeypatch.setattr(bert_kit.outputs, "open", fills_up_for(written), raising=False)
    if name == "evaluate":
        out = tmp_path / written
        argv = commands(assets, tmp_path, out)["evaluate"]
    else:
        out = tmp_path / "run" / written
        argv = ["pretrain", "--config", assets.pretrain_yaml, f"output_dir={tmp_path / 'run'}", "max_steps=2"]
    cli(*argv).one_line_error(f"no space left on the device writing {out}", code=FAILURE)
