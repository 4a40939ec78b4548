"""benchmarks/pretrain_transfer.py's bookkeeping, with the commands it runs replaced by fakes: the
variants and the control each run once on a free GPU, and two steps run side by side on one work
folder keep each other's results."""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def pt(monkeypatch):
    spec = importlib.util.spec_from_file_location("pretrain_transfer", ROOT / "benchmarks" / "pretrain_transfer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.time, "sleep", lambda s: None)
    return module


def fake_popen(launched):
    class Proc:
        returncode = 0

        def __init__(self, cmd, cwd, stdout, stderr, env):
            work, only = Path(cmd[cmd.index("--work") + 1]), cmd[cmd.index("--only") + 1]
            launched.append((work.name, env["CUDA_VISIBLE_DEVICES"], cmd[cmd.index("--only"):]))
            if work.name == "broken":  # failed before its first result
                self.returncode = 1
                return
            key = "control" if only == "control" else "pretrained"
            (work / "transfer.json").write_text(json.dumps({key: {"sst2": {"metric": "accuracy", "best": 0.5}}}))

        def poll(self):
            return self.returncode
    return Proc


@pytest.mark.parametrize("control", [True, False])
def test_compare_runs_each_variant_and_the_control_once(pt, tmp_path, monkeypatch, capsys, control):
    launched = []
    monkeypatch.setattr(pt.subprocess, "Popen", fake_popen(launched))
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "vocab.txt").write_text("[PAD]\n")
    args = argparse.Namespace(work=tmp_path, corpus=Path("corpus"), data_dir=Path("data"), gpus="0,1",
                              variants=["recipe:", "big:batch_size=512 lr=2e-3"], budget="6m", tasks="sst2",
                              finetune_set=[], control=control, glue_data=Path("data/glue"))
    pt.compare(args)
    expected = [("recipe", ["--only", "pretrained"]), ("big", ["--only", "pretrained", "--set", "batch_size=512",
                                                               "lr=2e-3"])]
    if control:
        expected.insert(0, ("control", ["--only", "control"]))
    assert [(name, extra[:len(e)]) for (name, _, extra), (_, e) in zip(launched, expected)] == expected
    assert {gpu for _, gpu, _ in launched} <= {"0", "1"}
    assert all((tmp_path / name / "tokenizer" / "vocab.txt").exists() for name, _ in expected)
    header = next(line for line in capsys.readouterr().out.splitlines() if "recipe" in line and "big" in line)
    assert header.split() == ["recipe", "big"] + (["control"] if control else [])
    assert set(json.loads((tmp_path / "compare.json").read_text())) == {name for name, _ in expected}


def test_steps_side_by_side_keep_each_others_results(pt, tmp_path, monkeypatch):
    """--only control records its rows while --only finetune (another process) writes the same file."""
    report = tmp_path / "transfer.json"
    report.write_text(json.dumps({"pretrain_wall_s": 360.0}))

    def finetune(task, model, args, tag):  # the other process records its task meanwhile
        other = json.loads(report.read_text())
        other.setdefault("pretrained", {})[task] = {"metric": "accuracy", "best": 0.9}
        report.write_text(json.dumps(other))
        return {"metric": "accuracy", "best": 0.8}

    monkeypatch.setattr(pt, "finetune", finetune)
    monkeypatch.setattr(sys, "argv", ["pretrain_transfer.py", "--corpus", "c", "--data-dir", "d", "--work",
                                      str(tmp_path), "--only", "control", "--tasks", "sst2"])
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "vocab.txt").write_text("[PAD]\n")
    pt.main()
    final = json.loads(report.read_text())
    assert final["pretrain_wall_s"] == 360.0
    assert final["pretrained"]["sst2"]["best"] == 0.9
    assert final["control"]["sst2"]["best"] == 0.8


def test_a_failed_variant_shows_dashes_and_the_others_their_results(pt, tmp_path, monkeypatch, capsys):
    launched = []
    monkeypatch.setattr(pt.subprocess, "Popen", fake_popen(launched))
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "vocab.txt").write_text("[PAD]\n")
    args = argparse.Namespace(work=tmp_path, corpus=Path("corpus"), data_dir=Path("data"), gpus="0",
                              variants=["broken:lr=1", "recipe:"], budget="6m", tasks="sst2",
                              finetune_set=[], control=False, glue_data=Path("data/glue"))
    pt.compare(args)
    out = capsys.readouterr().out
    assert "broken: exit 1" in out and f"broken: no {tmp_path / 'broken' / 'transfer.json'}" in out
    row = next(line for line in out.splitlines() if line.startswith("SST-2 dev acc"))
    assert row.split()[-2:] == ["-", "50.0"]


def test_glue_runs_the_glue_command_on_both_models_and_prints_the_table(pt, tmp_path, monkeypatch, capsys):
    """--tasks glue: `bert-kit glue` on final/ and on the preset with the run's tokenizer; the table
    puts each task's dev figures beside the control's and BERT-Small's published ones."""
    ran = []

    def command(cmd, log):
        cmd = [str(c) for c in cmd]
        ran.append(cmd)
        out = Path(cmd[cmd.index("--output-dir") + 1])
        out.mkdir(parents=True)
        pretrained = "final" in cmd[cmd.index("--model") + 1]
        cola, sst2 = (31.5, 88.2) if pretrained else (5.0, 80.1)
        (out / "glue_results.json").write_text(json.dumps({
            "score": (cola + sst2) / 2, "score_without_wnli": (cola + sst2) / 2,
            "tasks": {"cola": {"metrics": {"mcc": cola}, "score": cola},
                      "sst2": {"metrics": {"accuracy": sst2}, "score": sst2}}}))
        return 12.0

    monkeypatch.setattr(pt, "command", command)
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "vocab.txt").write_text("[PAD]\n")
    for only in ("finetune", "control"):
        monkeypatch.setattr(sys, "argv", ["pretrain_transfer.py", "--corpus", "c", "--data-dir", "d", "--work",
                                          str(tmp_path), "--only", only, "--tasks", "glue", "--glue-gpus", "0,1"])
        pt.main()
    pretrained, control = ran
    assert pretrained[pretrained.index("--model") + 1] == str(tmp_path / "pretrain" / "final")
    assert control[control.index("--model") + 1] == "bert-small" and f"tokenizer={tmp_path / 'tokenizer'}" in control
    assert all(c[c.index("--data") + 1] == str(Path("d") / "glue") and c[c.index("--gpus") + 1] == "0,1" for c in ran)
    out = capsys.readouterr().out
    assert "| CoLA | MCC | 31.5 | 5.0 | 27.8 |" in out
    assert "| SST-2 | acc | 88.2 | 80.1 | 89.7 |" in out
    assert "| GLUE score | | 59.9 | 42.5 | 71.2 |" in out
