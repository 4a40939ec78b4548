"""Outputs: a command replaces or deletes only what it wrote itself, and one run at a time per run folder.

Output files, one rule for every command that writes one: a symbolic link is written through (the
link stays, its target gets the result); an existing output that is not a regular file (here a
link to /dev/null, a FIFO) is refused before any work; an output that is one of the command's
inputs is refused; files get the mode the umask gives (0644 under umask 022).

Output folders hold a record of what bert-kit wrote there (`.bert-kit-files.json`): `overwrite`,
`convert` and `tokenizer train` replace or delete only what it lists, never a user's file, never
through a link, never an input of the run. A run folder is locked for the run's lifetime: a second
run into it stops at once, naming the process that holds it (a process killed with SIGKILL
releases it). Export's folders are tested in tests/test_export.py.

Run: .venv/bin/python -m pytest tests/bad_inputs/test_outputs.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bert_kit.outputs import RECORD, FolderLock, read_record
from bert_kit.training.checkpoint import list_checkpoints

pytestmark = pytest.mark.usefixtures("single_thread")
USAGE = 2
REPO = Path(__file__).resolve().parents[2]


def file_commands(assets, tmp: Path, out: Path) -> dict[str, list]:
    """argv of each command that writes one output file, at `out` (fast ones: no training)."""
    return {
        "predict": ["predict", "--model", assets.classifier, "--input", assets.corpus, "--output", out],
        "evaluate": ["evaluate", "--model", assets.classifier, "--data", assets.train_tsv, "--output", out],
        "embed": ["embed", "--model", assets.encoder, "--input", assets.corpus, "--output", out, "--max-length", 32],
        "plot": ["plot", assets.run, "--output", out],
        "attention": ["attention", "--model", assets.mlm, "--text", "the cat", "--output", out],
    }


@pytest.fixture()
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


# ---- output files ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["predict", "evaluate", "embed", "plot"])
def test_an_output_that_is_a_link_is_written_through(cli, assets, tmp_path, name):
    target = tmp_path / "kept" / "result"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "out"
    link.symlink_to(target)
    result = cli(*file_commands(assets, tmp_path, link)[name])
    assert result.code == 0, result.err
    assert link.is_symlink() and link.resolve() == target  # the link stays
    assert target.read_bytes() != b"old" and len(target.read_bytes()) > 8  # the result went to its target
    assert sorted(p.name for p in target.parent.iterdir()) == ["result"]  # no temporary file left


@pytest.mark.parametrize("name", ["predict", "evaluate", "embed", "plot", "attention"])
def test_an_output_that_is_a_device_is_refused(cli, assets, tmp_path, name):
    out = tmp_path / "out"
    out.symlink_to("/dev/null")  # a character device behind a link, as /dev/stdout is
    cli(*file_commands(assets, tmp_path, out)[name]).one_line_error(
        f"--output {out} is a character device, not a regular file", code=USAGE)
    assert out.is_symlink() and os.readlink(out) == "/dev/null"


def test_an_output_that_is_a_fifo_is_refused(cli, assets, tmp_path):
    out = tmp_path / "pipe"
    os.mkfifo(out)
    cli(*file_commands(assets, tmp_path, out)["predict"]).one_line_error(f"--output {out} is a FIFO", code=USAGE)
    assert stat.S_ISFIFO(os.lstat(out).st_mode)  # not replaced by a file


def test_the_pictures_and_arrays_beside_an_output_follow_the_rule(cli, assets, tmp_path):
    """attention's PNG and --save-npy, and evaluate's confusion matrix, were written in place with
    savefig/np.save: through a link but not whole, and a device behind the name was written to."""
    kept = tmp_path / "kept"
    kept.mkdir()
    for name in ("grid.png", "maps.npy", "eval_confusion_matrix.png"):
        (kept / name).write_text("old")
        (tmp_path / name).symlink_to(kept / name)
    result = cli("attention", "--model", assets.mlm, "--text", "the cat", "--output", tmp_path / "grid.png",
                 "--save-npy", tmp_path / "maps.npy")
    assert result.code == 0, result.err
    assert cli("evaluate", "--model", assets.classifier, "--data", assets.train_tsv,
               "--output", tmp_path / "eval.json").code == 0
    for name, magic in (("grid.png", b"\x89PNG"), ("maps.npy", b"\x93NUMPY"), ("eval_confusion_matrix.png", b"\x89PNG")):
        assert (tmp_path / name).is_symlink() and (kept / name).read_bytes().startswith(magic), name
    assert sorted(p.name for p in kept.iterdir()) == ["eval_confusion_matrix.png", "grid.png", "maps.npy"]
    cli("attention", "--model", assets.mlm, "--text", "the cat", "--output", tmp_path / "a.png",
        "--save-npy", tmp_path / "a.png").one_line_error("--save-npy", code=USAGE)


def test_evaluates_default_outputs_are_checked_before_the_evaluation(cli, assets, tmp_path):
    """Without --output, evaluate writes eval_{task}_{data}.json and its confusion matrix in the
    working directory: a device or folder there was found only after the evaluation."""
    (tmp_path / "eval_classification_train.json").symlink_to("/dev/null")
    cli("evaluate", "--model", assets.classifier, "--data", assets.train_tsv).one_line_error(
        "the default --output eval_classification_train.json is a character device", code=USAGE)
    (tmp_path / "eval_classification_train.json").unlink()
    (tmp_path / "eval_classification_train_confusion_matrix.png").mkdir()
    cli("evaluate", "--model", assets.classifier, "--data", assets.train_tsv).one_line_error(
        "the confusion matrix beside the default --output eval_classification_train_confusion_matrix.png is a folder",
        code=USAGE)
    assert not (tmp_path / "eval_classification_train.json").exists()  # refused before anything was written


def test_evaluation_of_another_model_does_not_replace_the_default_output(cli, assets, tmp_path):
    """eval_{task}_{data}.json of one model was replaced silently by the next model scored on the
    same file (the documented commands do that: runs/demo/finetune, then runs/finetune_sst2, on
    a dev.tsv each): the same model (however it is named) replaces its own evaluation, another
    model's goes to a file named after it, and the command says so."""
    runs = tmp_path / "runs"
    other = assets.copy("classifier", runs / "other" / "best")
    default = tmp_path / "eval_classification_train.json"
    assert cli("evaluate", "--model", assets.classifier, "--data", assets.train_tsv).code == 0
    first = json.loads(default.read_text())
    assert first["model_path"] == str(assets.classifier.resolve())
    second = cli("evaluate", "--model", "runs/other/best", "--data", assets.train_tsv)
    assert second.code == 0 and "wrote eval_classification_train_other-best.json" in second.out
    assert "evaluate: eval_classification_train.json holds the evaluation of another model " \
           f"({assets.classifier}): writing eval_classification_train_other-best.json" in second.err
    assert json.loads(default.read_text()) == first  # kept
    assert json.loads((tmp_path / "eval_classification_train_other-best.json").read_text())["model_path"] == \
        str(other.resolve())
    assert (tmp_path / "eval_classification_train_other-best_confusion_matrix.png").is_file()
    # the same folder named another way replaces its own evaluation, as does the other model
    relative = os.path.relpath(assets.classifier, tmp_path) + "/"
    again = cli("evaluate", "--model", relative, "--data", assets.train_tsv)
    assert again.code == 0 and "wrote eval_classification_train.json" in again.out and "holds" not in again.err
    assert json.loads(default.read_text())["model"] == relative
    assert "wrote eval_classification_train_other-best.json" in \
        cli("evaluate", "--model", other, "--data", assets.train_tsv).out
    # a third model of the same short name gets a number
    assets.copy("classifier", tmp_path / "elsewhere" / "other" / "best")
    third = cli("evaluate", "--model", "elsewhere/other/best", "--data", assets.train_tsv)
    assert "wrote eval_classification_train_other-best_2.json" in third.out


@pytest.mark.parametrize("name, flag", [("predict", "--input"), ("embed", "--input"), ("evaluate", "--data")])
def test_an_output_that_is_an_input_is_refused(cli, assets, tmp_path, name, flag):
    data = tmp_path / "data.tsv"
    shutil.copy(assets.train_tsv if name == "evaluate" else assets.corpus, data)
    before = data.read_bytes()
    link = tmp_path / "same-file"
    link.symlink_to(data)
    for out in (data, link):  # the file itself, and the same file through a link
        argv = [str(a) for a in file_commands(assets, tmp_path, out)[name]]
        argv[argv.index(flag) + 1] = str(data)
        cli(*argv).one_line_error(f"--output {out} is the input file {data}", code=USAGE)
    assert data.read_bytes() == before


@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_the_results_file_of_a_run_follows_the_rule(cli, assets, tmp_path, command):
    config = assets.pretrain_yaml if command == "pretrain" else assets.finetune_yaml
    device = tmp_path / "device"
    device.symlink_to("/dev/null")
    argv = [command, "--config", config, f"output_dir={tmp_path / 'run'}", "max_steps=2"]
    cli(*argv, "--output", device).one_line_error(f"--output {device} is a character device", code=USAGE)
    cli(*argv, "--output", config).one_line_error(f"--output {config} is the input file {config}", code=USAGE)
    assert not (tmp_path / "run").exists()  # refused before any work


def test_plot_refuses_to_write_over_the_metrics_it_reads(cli, assets, tmp_path):
    run = assets.copy("run", tmp_path / "run")
    before = (run / "metrics.jsonl").read_bytes()
    cli("plot", run, "--output", run / "metrics.jsonl").one_line_error("is the input file", code=USAGE)
    assert (run / "metrics.jsonl").read_bytes() == before


def test_written_files_get_the_mode_of_the_umask(cli, assets, tmp_path, umask_022):
    out = tmp_path / "predictions.jsonl"
    assert cli(*file_commands(assets, tmp_path, out)["predict"]).code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    out.chmod(0o600)  # a file the user made private stays private when it is replaced
    assert cli(*file_commands(assets, tmp_path, out)["predict"]).code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


# ---- convert and tokenizer train: folders with a record ------------------------------------------

def test_convert_writes_readable_files_and_replaces_only_its_own(cli, assets, tmp_path, umask_022):
    out = tmp_path / "converted"
    assert cli("convert", "--input", assets.mlm, "--output", out).code == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([RECORD, "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                            "vocab.txt"])
    for f in out.iterdir():  # model.safetensors was 0600: the safetensors writer's own mode
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
    assert sorted(read_record(out)) == sorted(n for n in names if n != RECORD)
    assert cli("convert", "--input", assets.encoder, "--output", out, "--head", "base").code == 0  # its own: replaced
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]


def test_convert_refuses_a_folder_holding_a_users_files(cli, assets, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}\n')
    (out / "notes.txt").write_text("keep me\n")
    cli("convert", "--input", assets.mlm, "--output", out).one_line_error(
        f"--output {out} holds files that no earlier bert-kit convert wrote there (config.json, notes.txt)", code=USAGE)
    assert (out / "config.json").read_text() == '{"mine": true}\n'
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "notes.txt"]


def test_tokenizer_train_refuses_a_model_folder(cli, assets, tmp_path):
    model = assets.copy("classifier", tmp_path / "model")
    vocab = (model / "vocab.txt").read_bytes()
    cli("tokenizer", "train", "--files", assets.corpus, "--vocab-size", 60, "--output", model).one_line_error(
        f"--output {model} holds a model (config.json, model.safetensors)", code=USAGE)
    assert (model / "vocab.txt").read_bytes() == vocab


def test_tokenizer_train_replaces_its_own_folder_and_refuses_a_users(cli, assets, tmp_path):
    out = tmp_path / "tok"
    argv = ["tokenizer", "train", "--files", assets.corpus, "--vocab-size", 60, "--output", out]
    assert cli(*argv).code == 0
    assert cli(*argv[:4], "--vocab-size", 80, "--output", out).code == 0  # its own earlier output: replaced
    assert len((out / "vocab.txt").read_text().splitlines()) > 60
    (out / "corpus-notes.md").write_text("mine\n")
    cli(*argv).one_line_error("holds files that no earlier bert-kit tokenizer train wrote there (corpus-notes.md)",
                              code=USAGE)


# ---- overwrite: only what a run recorded, never an input, never through a link -------------------

def finetuned_run(cli, assets, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    result = cli("finetune", "--config", assets.finetune_yaml, f"output_dir={run}")
    assert result.code == 0, result.err
    assert (run / "best" / "config.json").is_file() and "best" in read_record(run)
    return run


def test_overwrite_refuses_to_delete_the_runs_own_input_model(cli, assets, tmp_path):
    run = finetuned_run(cli, assets, tmp_path)
    kept = sorted(p.name for p in (run / "best").iterdir())
    cli("finetune", "--config", assets.finetune_yaml, f"output_dir={run}", f"model={run / 'best'}",
        "overwrite=true").one_line_error(f"overwrite=true would delete {run / 'best'}, which holds this run's model=",
                                         code=USAGE)
    assert sorted(p.name for p in (run / "best").iterdir()) == kept  # nothing deleted, not even checkpoints
    assert list_checkpoints(run / "checkpoints")


def test_overwrite_removes_a_link_and_never_what_it_points_to(cli, assets, tmp_path):
    run = finetuned_run(cli, assets, tmp_path)
    elsewhere = tmp_path / "my-best-model"
    (run / "best").rename(elsewhere)
    (run / "best").symlink_to(elsewhere)
    kept = sorted(p.name for p in elsewhere.iterdir())
    result = cli("finetune", "--config", assets.finetune_yaml, f"output_dir={run}", "overwrite=true")
    assert result.code == 0, result.err
    assert sorted(p.name for p in elsewhere.iterdir()) == kept
    assert not (run / "best").is_symlink() and (run / "best" / "config.json").is_file()


def test_a_users_tokenizer_in_the_run_folder_is_neither_a_run_nor_deleted(cli, assets, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(assets.tokenizer, run / "tokenizer")
    (run / "notes.txt").write_text("mine\n")
    argv = ["pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", f"tokenizer={run / 'tokenizer'}",
            "max_steps=2"]
    first = cli(*argv)  # a fresh run: only files a run wrote count as a run
    assert first.code == 0, first.err
    assert "tokenizer" not in read_record(run) and "notes.txt" not in read_record(run)
    again = cli(*argv, "overwrite=true")
    assert again.code == 0, again.err
    assert (run / "tokenizer" / "vocab.txt").is_file() and (run / "notes.txt").read_text() == "mine\n"


def test_a_fresh_run_refuses_to_replace_a_file_no_run_wrote(cli, assets, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text('{"mine": 1}\n')
    cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=2").one_line_error(
        f"{run} holds results.json, which no bert-kit run wrote there", code=USAGE)
    assert (run / "results.json").read_text() == '{"mine": 1}\n'


def test_overwrite_of_a_run_folder_from_before_records(cli, assets, tmp_path):
    """A folder without a record that has run_config.yaml: the run's files are its record."""
    run = assets.copy("run", tmp_path / "run")
    (run / RECORD).unlink()
    (run / "notes.txt").write_text("mine\n")
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=2", "overwrite=true")
    assert result.code == 0, result.err
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step-0000002"]
    assert (run / "notes.txt").read_text() == "mine\n"


def test_model_folders_and_checkpoints_record_their_files(assets):
    final = assets.run / "final"
    assert sorted(read_record(final)) == sorted(p.name for p in final.iterdir() if p.name != RECORD)
    for checkpoint in list_checkpoints(assets.run / "checkpoints"):
        assert "trainer_state.pt" in read_record(checkpoint)


# ---- one run at a time ---------------------------------------------------------------------------

def test_a_second_run_into_a_locked_folder_stops_at_once(cli, assets, tmp_path):
    run = tmp_path / "run"
    with FolderLock(run):  # a run of this process holds it
        cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=2").one_line_error(
            f"{run} is in use by another run (pid {os.getpid()}", code=USAGE)
        assert not (run / "metrics.jsonl").exists()
    result = cli("pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=2")
    assert result.code == 0, result.err


def test_a_file_system_without_locks_warns_and_runs(assets, tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    lock = FolderLock(tmp_path / "run").acquire()
    assert lock.fd is None and "warning: cannot lock" in capsys.readouterr().err
    lock.release()


def test_the_lock_of_another_process_and_its_release_when_killed(cli, assets, tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from bert_kit.outputs import FolderLock; "
                               "FolderLock(sys.argv[1]).acquire(); print('locked', flush=True); sys.stdin.read()",
         str(run)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        argv = ["pretrain", "--config", assets.pretrain_yaml, f"output_dir={run}", "max_steps=2"]
        cli(*argv).one_line_error(f"{run} is in use by another run (pid {holder.pid}", code=USAGE)
        holder.kill()  # SIGKILL: no clean-up code runs, the OS releases the lock
        holder.wait()
        result = cli(*argv)
        assert result.code == 0, result.err
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["type"] == "train"]
    assert steps == [1, 2]  # one run's records


@pytest.mark.parametrize("command, folder", [("pretrain", "final"), ("finetune", "best")])
def test_results_name_the_model_folder_written_at_the_end(cli, assets, tmp_path, monkeypatch, command, folder):
    """The model folder is written in the background while the run ends; results.json said
    `"best_model": null` (`"final_model": null`) whenever that write was still going on: when the
    last evaluation is the best, in every pretraining run whose write outlasted the plot, in glue runs."""
    import time

    import bert_kit.training.loop as loop

    write = loop.write_folder_atomically

    def slow_write(*args, **kwargs):
        time.sleep(1.0)  # a big model on a slow disk
        return write(*args, **kwargs)

    monkeypatch.setattr(loop, "write_folder_atomically", slow_write)
    config = assets.pretrain_yaml if command == "pretrain" else assets.finetune_yaml
    run = tmp_path / "run"
    result = cli(command, "--config", config, f"output_dir={run}", "eval_every=100")  # only the last evaluation
    assert result.code == 0, result.err
    results = json.loads((run / "results.json").read_text())
    assert results[f"{folder}_model"] == str(run / folder) and (run / folder / "model.safetensors").is_file()
