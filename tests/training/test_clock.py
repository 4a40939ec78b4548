"""The loop's clocks on a fake clock (tests/fake_clock.py): the time budget, what the end of a run
reserves, the lr schedule's clock, the session timings; and the ranks' one agreement.

Run: .venv/bin/python -m pytest tests/training/test_clock.py -q
"""

import math

import pytest

import bert_kit.training.clock
import bert_kit.training.distributed as distributed
from bert_kit.training.clock import BudgetClock, Timings
from bert_kit.training.distributed import AGREE_S, Agreement
from tests.fake_clock import FakeClock


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    return FakeClock().install(monkeypatch, bert_kit.training.clock)


def test_a_budget_counts_from_the_start_it_is_given_and_keeps_time_for_the_end(clock):
    budget = BudgetClock(60.0, 50.0, clock.time() - 4.0)  # 50 s left of 60, counted from 4 s ago
    assert budget.left() == pytest.approx(46.0)
    # nothing timed yet: the end reserves 5 s, or 1.5 last evaluations estimated from the step time
    assert budget.end_reserve(0.0, 0.0) == 5.0
    budget.step_s = 2.0
    assert budget.end_reserve(10.0, 0.0) == pytest.approx(1.5 * 10 * 2.0 + 5.0)
    budget.evaluation_took(3.0)  # an evaluation timed: the reserve covers twice that, however long the steps
    assert budget.end_reserve(10.0, AGREE_S) == pytest.approx(2 * 3.0 + 5.0 + AGREE_S)
    budget.save_took(4.0)
    assert budget.end_reserve(10.0, 0.0) == pytest.approx(3 * 4.0 + 5.0)
    clock.sleep(46.0 - 17.0)  # 17 s left: what the end needs, less 0
    assert budget.left_after_end(10.0, 0.0) == pytest.approx(0.0)
    clock.sleep(0.5)
    assert budget.left_after_end(10.0, 0.0) < 0  # out of time
    assert budget.state_dict()["budget_used_s"] == pytest.approx(60.0 - 16.5)
    assert BudgetClock(None, None, clock.time()).left() == math.inf


def test_the_lr_clock_skips_a_sessions_first_step_and_follows_the_agreed_time(clock):
    budget = BudgetClock(100.0, 100.0, clock.time(), {"trained_s": 7.0, "train_span_s": 90.0})
    assert (budget.trained_s, budget.lr_clock_s, budget.train_span_s) == (7.0, 7.0, 90.0)  # resumed
    started = clock.time()
    clock.sleep(30.0)  # the first step compiles: not on the schedule's clock
    budget.step_ended(started, first=True)
    assert budget.trained_s == 7.0 and budget.step_s == 0.0
    started = clock.time()
    clock.sleep(0.5)  # a step (host time) ...
    budget.step_ended(started, first=False)
    clock.sleep(2.0)  # ... and an evaluation after it: both count
    budget.step_ended(clock.time(), first=False)
    assert budget.trained_s == pytest.approx(9.5) and budget.step_s == 0.0
    budget.window_timed(3.0, 4)  # a record timed a window the device had finished: its true step time wins
    budget.step_ended(clock.time() - 9.0, first=False)
    assert budget.step_s == 0.75
    # until the ranks agree the schedule reads the last agreed values; then the earliest end
    assert budget.lr_clock_s == 7.0
    budget.agreed(12.0, 30.0)
    assert (budget.trained_s, budget.lr_clock_s, budget.train_span_s) == (12.0, 12.0, 42.0)
    budget.agreed(13.0, -4.0)  # past the end: the decay ends a second on
    assert budget.train_span_s == 14.0
    steps_only = BudgetClock(None, None, clock.time())
    steps_only.agreed(5.0, math.inf)
    assert steps_only.lr_clock_s == 0.0 and steps_only.train_span_s is None  # no budget: the lr follows steps


def test_timings_add_up_to_the_wall_time(clock):
    timings = Timings(clock.time())
    clock.sleep(2.0)  # start-up
    timings.first_step_started(clock.time())
    clock.sleep(3.0)
    timings.first_step_ended()
    timings.first_step_started(clock.time() + 99)  # later steps change nothing
    clock.sleep(1.0)
    with timings.timing("eval") as span:
        clock.sleep(0.5)
    assert span.seconds == 0.5
    with timings.timing("save"):
        clock.sleep(0.25)
    timings.first_step_ended()
    timings.loop_ended()
    with timings.timing("eval"):  # the last evaluation, after the loop
        clock.sleep(0.5)
    summary = timings.summary(wall_s=8.0)
    assert summary == {"start_s": 2.0, "first_step_s": 3.0, "train_s": 1.0, "eval_s": 1.0, "save_s": 0.25,
                       "end_s": 0.75}
    assert Timings(clock.time()).summary(1.5) == {"start_s": 1.5, "end_s": 0.0}  # stopped before a step


def test_one_process_agrees_every_step_and_several_every_agree_s_of_steps(monkeypatch):
    agreement = Agreement(step=10)
    assert not agreement.due(10, 100) and agreement.due(11, 100)
    agreed = agreement.agree(11, True, False, True, 3.0, -1.0, 0.01)
    assert (agreed.out_of_time, agreed.save_late, agreed.stop, agreed.trained_s, agreed.left_s) == (True, False, True,
                                                                                                    3.0, -1.0)
    assert agreement.next_step == 12 and Agreement.between_s() == 0.0

    # two ranks: one collective of every value; flags by any rank, the latest clock, the earliest end
    other_rank = [0.0, 1.0, 0.0, 5.0, -(-2.0), 0.05]
    calls = []

    def max_over_ranks(*values):
        calls.append(values)
        return [max(a, b) for a, b in zip(values, other_rank)]

    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "max_over_ranks", max_over_ranks)
    agreed = agreement.agree(12, False, False, False, 4.0, 3.0, 0.01)
    assert len(calls) == 1
    assert (agreed.out_of_time, agreed.save_late, agreed.stop, agreed.trained_s, agreed.left_s) == (False, True,
                                                                                                    False, 5.0, -2.0)
    assert agreement.next_step == 12 + int(AGREE_S / 0.05)  # the slowest rank's step time spaces them
    assert not agreement.due(13, 100) and agreement.due(13, 13)  # the last step is always agreed
    assert Agreement.between_s() == AGREE_S
