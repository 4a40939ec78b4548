"""What a run keeps and reports: the best evaluation so far (best/), and results.json.

`results.json` describes the whole run, after any number of resumes: its figures are computed from
the run's own metrics.jsonl records (first loss, units trained, time, throughput, final loss). When
records were lost (metrics.jsonl deleted or cut), resuming says so and results.json says which
steps its figures cover (`metrics_steps`, `metrics_complete`). It names the model folder the run
keeps (`best_model` or `final_model`) as it is on disk once every background write has ended
(`model_entries`): the one place that looks for it.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bert_kit.outputs import write_text
from bert_kit.training.progress import METRICS_FILE, read_metrics

RESULTS_FILE = "results.json"
EARLY_STOPPING = "early_stopping"  # results.json's "stopped" of a run early stopping ended (else a signal's name)


@dataclass
class Best:
    """The best validation so far of the job's `metric` (the highest, or the lowest where
    `higher_is_better` is False: a loss), and the step whose weights best/ holds; and early stopping's
    count (`patience`): the evaluations since the metric last beat `mark`, the value it had then,
    by more than `min_delta`. Saved with every checkpoint, so a resumed run counts on.

    best/ follows every improvement; the patience only those past `min_delta` (as Keras's
    EarlyStopping): 0.80, 0.805, 0.809, 0.815 with min_delta 0.01 is one improvement, at 0.815."""

    metric: str | None
    higher_is_better: bool = True
    value: float | None = None
    step: int | None = None
    metrics: dict[str, float] | None = None
    patience: int | None = None  # evaluations without improvement that stop the run (None: never)
    min_delta: float = 0.0
    waited: int = 0  # evaluations since the last improvement by more than min_delta
    mark: float | None = None  # the value that improvement is counted from

    def beats(self, value: float, than: float | None, by: float = 0.0) -> bool:
        """Whether `value` is better than `than` by more than `by` (a NaN never is; anything beats a NaN)."""
        if math.isnan(value):
            return False
        if than is None or math.isnan(than):
            return True
        return value - than > by if self.higher_is_better else than - value > by

    def improved_by(self, metrics: dict[str, float]) -> bool:
        """Whether `metrics` beat the best so far."""
        return self.metric is not None and self.beats(metrics[self.metric], self.value)

    def update(self, step: int, metrics: dict[str, float]) -> bool:
        """Take `metrics` of `step` if they improve on the best, and count the evaluation for early
        stopping; returns whether they improved."""
        if self.metric is None:
            return False
        value = metrics[self.metric]
        if self.beats(value, self.mark, self.min_delta):
            self.waited, self.mark = 0, value
        else:
            self.waited += 1
        if not self.improved_by(metrics):
            return False
        self.value, self.step, self.metrics = value, step, metrics
        return True

    @property
    def patience_spent(self) -> bool:
        """Early stopping: `patience` evaluations in a row brought no improvement."""
        return self.patience is not None and self.metric is not None and self.waited >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "step": self.step, "metrics": self.metrics, "waited": self.waited,
                "mark": self.mark}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        self.value, self.step, self.metrics = state.get("value"), state.get("step"), state.get("metrics")
        # a checkpoint from before early stopping counted from its best
        self.waited, self.mark = int(state.get("waited", 0)), state.get("mark", self.value)


def interrupted(results: dict[str, Any]) -> str | None:
    """The signal that stopped a run (SIGINT, SIGTERM: it goes on when resumed), or None: it ended,
    at its last step or by early stopping."""
    stopped = results.get("stopped")
    return None if stopped in (None, EARLY_STOPPING) else stopped


def model_entries(out: Path, folder: str) -> dict[str, str | None]:
    """{"best_model" or "final_model": the folder's path, or None where it is not on disk}. Asked
    once the writes of the run have ended."""
    path = out / folder
    return {f"{folder}_model": str(path) if path.is_dir() else None}


def write_results(out: Path, results: dict[str, Any]) -> None:
    write_text(out / RESULTS_FILE, json.dumps(results, indent=2) + "\n")


def read_results(out: Path) -> dict[str, Any] | None:
    """The run's results.json, or None where it is missing or unreadable."""
    try:
        results = json.loads((out / RESULTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return results if isinstance(results, dict) else None


def check_records(out: Path, step: int, saved: int | None) -> tuple[int, bool]:
    """(train records the run logged up to `step`, whether some are missing from metrics.jsonl),
    with one warning line when they are. `saved`: the count the checkpoint recorded (None for a
    checkpoint from before it did: then a run's first record, of step 1, must be there)."""
    path = out / METRICS_FILE
    kept = [r["step"] for r in (read_metrics(out) if path.is_file() else []) if r.get("type") == "train"]
    expected = len(kept) if saved is None else max(int(saved), len(kept))
    lost = len(kept) < expected or (step > 0 and 1 not in kept)
    if lost:
        what = f"{len(kept)} of the {expected} train records" if saved is not None else "no record of step 1"
        print(f"warning: {path} holds {what} up to step {step} (deleted or cut?): training goes on, and results.json "
              "covers only the steps recorded (metrics_steps; metrics_complete: false)", file=sys.stderr, flush=True)
    return expected, lost


def summarize(out: Path, unit: str) -> dict[str, Any]:
    """First and final train losses, units trained, training time, throughput and steps skipped for
    a non-finite gradient of the whole run, from metrics.jsonl (records of steps lost to a crash
    were dropped on resume), and the first and last step those records cover."""
    records = [r for r in read_metrics(out) if r.get("type") == "train"]
    if not records:
        return {"initial_train_loss": None, "train_loss": None, f"train_{unit}": 0, "train_time_s": 0.0,
                f"{unit}_per_second": None, "skipped_steps": 0, "metrics_steps": None}
    keys = [k for k in records[0] if k.endswith("loss")]
    tail = records[-max(1, len(records) // 10):]  # the final train loss averages the last 10% of records
    units = sum(r.get(unit, 0) for r in records)
    seconds = sum(r.get("seconds", 0.0) for r in records)
    summary: dict[str, Any] = {}
    for k in keys:
        values = [r[k] for r in tail if r.get(k) is not None]
        summary[f"initial_train_{k}" if k != "loss" else "initial_train_loss"] = records[0].get(k)
        summary[f"train_{k}" if k != "loss" else "train_loss"] = float(np.mean(values)) if values else None
    summary.update({f"train_{unit}": units, "train_time_s": round(seconds, 3),
                    f"{unit}_per_second": units / seconds if seconds else None,
                    "skipped_steps": sum(r.get("skipped_steps", 0) for r in records),
                    "metrics_steps": [records[0]["step"], records[-1]["step"]]})
    return summary
