"""Early stopping: `Best` counts the evaluations without improvement, a `Decision` ends the run on
the evaluation that spends the patience; results.json says so, and a resumed run counts on.

The counting is tested here on its own (no model); whole runs in
tests/tasks/test_finetuning_early_stopping.py.
Run: .venv/bin/python -m pytest tests/training/test_early_stopping.py -q -n 0
"""

import json
import math

from bert_kit.training.loop import Decision
from bert_kit.training.results import Best


def scores_until_stop(best: Best, scores: list[float]) -> int | None:
    """The 1-based evaluation after which the patience is spent (None: never)."""
    for i, value in enumerate(scores, start=1):
        best.update(i * 10, {best.metric: value})
        if best.patience_spent:
            return i
    return None


def test_patience_counts_evaluations_without_improvement_and_resets_on_one():
    best = Best("f1", patience=2)
    assert scores_until_stop(best, [0.5, 0.6, 0.6, 0.7, 0.65, 0.69, 0.8]) == 6
    assert (best.value, best.step) == (0.7, 40)  # best/ is the highest, not the last


def test_min_delta_counts_small_steps_from_the_last_real_improvement():
    """0.80, 0.805, 0.809, 0.815 with min_delta 0.01: improvements of best/ each time, but for the
    patience one improvement only, at 0.815 (more than 0.01 above 0.80)."""
    best = Best("f1", patience=3, min_delta=0.01)
    assert scores_until_stop(best, [0.80, 0.805, 0.809, 0.815, 0.816, 0.817, 0.818]) == 7
    assert best.step == 70 and best.value == 0.818  # best/ followed every improvement
    best = Best("f1", patience=3, min_delta=0.01)
    assert scores_until_stop(best, [0.80, 0.805, 0.809, 0.8095]) == 4  # none beat 0.80 by more than 0.01


def test_lower_is_better_metrics_stop_when_the_loss_stops_falling():
    best = Best("loss", higher_is_better=False, patience=2, min_delta=0.05)
    assert scores_until_stop(best, [1.0, 0.8, 0.78, 0.7, 0.68, 0.67, 0.6]) == 6
    assert best.value == 0.67


def test_nan_is_no_improvement_and_no_patience_never_stops():
    best = Best("f1", patience=1)
    assert scores_until_stop(best, [0.5, math.nan]) == 2
    assert scores_until_stop(Best("f1"), [0.5, 0.4, 0.3, 0.2]) is None
    assert not Best(None, patience=1).patience_spent  # a job without a metric never stops early


def test_the_count_survives_a_checkpoint():
    best = Best("f1", patience=3)
    for step, value in enumerate([0.5, 0.7, 0.6, 0.65], start=1):
        best.update(step, {"f1": value})
    again = Best("f1", patience=3)
    again.load_state_dict(json.loads(json.dumps(best.state_dict())))
    assert (again.waited, again.mark, again.value, again.step) == (2, 0.7, 0.7, 2)
    again.update(5, {"f1": 0.69})
    assert again.patience_spent
    older = Best("f1", patience=3)
    older.load_state_dict({"value": 0.7, "step": 2, "metrics": {"f1": 0.7}})  # a checkpoint from before
    assert (older.waited, older.mark) == (0, 0.7)


def test_a_decision_stopping_early_ends_the_run_and_saves_where_the_end_asks():
    d = Decision(ending=False, out_of_time=False, stop=False, evaluate=True, save=False)
    assert d.stopping_early(end_checkpoint=False) == Decision(True, False, False, True, False, True)
    assert d.stopping_early(end_checkpoint=True).save
    assert Decision(False, False, False, True, True).stopping_early(False).save  # a due checkpoint stays
