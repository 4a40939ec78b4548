"""A clock that moves only when a test says so, for time budgets tested apart from the machine's speed.

The training loop reads the time through `bert_kit.training.clock` (`now()`, the time budget's
`BudgetClock`); a test installs a `FakeClock` there and lets the patched work (a step, an
evaluation, a save) advance it by fixed amounts. The run then sees exactly the seconds the test
chose, on an idle machine or a busy one, and its figures (steps, learning rates, wall_time_s) are
the same every time.

    clock = FakeClock()
    clock.install(monkeypatch, bert_kit.training.clock)
    clock.sleep(0.1)  # what a patched train step "takes"
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest


class FakeClock:
    """time(), monotonic(), perf_counter() return `now`; sleep(s) advances it, returning at once."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = float(start)

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def install(self, monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> "FakeClock":
        """Replace the `time` module that each of `modules` imported with this clock."""
        fake = SimpleNamespace(time=self.time, monotonic=self.time, perf_counter=self.time, sleep=self.sleep)
        for module in modules:
            monkeypatch.setattr(module, "time", fake)
        return self
