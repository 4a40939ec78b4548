"""`bert-kit glue`: every task's official file layout read through the fine-tuning readers, the field's
metrics and the GLUE score against hand-computed values, sweeps, the table and JSON, the command
end to end on a tiny model (finished runs kept on a rerun), its one-line errors, the worker
processes, and the real GLUE files' official counts (skipped without the data root).

Run: .venv/bin/python -m pytest tests/tasks/test_glue.py -q
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bert_kit.cli import main
from bert_kit.tasks.glue import (TASKS, build_report, find_tasks, glue_score, malformed_lines, markdown_table,
                                 summarize_task, task_metrics, task_score)
from bert_kit.tasks.glue_runs import changed_inputs, execute, finished, log_path, make_config, plan_runs, run_all
from tests.tasks.glue_files import EXPECTED, write_glue

pytestmark = pytest.mark.usefixtures("one_torch_thread")
QUICK = ["epochs=1", "batch_size=8", "eval_batch_size=8", "precision=fp32", "log_every=1"]


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    return get_tokenizer(minilm_path)


def test_every_task_reads_its_official_layout(tmp_path, minilm_path, tokenizer):
    from bert_kit.tasks import make_task

    root = write_glue(tmp_path / "glue")
    present, missing = find_tasks(root)
    assert list(present) == list(TASKS) and missing == {}
    notes = []
    runs = plan_runs(str(minilm_path), present, tmp_path / "out", ["auto"], [42], notes=notes.append)
    # QQP's pair broken by a line break (lines 4 and 5 of train.tsv) is left out, as GLUE's loaders do
    assert len(notes) == 1 and "QQP" in notes[0] and "left out 2 line(s)" in notes[0] and "lines 4, 5" in notes[0]
    for run in runs:
        name, cfg = run["task"], make_config(run, "cpu")
        task = make_task(cfg.task, cfg)
        task.bind(tokenizer)
        items = task.read_train(cfg.train_file)
        text, pair, label, count = EXPECTED[name]
        assert len(items) == count, name
        assert items[0]["input_ids"] == tokenizer.encode(text, pair), name  # the right columns, in order
        assert items[0]["labels"] == label, name
        if not TASKS[name].regression:  # every train row's label is the class its file names
            assert task.label_names == list(TASKS[name].labels)
        for split, path in run["spec"]["dev"]:  # the dev files map labels to the same ids
            dev = task.read_eval(path)
            assert len(dev) == (9 if split == "mismatched" else 8), (name, split)
    mnli = next(r for r in runs if r["task"] == "mnli")
    assert [split for split, _ in mnli["spec"]["dev"]] == ["matched", "mismatched"]
    cfg = make_config(mnli, "cpu")
    task = make_task(cfg.task, cfg)
    task.bind(tokenizer)
    labels = [it["labels"] for it in task.read_train(cfg.train_file)]
    assert labels == [i % 3 for i in range(12)]  # entailment, neutral, contradiction: ids 0, 1, 2
    qqp = next(r for r in runs if r["task"] == "qqp")
    assert Path(qqp["spec"]["settings"]["train_file"]) == tmp_path / "out" / "qqp" / "data" / "train.tsv"
    assert qqp["spec"]["dev"] == [["dev", str(root / "QQP" / "dev.tsv")]]  # a clean file is read where it is


def test_malformed_lines_are_those_of_another_field_count():
    text = "a\tb\tc\n1\t2\t3\n4\t5\n\n\"\t6\t7\t8\n9\t10\t11\n"
    assert malformed_lines(text) == [3, 5]


def test_metrics_match_scikit_learn_and_scipy():
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    rng = np.random.default_rng(0)
    gold, pred = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    pred[:120] = gold[:120]  # better than chance
    got = task_metrics(TASKS["mrpc"], {"dev": (pred.tolist(), gold.tolist())})
    assert got["f1"] == pytest.approx(100 * f1_score(gold, pred), abs=1e-9)  # F1 of class 1
    assert got["accuracy"] == pytest.approx(100 * accuracy_score(gold, pred), abs=1e-9)
    assert task_metrics(TASKS["cola"], {"dev": (pred, gold)})["mcc"] == pytest.approx(
        100 * matthews_corrcoef(gold, pred), abs=1e-9)
    scores, gold_scores = rng.uniform(0, 5, 100), rng.uniform(0, 5, 100)
    scores[:60] = gold_scores[:60] + rng.normal(0, 0.3, 60)
    scores[10] = scores[11]  # a tie for Spearman's ranks
    got = task_metrics(TASKS["stsb"], {"dev": (scores.tolist(), gold_scores.tolist())})
    assert got["pearson"] == pytest.approx(100 * pearsonr(scores, gold_scores)[0], abs=1e-9)
    assert got["spearman"] == pytest.approx(100 * spearmanr(scores, gold_scores)[0], abs=1e-9)
    got = task_metrics(TASKS["mnli"], {"matched": ([0, 1, 2, 2], [0, 1, 2, 1]), "mismatched": ([0, 0], [0, 1])})
    assert got == {"accuracy_matched": 75.0, "accuracy_mismatched": 50.0}
    assert task_score(TASKS["mnli"], got) == 62.5
    assert task_score(TASKS["mrpc"], {"f1": 80.0, "accuracy": 70.0}) == 75.0


def test_glue_score_is_the_leaderboards():
    # BERT-Small's published test row (Turc et al. 2019): score 71.2 as the leaderboard computes it
    row = {"cola": {"mcc": 27.8}, "sst2": {"accuracy": 89.7}, "mrpc": {"f1": 83.4, "accuracy": 76.2},
           "stsb": {"pearson": 78.8, "spearman": 77.0}, "qqp": {"f1": 68.1, "accuracy": 87.0},
           "mnli": {"accuracy_matched": 77.6, "accuracy_mismatched": 77.0}, "qnli": {"accuracy": 86.4},
           "rte": {"accuracy": 61.8}, "wnli": {"accuracy": 62.3}}
    scores = {name: task_score(TASKS[name], metrics) for name, metrics in row.items()}
    score, names = glue_score(scores)
    assert round(score, 1) == 71.2 and names == list(TASKS)
    # BERT's convention leaves WNLI out: (640.55 - 62.3) / 8
    score, names = glue_score(scores, wnli=False)
    assert score == pytest.approx(578.25 / 8) and "wnli" not in names and len(names) == 8
    assert glue_score({}) == (None, [])


def runs_of(lr_seed_metrics):
    return [{"lr": lr, "seed": seed, "metrics": m, "seconds": 1.0, "train_examples": 10, "dev_examples": 4}
            for lr, seed, m in lr_seed_metrics]


def test_a_sweep_reports_the_best_run_and_the_median_over_seeds():
    mrpc = TASKS["mrpc"]
    runs = runs_of([(1e-4, 1, {"f1": 80, "accuracy": 70}), (1e-4, 2, {"f1": 90, "accuracy": 60}),
                    (1e-4, 3, {"f1": 70, "accuracy": 80}),
                    (5e-5, 1, {"f1": 95, "accuracy": 85}), (5e-5, 2, {"f1": 60, "accuracy": 50}),
                    (5e-5, 3, {"f1": 62, "accuracy": 52})])
    s = summarize_task(mrpc, runs)
    assert (s["lr"], s["seed"], s["score"]) == (5e-5, 1, 90.0)  # the best single run, as papers report
    # medians per metric over the seeds of each lr: 1e-4 -> f1 80, acc 70 (75); 5e-5 -> 62, 52 (57)
    assert s["median"] == {"lr": 1e-4, "seeds": [1, 2, 3], "metrics": {"f1": 80, "accuracy": 70}, "score": 75.0}
    assert s["seconds"] == 6.0 and len(s["runs"]) == 6


def test_report_and_table(tmp_path):
    tasks = {"cola": runs_of([(1e-4, 42, {"mcc": 41.25})]),
             "mnli": runs_of([(1e-4, 42, {"accuracy_matched": 80.0, "accuracy_mismatched": 81.0})]),
             "wnli": runs_of([(1e-4, 42, {"accuracy": 56.34})])}
    tasks["mnli"][0]["dev_examples"] = {"matched": 9815, "mismatched": 9832}
    report = build_report("m", "d", tasks, {"qqp": "no QQP/ folder"}, {"rte": "rte/lr1e-4: bad file"})
    assert report["score"] == pytest.approx((41.25 + 80.5 + 56.34) / 3)
    assert report["score_without_wnli"] == pytest.approx((41.25 + 80.5) / 2)
    assert report["score_tasks"] == ["cola", "mnli", "wnli"] and report["missing"] == {"qqp": "no QQP/ folder"}
    assert json.loads(json.dumps(report)) == report
    lines = markdown_table(report).splitlines()
    assert lines[0] == "| task | metric | dev | score | lr | train | dev examples | seconds |"
    assert lines[2] == "| CoLA | MCC | 41.2 | 41.2 | 0.0001 | 10 | 4 | 1.0 |"
    assert lines[3] == "| MNLI | m/mm acc | 80.0/81.0 | 80.5 | 0.0001 | 10 | 9,815/9,832 | 1.0 |"
    assert lines[6] == ("GLUE score 59.4 over 3 tasks (CoLA, MNLI, WNLI); without WNLI (BERT's convention) "
                        "60.9 over 2")
    assert lines[7:] == ["missing: QQP (no QQP/ folder)", "failed: RTE (rte/lr1e-4: bad file)"]
    tasks["cola"] += runs_of([(1e-4, 7, {"mcc": 30.0})])  # a second seed: the median column
    table = markdown_table(build_report("m", "d", tasks, {}))
    assert "| CoLA | MCC | 41.2 | 35.6 (2 seeds) |" in table and "median over seeds" in table


def test_the_recipe_table_is_documented_and_the_command_starts_without_torch():
    import subprocess
    import sys

    from bert_kit.tasks.glue import recipe_table

    docs = (Path(__file__).resolve().parents[2] / "docs" / "glue.md").read_text()
    assert recipe_table() in docs
    # the command's process plans and schedules; torch is imported where runs train (the workers)
    code = "import sys, bert_kit.cli.glue, bert_kit.tasks.glue_runs; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def glue(capsys, *argv):
    code = main(["glue", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_glue_command_runs_every_task_and_keeps_finished_runs(tmp_path, tiny_encoder, capsys):
    data, out = write_glue(tmp_path / "glue", ("cola", "stsb", "mnli", "wnli"), n=8), tmp_path / "out"
    args = ["--model", tiny_encoder, "--data", data, "--output-dir", out, "--gpus", "cpu", *QUICK]
    code, stdout, err = glue(capsys, *args)
    assert code == 0, err
    report = json.loads((out / "glue_results.json").read_text())
    assert list(report["tasks"]) == ["cola", "stsb", "mnli", "wnli"]
    assert set(report["tasks"]["mnli"]["metrics"]) == {"accuracy_matched", "accuracy_mismatched"}
    assert set(report["tasks"]["stsb"]["metrics"]) == {"pearson", "spearman"}
    assert report["missing"]["sst2"] == "no SST-2/ folder" and set(report["missing"]) == {"sst2", "mrpc", "qqp",
                                                                                          "qnli", "rte"}
    scores = [report["tasks"][n]["score"] for n in ("cola", "stsb", "mnli", "wnli")]
    assert report["score"] == pytest.approx(np.mean(scores))
    assert report["score_without_wnli"] == pytest.approx(np.mean(scores[:3]))
    assert report["tasks"]["mnli"]["dev_examples"] == {"matched": 6, "mismatched": 7}
    assert "| MNLI | m/mm acc |" in stdout and "GLUE score" in stdout and "missing: SST-2 (no SST-2/ folder)" in stdout
    run = out / "mnli" / "lrauto_seed42"
    results = json.loads((run / "results.json").read_text())
    assert results["glue"]["lr"] == 1e-3 and results["glue"]["metrics"] == report["tasks"]["mnli"]["metrics"]
    assert (run / "best" / "config.json").is_file() and not (run / "checkpoints").exists()

    # a rerun keeps every finished run: nothing is fine-tuned again
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/*/results.json")}
    code, stdout, err = glue(capsys, *args)
    assert code == 0 and "fine-tuning on" not in err and err.count("finished earlier, kept") == 4
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*/results.json")} == stamps
    assert json.loads((out / "glue_results.json").read_text())["tasks"] == report["tasks"]

    # other settings are another run: WNLI with 2 epochs runs again, a second seed adds a run
    code, stdout, err = glue(capsys, *args[:-len(QUICK)], "--tasks", "wnli", "--seeds", "42,7", *QUICK, "epochs=2")
    assert code == 0, err
    assert err.count("fine-tuning on") == 2 and "wnli/lrauto_seed7" in err
    steps = json.loads((out / "wnli" / "lrauto_seed42" / "results.json").read_text())["steps"]
    assert steps == 2  # 8 examples, batch 8, 2 epochs
    assert "median" in stdout and "(2 seeds)" in stdout


def test_an_interrupted_run_continues_from_its_checkpoint(tmp_path, tiny_encoder):
    import dataclasses

    from bert_kit.tasks.finetuning import finetune

    data = write_glue(tmp_path / "glue", ("rte",), n=16)
    present, _ = find_tasks(data)
    run = plan_runs(str(tiny_encoder), present, tmp_path / "out", [1e-3], [1], QUICK)[0]
    cfg = make_config(run, "cpu")
    finetune(dataclasses.replace(cfg, max_steps=1, end_checkpoint=True))  # as if stopped after step 1, saved
    assert finished(run) is None
    glue = execute(run, "cpu")
    results = json.loads((Path(run["folder"]) / "results.json").read_text())
    assert results["steps"] == 2 and glue["train_examples"] == 16  # continued to the planned end
    assert [r["step"] for r in map(json.loads, (Path(run["folder"]) / "metrics.jsonl").read_text().splitlines())
            if r["type"] == "start"] == [0, 1]
    assert finished(run) == glue


def test_a_rerun_runs_again_when_its_data_or_model_changed(tmp_path, tiny_encoder, capsys):
    """A rerun said "finished earlier, kept" and reported the old figures after SST-2/train.tsv was
    replaced (16 rows, then 48), or another model was put at the same --model path."""
    import shutil

    import torch

    from bert_kit.model import BERTModel
    from tests.tasks.conftest import TINY

    data, out, model = write_glue(tmp_path / "glue", ("sst2",), n=16), tmp_path / "out", tmp_path / "model"
    shutil.copytree(tiny_encoder, model)
    args = ["--model", model, "--data", data, "--output-dir", out, "--gpus", "cpu", *QUICK]
    results = out / "sst2" / "lrauto_seed42" / "results.json"
    code, _, err = glue(capsys, *args)
    assert code == 0 and json.loads(results.read_text())["num_train_examples"] == 16, err
    train = data / "SST-2" / "train.tsv"
    train.touch()  # touched, not changed: kept
    code, _, err = glue(capsys, *args)
    assert code == 0 and "finished earlier, kept" in err and "fine-tuning on" not in err

    write_glue(tmp_path / "glue", ("sst2",), n=48)  # a new train.tsv
    code, _, err = glue(capsys, *args)
    said = [line for line in err.splitlines() if "changed since it finished: running it again" in line]
    assert code == 0 and len(said) == 1 and said[0].startswith("glue: sst2/lrauto_seed42: ") and str(train) in said[0]
    assert "finished earlier, kept" not in err and json.loads(results.read_text())["num_train_examples"] == 48
    figures = json.loads((out / "glue_results.json").read_text())["tasks"]["sst2"]

    torch.manual_seed(1)  # another model at the same path
    BERTModel(TINY).save_pretrained(model)
    code, _, err = glue(capsys, *args)
    assert code == 0 and f"{model / 'model.safetensors'} changed since it finished: running it again" in err, err
    weights = str(model / "model.safetensors")
    digest = __import__("hashlib").sha256((model / "model.safetensors").read_bytes()).hexdigest()
    assert json.loads(results.read_text())["glue"]["inputs"][weights]["sha256"] == digest
    # the summary comes from the new run (figures of a tiny model may repeat: the fingerprint cannot)
    [summarized] = json.loads((out / "glue_results.json").read_text())["tasks"]["sst2"]["runs"]
    assert summarized["inputs"][weights]["sha256"] == digest != figures["runs"][0]["inputs"][weights]["sha256"]
    code, _, err = glue(capsys, *args)
    assert code == 0 and "finished earlier, kept" in err  # and now it is kept again


def test_a_run_of_an_earlier_version_is_kept_unless_a_file_is_newer_than_its_results(tmp_path, tiny_encoder):
    """results.json written before fingerprints were recorded: kept while its inputs are older."""
    import os

    data = write_glue(tmp_path / "glue", ("rte",), n=8)
    present, _ = find_tasks(data)
    run = plan_runs(str(tiny_encoder), present, tmp_path / "out", [1e-3], [1], QUICK)[0]
    results = Path(run["folder"]) / "results.json"
    results.parent.mkdir(parents=True)
    results.write_text(json.dumps({"glue": {"spec": run["spec"], "metrics": {"accuracy": 50.0}}}))
    assert finished(run) is not None
    train = data / "RTE" / "train.tsv"
    os.utime(train, ns=(results.stat().st_mtime_ns + 10**9,) * 2)  # changed after the results were written
    run = plan_runs(str(tiny_encoder), present, tmp_path / "out", [1e-3], [1], QUICK)[0]
    assert finished(run) is None and changed_inputs(run, json.loads(results.read_text())["glue"]) == [str(train)]


def test_an_interrupted_run_whose_data_changed_starts_over(tmp_path, tiny_encoder):
    import dataclasses

    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.glue_runs import inputs_path

    data = write_glue(tmp_path / "glue", ("rte",), n=16)
    present, _ = find_tasks(data)
    run = plan_runs(str(tiny_encoder), present, tmp_path / "out", [1e-3], [1], QUICK)[0]
    (Path(run["folder"]).parent).mkdir(parents=True)
    inputs_path(run).write_text(json.dumps(run["inputs"]))  # as execute records it when it starts
    finetune(dataclasses.replace(make_config(run, "cpu"), max_steps=1, end_checkpoint=True))  # stopped after step 1
    write_glue(tmp_path / "glue", ("rte",), n=24)  # then the data changed
    run = plan_runs(str(tiny_encoder), present, tmp_path / "out", [1e-3], [1], QUICK)[0]
    execute(run, "cpu")
    starts = [r["step"] for r in map(json.loads, (Path(run["folder"]) / "metrics.jsonl").read_text().splitlines())
              if r["type"] == "start"]
    assert starts == [0] and json.loads((Path(run["folder"]) / "results.json").read_text())["num_train_examples"] == 24
    assert not inputs_path(run).exists() and finished(run) is not None


def test_runs_that_an_interruption_kept_from_starting_are_not_run_not_failed(tmp_path, tiny_encoder, capsys,
                                                                             monkeypatch):
    """Ctrl-C on a CPU reported the task it kept from starting as "RuntimeError: not run: every
    worker process had ended ... please report it"."""
    import bert_kit.cli.glue as glue_cli

    def stopped_at_once(run: dict, device: str) -> dict:
        return {"stopped": "SIGINT"}  # what a run stopped by Ctrl-C returns

    real = glue_cli.run_all
    monkeypatch.setattr(glue_cli, "run_all", lambda runs, gpus, on_event: real(runs, gpus, on_event,
                                                                               execute=stopped_at_once))
    data = write_glue(tmp_path / "glue", ("cola", "wnli"), n=8)
    code, _, err = glue(capsys, "--model", tiny_encoder, "--data", data, "--output-dir", tmp_path / "out", "--gpus",
                        "cpu", *QUICK)
    assert code == 130 and "Traceback" not in err and "error:" not in err and "report it" not in err, err
    stopped = [run for run in ("cola/lrauto_seed42", "wnli/lrauto_seed42") if f"{run}: stopped by SIGINT" in err]
    waiting = ({"cola/lrauto_seed42", "wnli/lrauto_seed42"} - set(stopped)).pop()
    assert len(stopped) == 1 and f"not run, the command was interrupted (SIGINT): {waiting}; run the same " \
                                 "command again to run them" in err


def error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("bert-kit glue: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_errors_are_one_line(tmp_path, tiny_encoder, capsys):
    data = write_glue(tmp_path / "glue", ("cola",), n=8)
    base = ["--model", tiny_encoder, "--output-dir", tmp_path / "out", "--gpus", "cpu"]
    cases = [
        (["--data", tmp_path / "nowhere"], "--data", "folder not found"),
        (["--data", tmp_path], "no GLUE task files under", "CoLA/ and SST-2/"),
        (["--data", data, "--tasks", "cola,sts"], "unknown GLUE task 'sts'", "did you mean 'stsb'?"),
        (["--data", data, "--tasks", "mnli"], "--tasks mnli: no MNLI/ folder under", "docs/glue.md"),
        (["--data", data, "--tasks", ""], "--tasks is empty: give one or more GLUE tasks (cola,sst2,mrpc,", ""),
        (["--data", data, "--tasks", ","], "--tasks is empty: give one or more GLUE tasks (cola,sst2,mrpc,", ""),
        (["--data", data, "lr=1e-4"], "lr= is set by --lrs", ""),
        (["--data", data, "similarity.mode=bi-encoder"], "similarity.mode= is set by the task table", ""),
        (["--data", data, "score_range=[1, 2]"], "score_range= is set by the task table", ""),  # its old name
        (["--data", data, "--lrs", "1e-4,fast"], "--lrs 1e-4,fast: 'fast' is not a learning rate", ""),
        (["--data", data, "--gpus", "99"], "--gpus 99: there is", ""),
        (["--data", data, "--seeds", "1,x"], "'x' is not a seed", ""),
        # every run's settings are checked before the first starts: one error, no run folder
        (["--data", data, "epoch=1"], "cola/lrauto_seed42: ", "unknown key 'epoch' (did you mean epochs?)"),
        (["--data", data, "epochs=-1"], "cola/lrauto_seed42: epochs=-1.0 is out of range", "> 0"),
        (["--data", data, "precision=bf17"], "cola/lrauto_seed42: precision='bf17'", "did you mean 'bf16'?"),
    ]
    for extra, *needles in cases:
        argv = base + extra
        if "--gpus" in extra:
            argv = argv[:argv.index("--gpus")] + argv[argv.index("--gpus") + 2:]
        code, _, err = glue(capsys, *argv)
        line = error_line(err)
        assert code == 2 and all(n in line for n in needles), (extra, err)
        assert "fine-tuning on" not in err and not (tmp_path / "out" / "cola").exists(), (extra, err)
    code, _, err = glue(capsys, "--model", tmp_path / "no_model", "--data", data, "--gpus", "cpu")
    assert code == 2 and "no_model" in error_line(err)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")  # an output folder holds only glue's files
    code, _, err = glue(capsys, "--model", tiny_encoder, "--data", data, "--gpus", "cpu",
                        "--output-dir", tmp_path / "mine")
    assert code == 2 and "holds files that no earlier bert-kit glue wrote there (notes.txt)" in error_line(err)


def test_worker_processes_share_the_runs_and_report_failures(tmp_path):
    from tests.tasks.glue_workers import fake_execute

    runs = [{"id": f"{task}/{i}", "task": task, "folder": str(tmp_path / task / str(i))}
            for i, task in enumerate(["ok", "dies", "ok", "fails", "ok", "ok"])]
    events = []
    outcomes = run_all(runs, ["g0", "g1"], lambda kind, run, where, outcome: events.append((kind, run["id"], where)),
                       execute=fake_execute)
    assert set(outcomes) == {r["id"] for r in runs}
    done = {k: v["glue"] for k, v in outcomes.items() if "glue" in v}
    assert set(done) == {"ok/0", "ok/2", "ok/4", "ok/5"}
    assert {g["gpu"] for g in done.values()} <= {"g0", "g1"} and all(g["device"] == "cuda" for g in done.values())
    error = outcomes["fails/3"]["error"]
    assert isinstance(error, ValueError) and "a bad data file" in str(error)
    assert "ended (exit code 3)" in str(outcomes["dies/1"]["error"])
    assert sum(kind == "done" for kind, _, _ in events) == len(runs)
    # with several GPUs a run's output goes to its log beside its folder
    assert (tmp_path / "ok" / "0.log").read_text().startswith("running ok/0 on cuda")
    assert os.getpid() not in {g["pid"] for g in done.values()}


def test_a_gpu_given_twice_runs_two_worker_processes(tmp_path):
    """--gpus 0,0: the runs of a small model share one GPU in two processes; one dying leaves the
    other to run the rest."""
    from tests.tasks.glue_workers import fake_execute

    runs = [{"id": f"{task}/{i}", "task": task, "folder": str(tmp_path / task / str(i))}
            for i, task in enumerate(["dies", "ok", "ok", "ok"])]
    events = []
    outcomes = run_all(runs, ["g0", "g0"], lambda kind, run, where, outcome: events.append((kind, run["id"], where)),
                       execute=fake_execute)
    assert "ended (exit code 3)" in str(outcomes["dies/0"]["error"])
    done = [outcomes[f"ok/{i}"]["glue"] for i in (1, 2, 3)]  # all three, by the worker that lived
    assert {g["gpu"] for g in done} == {"g0"} and len({g["pid"] for g in done}) == 1
    assert {where for _, _, where in events} == {"GPU g0"}


def test_gpus_given_twice_are_kept_twice(monkeypatch):
    from bert_kit.cli.glue import choose_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert choose_gpus("1,1,0") == ["5", "5", "3"]  # one worker process per entry
    assert choose_gpus(None) == ["3", "5"]


def test_every_run_of_a_sweep_has_its_own_log(tmp_path):
    """lr0.0003_seed42 and lr0.0001_seed42 are two logs (a dot in the lr is no suffix to replace)."""
    folders = [tmp_path / "sst2" / f"lr{lr:g}_seed42" for lr in (3e-4, 1e-4, 5e-5)]
    logs = [log_path({"folder": str(f)}) for f in folders]
    assert [p.name for p in logs] == ["lr0.0003_seed42.log", "lr0.0001_seed42.log", "lr5e-05_seed42.log"]
    assert all(p.parent == tmp_path / "sst2" for p in logs)


def test_real_glue_files_have_the_official_counts(data_dir):
    from bert_kit.data.classification import read_classification_file
    from bert_kit.data.sts import read_pair_file

    root = data_dir / "glue"
    if not root.is_dir():
        pytest.skip(f"no GLUE folder at {root}")
    present, missing = find_tasks(root)
    assert {"cola", "sst2", "mrpc", "stsb", "rte", "wnli"} <= set(present)
    assert missing.get("qnli") == "QNLI/ has no train.tsv"
    # (examples, label counts by id) of train and dev, as the readers of a run read them
    official = {"cola": ((8551, [2528, 6023]), (1043, [322, 721])),
                "sst2": ((67349, [29780, 37569]), (872, [428, 444])),
                "mrpc": ((3668, [1194, 2474]), (408, [129, 279])), "stsb": ((5749, None), (1500, None)),
                "rte": ((2490, [1249, 1241]), (277, [146, 131])), "wnli": ((635, [323, 312]), (71, [40, 31])),
                "qnli": (None, (5463, [2702, 2761]))}
    for name, counts in official.items():
        task = TASKS[name]
        for split, expected in zip(("train", "dev"), counts):
            if expected is None:
                continue
            path = root / task.title / f"{split}.tsv"
            if task.regression:
                s1, _, scores = read_pair_file(path, task.text, task.pair, task.label, (0.0, 5.0), header=True)
                assert len(s1) == expected[0] and 0 <= min(scores) and max(scores) <= 5, (name, split)
                continue
            data = read_classification_file(path, task.text, task.label, task.pair, header=task.header,
                                            label_names=task.labels)
            assert len(data.texts) == expected[0], (name, split)
            assert np.bincount(data.labels).tolist() == expected[1], (name, split)
    first = read_classification_file(root / "MRPC" / "train.tsv", "#1 String", "Quality", "#2 String")
    assert first.texts[0].startswith("Amrozi accused his brother") and first.labels[0] == 1  # the BOM is no column


def test_a_run_finished_by_an_earlier_version_is_kept(tmp_path, tiny_encoder):
    """Its results.json holds the settings as they were written then (flat keys): the same run."""
    data = write_glue(tmp_path / "glue", ("stsb",), n=8)
    present, _ = find_tasks(data)
    run = plan_runs(str(tiny_encoder), present, tmp_path / "out", [1e-3], [1], QUICK)[0]
    settings = dict(run["spec"]["settings"])
    assert settings.pop("similarity") == {"mode": "cross-encoder", "score_range": [0.0, 5.0]}
    old_spec = {**run["spec"], "settings": {**settings, "similarity_mode": "cross-encoder", "score_range": [0.0, 5.0]}}
    glue = {"spec": old_spec, "metrics": {"pearson": 80.0, "spearman": 79.0}}
    Path(run["folder"]).mkdir(parents=True)
    (Path(run["folder"]) / "results.json").write_text(json.dumps({"glue": glue}))
    assert finished(run) == glue
    other = {**old_spec, "settings": {**old_spec["settings"], "score_range": [1.0, 5.0]}}
    (Path(run["folder"]) / "results.json").write_text(json.dumps({"glue": {**glue, "spec": other}}))
    assert finished(run) is None
