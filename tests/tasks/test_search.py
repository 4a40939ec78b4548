"""bert-kit tune: ranges read from a config's search: block, trials as normal runs in a study
folder that resumes, pruning through the loop's trackers, Ctrl-C that the next command resumes.

Run: .venv/bin/python -m pytest tests/tasks/test_search.py -q -n 0
"""

import json
import signal

import pytest

from bert_kit.checks import ConfigError
from tests.tiny_runs import tiny_settings, tiny_setup

optuna = pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_setup(tmp_path_factory.mktemp("tiny"))


def write_config(tmp_path, tiny, search: str, **overrides):
    settings = tiny_settings(tiny, tmp_path / "study", max_steps=6, eval_every=3, **overrides)
    lines = [f"{k}: {json.dumps(v)}" for k, v in settings.items()]
    path = tmp_path / "tune.yaml"
    path.write_text("\n".join(lines) + "\nsearch:\n" + search)
    return path


def test_ranges_and_their_errors():
    from bert_kit.tasks.search import Range, parse_range

    assert parse_range("lr", "loguniform(1e-5, 3e-4)", "f") == Range("loguniform", 1e-5, 3e-4)
    assert parse_range("epochs", "int(1, 4)", "f").extremes() == [1, 4]
    assert parse_range("batch_size", [16, 32], "f").choices == (16, 32)
    dist = parse_range("warmup_fraction", "uniform(0, 0.2)", "f").distribution()
    assert (dist.low, dist.high, dist.log) == (0.0, 0.2, False)
    for bad, said in (("loguniform(0, 1)", "must be positive"), ("uniform(2, 1)", "low < high"),
                      ("normal(0, 1)", "is not a range"), ("int(1.5, 4)", "takes integers"), ([], "non-empty")):
        with pytest.raises(ConfigError, match=rf"f: search.x.*{said}"):
            parse_range("x", bad, "f")


def test_a_range_that_leaves_the_settings_or_a_missing_validation_file_fail_before_any_trial(tiny, tmp_path):
    from bert_kit.tasks.search import read_search

    with pytest.raises(ConfigError, match=r"search.warmup_fraction reaches 1.5.*warmup_fraction=1.5 is out of range"):
        read_search(write_config(tmp_path, tiny, "  warmup_fraction: uniform(0, 1.5)\n"), [])
    with pytest.raises(ConfigError, match=r"search.lr_rate reaches.*unknown key 'lr_rate'"):
        read_search(write_config(tmp_path, tiny, "  lr_rate: [0.1, 0.2]\n"), [])
    with pytest.raises(ConfigError, match="a search needs validation_file"):
        read_search(write_config(tmp_path, tiny, "  lr: [0.1, 0.2]\n", validation_file=None), [])
    path = write_config(tmp_path, tiny, "  lr: [0.1]\n")
    path.write_text(path.read_text().split("search:")[0])
    with pytest.raises(ConfigError, match="no search: block"):
        read_search(path, [])


def test_a_pruned_trial_ends_its_run_after_the_evaluation_and_says_so(tiny, tmp_path):
    """The trial's tracker reports each evaluation; behind the median of earlier trials, the loop
    ends the run there and results.json records why."""
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from bert_kit.tasks.search import TrialReporter

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    earlier = study.ask()
    for step in (3, 6, 9, 12):
        earlier.report(2.0, step)  # better than any accuracy
    study.tell(earlier, 2.0)
    trial = study.ask()
    reporter = TrialReporter(trial)
    results = finetune(FinetuneConfig(**tiny_settings(tiny, tmp_path / "run", eval_every=3)), trackers=[reporter])
    assert reporter.pruned_at == 3 and results["steps"] == 3 and results["stopped"] is None
    assert results["stop_reason"].startswith("pruned by the search (accuracy ")
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["stop_reason"] == results["stop_reason"] and saved["final_metrics"] is None
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {3: results["best_value"]}


@pytest.mark.slow
def test_tune_runs_trials_in_a_study_folder_that_resumes(tiny, tmp_path, capsys):
    from bert_kit.cli import main
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from bert_kit.training.runconfig import load_config

    config = write_config(tmp_path, tiny, "  lr: loguniform(1e-4, 3e-3)\n  batch_size: [8, 16]\n")
    assert main(["tune", "--config", str(config), "--trials", "2", "--pruner", "none"]) == 0
    study_dir = tmp_path / "study"
    out = capsys.readouterr().out  # the trials' lines, then the summary
    out = json.loads(out[out.rindex("\n{\n") + 1:])
    assert sorted(p.name for p in study_dir.glob("trial-*")) == ["trial-0000", "trial-0001"]
    runs = [json.loads((study_dir / f"trial-000{i}" / "results.json").read_text()) for i in range(2)]
    best = max(range(2), key=lambda i: runs[i]["best_value"])
    assert out["best"]["trial"] == best and out["best"]["value"] == runs[best]["best_value"]
    cfg = load_config(FinetuneConfig, study_dir / "best.yaml")  # ready to run
    settings = load_config(FinetuneConfig, study_dir / f"trial-000{best}" / "run_config.yaml")
    assert (cfg.lr, cfg.batch_size) == (settings.lr, settings.batch_size)
    assert cfg.output_dir == str(study_dir / "best")
    assert (study_dir / "optimization_history.png").stat().st_size > 5000
    table = (study_dir / "trials.tsv").read_text().splitlines()
    assert table[0].split("\t") == ["trial", "state", "value", "lr", "batch_size", "steps", "run_folder"]
    assert [row.split("\t")[1] for row in table[1:]] == ["COMPLETE", "COMPLETE"]

    assert main(["tune", "--config", str(config), "--trials", "3", "--pruner", "none"]) == 0  # one more
    assert sorted(p.name for p in study_dir.glob("trial-*")) == ["trial-0000", "trial-0001", "trial-0002"]
    assert len(optuna.load_study(study_name="bert-kit", storage=f"sqlite:///{study_dir / 'study.db'}").trials) == 3
    # continued with settings that change what the trials train: refused, as best.yaml would not be the best trial's
    capsys.readouterr()
    assert main(["tune", "--config", str(config), "--trials", "3", "max_steps=4"]) == 2
    assert "study.db: the study's trials ran with other settings (max_steps: 6 -> 4): restore them" in (
        capsys.readouterr().err)
    assert main(["tune", "--config", str(config), "--trials", "3", "lr=1e-3", "device=cpu", "log_every=1"]) == 0


def test_a_study_whose_first_trial_failed_on_its_settings_continues_with_fixed_ones(tiny, tmp_path, capsys):
    from bert_kit.cli import main

    config = write_config(tmp_path, tiny, "  lr: loguniform(1e-4, 3e-3)\n")
    assert main(["tune", "--config", str(config), "--trials", "1", "metric=f1_zzz"]) == 2  # no such label
    assert "metric='f1_zzz' is not a validation metric" in capsys.readouterr().err
    study = optuna.load_study(study_name="bert-kit", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL"] and not study.trials[0].user_attrs.get("interrupted")
    assert "ConfigError: metric='f1_zzz'" in study.trials[0].user_attrs["error"]
    assert main(["tune", "--config", str(config), "--trials", "1", "metric=f1"]) == 0
    assert "resumed" not in capsys.readouterr().err  # the failed trial is not run again


@pytest.mark.slow
def test_ctrl_c_stops_the_trial_with_a_checkpoint_and_the_next_tune_resumes_it(tiny, tmp_path, monkeypatch,
                                                                                capsys):
    from bert_kit.cli import main
    from bert_kit.tasks.classification import ClassificationTask

    original, calls = ClassificationTask.loss, []

    def loss_then_signal(self, model, batch):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C during step 2 of the first trial
        return original(self, model, batch)

    monkeypatch.setattr(ClassificationTask, "loss", loss_then_signal)
    config = write_config(tmp_path, tiny, "  lr: loguniform(1e-4, 3e-3)\n")
    assert main(["tune", "--config", str(config), "--trials", "2"]) == 130
    trial = tmp_path / "study" / "trial-0000"
    assert json.loads((trial / "results.json").read_text())["stopped"] == "SIGINT"
    assert "INTERRUPTED" in (tmp_path / "study" / "trials.tsv").read_text()
    capsys.readouterr()

    assert main(["tune", "--config", str(config), "--trials", "2"]) == 0
    err = capsys.readouterr().err
    assert "trial 1 (trial-0000, resumed)" in err and "trial 2 (trial-0002)" in err
    resumed = json.loads((trial / "results.json").read_text())
    assert resumed["stopped"] is None and resumed["steps"] == 6
    study = optuna.load_study(study_name="bert-kit", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert study.trials[1].params == study.trials[0].params


def test_the_trials_of_a_study_share_its_mlflow_store_and_experiment(tiny, tmp_path):
    from bert_kit.tasks.search import read_search, trial_settings

    spec, base = read_search(write_config(tmp_path, tiny, "  lr: [0.1, 0.2]\n", report_to=["mlflow"]), [])
    cfg = spec.config({"lr": 0.2}, **trial_settings(base, tmp_path / "study", "trial-0002"))
    assert cfg.tracking.mlflow_uri == f"sqlite:///{(tmp_path / 'study' / 'mlflow.db').resolve()}"
    assert (cfg.tracking.project, cfg.tracking.run_name, cfg.lr) == ("study", "trial-0002", 0.2)
    assert cfg.output_dir == str(tmp_path / "study" / "trial-0002")
