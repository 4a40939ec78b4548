"""Early stopping in whole fine-tuning runs: the stop step, results.json, resuming, a time budget.

The runs are tiny fine-tunes whose evaluations return a scripted list of scores, so the step the
run stops at is known in advance (the counting itself: tests/training/test_early_stopping.py).
Run: .venv/bin/python -m pytest tests/tasks/test_finetuning_early_stopping.py -q -n 0
"""

import json

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

@pytest.fixture()
def scripted(monkeypatch):
    """Make every evaluation of a fine-tune return the next of `scores` (accuracy), and record the steps."""
    from bert_kit.tasks.finetuning import FinetuningJob

    state = {"scores": [], "steps": []}

    def evaluate(self, final):
        state["steps"].append(final)
        return {"accuracy": state["scores"].pop(0)}

    monkeypatch.setattr(FinetuningJob, "evaluate", evaluate)
    return state


@pytest.fixture()
def sst2_slice(data_dir, tmp_path):
    lines = (data_dir / "sst2" / "train.tsv").read_text().splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:33]) + "\n")
    return tmp_path / "train.tsv"


def run_config(tiny_encoder, tmp_path, train, **kw):
    from bert_kit.tasks.finetuning import FinetuneConfig

    settings = dict(model=str(tiny_encoder), output_dir=str(tmp_path / "run"), batch_size=8, lr=1e-3,
                    precision="fp32", device="cpu", seed=3, train_file=str(train), validation_file=str(train),
                    max_steps=20, eval_every=2, log_every=1)
    return FinetuneConfig(**{**settings, **kw})


def test_a_run_stops_on_the_evaluation_that_spends_the_patience(tiny_encoder, sst2_slice, tmp_path, scripted):
    scripted["scores"] = [0.5, 0.7, 0.6, 0.65, 0.7, 0.9, 0.9]
    from bert_kit.tasks.finetuning import finetune

    results = finetune(run_config(tiny_encoder, tmp_path, sst2_slice, early_stopping_patience=3))
    # evaluations at steps 2, 4, ..., 10: the 3rd, 4th and 5th do not beat 0.7: the run ends at step 10,
    # and that evaluation is its last (no final evaluation of the same weights)
    assert results["steps"] == 10 and scripted["steps"] == [False] * 5
    assert results["stopped"] == "early_stopping"
    assert results["early_stopping"] == {"step": 10, "patience": 3, "min_delta": 0.0,
                                         "evaluations_without_improvement": 3}
    assert (results["best_step"], results["best_value"]) == (4, 0.7)
    assert results["final_metrics"] == {"accuracy": 0.7}
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["stopped"] == "early_stopping" and (tmp_path / "run" / "best").is_dir()


def test_the_command_exits_0_when_early_stopping_ends_the_run(tiny_encoder, sst2_slice, tmp_path, scripted):
    """Early stopping ends a run as its last step does (a signal's stop exits 130/143)."""
    from bert_kit.cli import main as cli_main

    scripted["scores"] = [0.5, 0.4]
    cfg = run_config(tiny_encoder, tmp_path, sst2_slice)
    settings = [f"{k}={getattr(cfg, k)}" for k in ("model", "output_dir", "train_file", "validation_file", "max_steps",
                                                    "eval_every", "batch_size", "device", "precision")]
    assert cli_main(["finetune", *settings, "early_stopping_patience=1", "--output", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["stopped"] == "early_stopping"


def test_an_interrupted_run_resumes_with_its_count(tiny_encoder, sst2_slice, tmp_path, scripted):
    """Checkpoints at every evaluation; the run resumed from step 6 (one evaluation without
    improvement counted by then) stops at step 10, as the uncut run would (0.5, 0.7, 0.6, 0.6, 0.6)."""
    from bert_kit.tasks.finetuning import finetune

    def config(**kw):
        return run_config(tiny_encoder, tmp_path, sst2_slice, save_every=2, keep_last=0, **kw)

    scripted["scores"] = [0.5, 0.7, 0.6, 0.65]  # steps 2, 4, 6 and the final evaluation at 8
    assert finetune(config(early_stopping_patience=3, max_steps=8))["stopped"] is None
    scripted["scores"], scripted["steps"] = [0.6, 0.6], []
    resumed = finetune(config(early_stopping_patience=3), resume=str(tmp_path / "run" / "checkpoints" /
                                                                     "step-0000006"))
    assert resumed["steps"] == 10 and resumed["stopped"] == "early_stopping" and resumed["best_step"] == 4
    assert scripted["steps"] == [False, False]
    # resumed again with the patience it spent: nothing to train, nothing evaluated
    again = finetune(config(early_stopping_patience=3), resume="latest")
    assert again["steps"] == 10 and again["stopped"] == "early_stopping" and scripted["steps"] == [False, False]
    # a larger patience trains on, counting from the 3 evaluations without improvement
    scripted["scores"] = [0.95]
    longer = finetune(config(early_stopping_patience=5, max_steps=12), resume="latest")
    assert longer["steps"] == 12 and longer["stopped"] is None and longer["best_step"] == 12


def test_early_stopping_within_a_time_budget(tiny_encoder, sst2_slice, tmp_path, scripted):
    """With a time budget the run has no step count to reach; early stopping still ends it."""
    from bert_kit.tasks.finetuning import finetune

    scripted["scores"] = [0.5, 0.4, 0.3]
    results = finetune(run_config(tiny_encoder, tmp_path, sst2_slice, early_stopping_patience=2, max_steps=None,
                                  epochs=1000, time_budget="10m"))
    assert results["stopped"] == "early_stopping" and results["steps"] == 6 and results["best_step"] == 2


def test_early_stopping_needs_a_validation_set(tiny_encoder, sst2_slice, tmp_path):
    from bert_kit.tasks.finetuning import finetune

    cfg = run_config(tiny_encoder, tmp_path, sst2_slice, early_stopping_patience=2, validation_file=None)
    with pytest.raises(ValueError, match="early_stopping_patience counts evaluations"):
        finetune(cfg)


def test_a_patience_the_runs_evaluations_cannot_spend_is_warned_of(tiny_encoder, sst2_slice, tmp_path, scripted,
                                                                    capsys):
    from bert_kit.tasks.finetuning import finetune

    scripted["scores"] = [0.5, 0.5]
    results = finetune(run_config(tiny_encoder, tmp_path, sst2_slice, early_stopping_patience=2, max_steps=4))
    assert results["steps"] == 4 and results["stopped"] is None
    assert ("warning: early_stopping_patience=2 needs 3 evaluations or more to stop a run early, and this one has 2 "
            "(4 steps, an evaluation every 2): set eval_every lower") in capsys.readouterr().err
    scripted["scores"] = [0.5, 0.5, 0.5]
    finetune(run_config(tiny_encoder, tmp_path / "b", sst2_slice, early_stopping_patience=2, max_steps=6))
    assert "early_stopping_patience" not in capsys.readouterr().err


def test_metric_for_best_is_metric_under_another_name(tmp_path):
    """One setting picks best/ and what early stopping watches: `metric`; `metric_for_best` (and
    HF's `metric_for_best_model`) set it, silently; both set to different values is an error."""
    from bert_kit.checks import ConfigError
    from bert_kit.tasks.finetuning_config import FinetuneConfig
    from bert_kit.training.runconfig import load_config

    (tmp_path / "run.yaml").write_text("metric_for_best: mcc\nearly_stopping_patience: 2\n")
    assert load_config(FinetuneConfig, tmp_path / "run.yaml").metric == "mcc"
    assert load_config(FinetuneConfig, None, ["metric_for_best_model=f1_joy"]).metric == "f1_joy"
    assert FinetuneConfig(metric_for_best="loss").metric == "loss"
    assert load_config(FinetuneConfig, tmp_path / "run.yaml", ["metric=f1"]).metric == "f1"  # an override wins
    (tmp_path / "both.yaml").write_text("metric_for_best: mcc\nmetric: f1\n")
    with pytest.raises(ConfigError, match="are the same setting: keep metric"):
        load_config(FinetuneConfig, tmp_path / "both.yaml")
    # two names of it on one command line: refused too (the last one won); one name twice: the last
    with pytest.raises(ConfigError, match="'metric_for_best=f1' and 'metric=mcc' set the same setting 'metric'"):
        load_config(FinetuneConfig, None, ["metric_for_best=f1", "metric=mcc"])
    assert load_config(FinetuneConfig, None, ["metric_for_best=f1", "metric=f1"]).metric == "f1"
    assert load_config(FinetuneConfig, None, ["metric=f1", "metric=mcc"]).metric == "mcc"
    with pytest.raises(ConfigError, match="metric='f1_joy' is not a validation metric.*f1_LABEL"):
        FinetuneConfig(metric="f1_joy", label_names=["anger", "sadness"])


def test_another_tasks_settings_are_named_as_unread(capsys):
    """`qa: {doc_stride: 64}` in a classification run was taken without a word; a refusal would
    break one set of overrides serving a glue sweep's tasks, so it is a note naming each key, as
    the run starts (not where configs are built for inference, which set every group)."""
    from bert_kit.tasks.finetuning_config import FinetuneConfig, note_unread_settings

    cfg = FinetuneConfig(task="classification", qa={"doc_stride": 64}, similarity={"mode": "bi-encoder"})
    assert capsys.readouterr().err == ""
    note_unread_settings(cfg)
    assert capsys.readouterr().err == ("note: task classification does not read qa.doc_stride=64, "
                                       "similarity.mode='bi-encoder' (settings of task qa / similarity)\n")
    note_unread_settings(FinetuneConfig(task="qa", qa={"doc_stride": 64}, classification={"long_text": "truncate"}))
    note_unread_settings(FinetuneConfig(task="token-classification", ner={"tag_column": 2}))
    assert capsys.readouterr().err == ""  # their own groups, and another's at its defaults: quiet


def test_a_run_names_another_tasks_settings_as_it_starts(tiny_encoder, tmp_path, capsys):
    """The note comes from `finetune` itself (the command line and Python alike)."""
    from bert_kit.tasks.finetuning import finetune
    from bert_kit.tasks.finetuning_config import FinetuneConfig

    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"text {i}\t{i % 2}\n" for i in range(8)))
    cfg = FinetuneConfig(task="classification", model=str(tiny_encoder), train_file=str(tmp_path / "train.tsv"),
                         output_dir=str(tmp_path / "run"), max_steps=1, batch_size=4, device="cpu",
                         qa={"max_answer_length": 40})
    assert finetune(cfg)["num_train_examples"] == 8
    assert capsys.readouterr().err.count("note: task classification does not read qa.max_answer_length=40 ") == 1
