"""The clocks of a training run: its time budget (which the lr schedule runs on), and where a
session's time goes.

Every reading of the time by the loop goes through `now()` of this module, so a test runs the
loop on a fake clock (tests/fake_clock.py installs one here) and gets the same steps, learning
rates and timings on a busy machine as on an idle one.

`BudgetClock` answers, each time the ranks agree (`distributed.Agreement`): how much of the
budget is left once the end of the run is paid for (the last evaluation, the saves), and where the
lr schedule stands: seconds of the budget since each session's first step, out of how many there
will be. A session's first step compiles and captures (tens of seconds when compiled): it is not on
the schedule's clock, or a time budget's warm-up would be spent before the second step.
`Timings` splits a session's wall time into start, first step, steps, evaluations, checkpoints and
end (results.json "timings").
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def now() -> float:
    """The loop's clock: seconds since the epoch (`time.time()`, or a test's fake clock)."""
    return time.time()


class BudgetClock:
    """A run's time budget and the lr schedule's clock.

    total_s: the whole budget (None: the run has none; the clock still times steps); left_s: what was
    left of it when this session started, counted from `started`; state: what a checkpoint saved
    (`state_dict`), when resuming.
    """

    RESERVE_S = 5.0  # what the end takes at least: saving, and a short last evaluation

    def __init__(self, total_s: float | None, left_s: float | None, started: float, state: dict | None = None):
        state = state or {}
        self.total_s, self.left_s, self.started = total_s, left_s, started
        # the budget's seconds since each session's first step (evaluations and checkpoints
        # included), and that time plus what is left: the span the lr decays over
        self.trained_s = float(state.get("trained_s", 0.0))
        self.train_span_s: float | None = state.get("train_span_s")
        self.lr_clock_s = self.trained_s  # the schedule's reading: the same on every rank (set as they agree)
        self.reserve_s = self.RESERVE_S  # what the end needs, raised by the evaluations and saves timed
        self.step_s = 0.0  # a step's wall time, the latest known
        self.step_s_synced = False  # ... from a window the device had finished (not the host's queueing)
        self.eval_timed = False  # an evaluation was timed: the reserve covers the last one
        self.last_reading = now()

    def left(self) -> float:
        """Seconds of the budget left now (infinite without a budget)."""
        return math.inf if self.left_s is None else self.left_s - (now() - self.started)

    def end_reserve(self, final_eval_steps: float, between_s: float) -> float:
        """Seconds the end needs: saving, and the last evaluation (`final_eval_steps` steps' worth
        until an evaluation is timed), plus `between_s`: the steps until the ranks next agree."""
        if self.eval_timed:
            return self.reserve_s + between_s
        return max(self.reserve_s, 1.5 * final_eval_steps * self.step_s + self.RESERVE_S) + between_s

    def left_after_end(self, final_eval_steps: float, between_s: float) -> float:
        """Seconds left for training steps: what is left less what the end needs (< 0: out of time)."""
        return self.left() - self.end_reserve(final_eval_steps, between_s)

    def step_ended(self, step_started: float, first: bool) -> None:
        """A step (queued at `step_started`) and whatever followed it (an evaluation, a checkpoint)
        is on the budget's clock, unless it is the session's `first`."""
        t = now()
        if not first:
            self.trained_s += t - self.last_reading
            if not self.step_s_synced:  # the host's time of a step, until a record times a window
                self.step_s = t - step_started
        self.last_reading = t

    def window_timed(self, seconds: float, steps: int) -> None:
        """A logging window the device had finished: its steps' true time."""
        self.step_s, self.step_s_synced = seconds / steps, True

    def evaluation_took(self, seconds: float) -> None:
        self.reserve_s = max(self.reserve_s, 2 * seconds + self.RESERVE_S)
        self.eval_timed = True

    def save_took(self, seconds: float) -> None:
        self.reserve_s = max(self.reserve_s, 3 * seconds + self.RESERVE_S)

    def agreed(self, trained_s: float, left_s: float) -> None:
        """The ranks agreed on the clock (the latest rank's) and on what is left (the earliest end):
        the lr schedule reads these until the next agreement, so its lr ends near zero."""
        self.trained_s = trained_s
        if self.left_s is not None:
            self.lr_clock_s, self.train_span_s = trained_s, trained_s + max(1.0, left_s)

    def state_dict(self) -> dict[str, float | None]:
        """What a checkpoint keeps: the schedule's clock, and the budget spent (by every session)."""
        used = (self.total_s or 0.0) - self.left() if self.left_s is not None else 0.0
        return {"trained_s": self.trained_s, "train_span_s": self.train_span_s, "budget_used_s": used}


@dataclass
class Span:
    """A stretch of time being measured; `seconds` once it has ended."""

    start: float
    seconds: float = 0.0


class Timings:
    """Where a session's time goes, from its launch (`started`) to results.json."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.spent = {"eval": 0.0, "save": 0.0}  # every evaluation (best/ included), every checkpoint
        self.first_step: list[float] = []  # the session's first step: its start and its end
        self.loop_end = self.started
        self.in_loop = dict(self.spent)

    @contextmanager
    def timing(self, kind: str) -> Iterator[Span]:
        """Time a stretch of `kind` ("eval" or "save"); the span yielded holds its seconds after it."""
        span = Span(now())
        try:
            yield span
        finally:
            span.seconds = now() - span.start
            self.spent[kind] += span.seconds

    def first_step_started(self, t: float) -> None:
        if not self.first_step:
            self.first_step.append(t)

    def first_step_ended(self) -> None:
        """Called after each step: the first call ends the first step (after its record, which
        waited for the device)."""
        if len(self.first_step) == 1:
            self.first_step.append(now())

    def loop_ended(self) -> None:
        self.loop_end, self.in_loop = now(), dict(self.spent)

    def summary(self, wall_s: float) -> dict[str, float]:
        """Seconds of the session: start (imports, model, data, tokenizing up to the first step),
        first_step (its compilation and capture), train (the other steps), eval, save, and end (the
        final model, the plot; and the rest)."""
        if len(self.first_step) < 2:  # stopped before a step
            return {"start_s": round(wall_s, 3), "end_s": 0.0}
        first, first_end = self.first_step
        train = max(0.0, self.loop_end - first_end - self.in_loop["eval"] - self.in_loop["save"])
        parts = {"start_s": first - self.started, "first_step_s": first_end - first, "train_s": train,
                 "eval_s": self.spent["eval"], "save_s": self.spent["save"]}
        parts["end_s"] = max(0.0, wall_s - sum(parts.values()))
        return {k: round(v, 3) for k, v in parts.items()}
