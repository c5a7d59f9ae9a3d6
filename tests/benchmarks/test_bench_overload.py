"""The decisions of the overload-step benchmark (bench/overload.py): the offered schedule, the
calibration's cost model, when a run settled after the step, and the output check."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.backpressure.overload import (
    CostModel,
    RateSchedule,
    fit_cost,
    output_problems,
    pending_delays,
    settle_time,
)

# -- the offered rate ----------------------------------------------------------------------


def test_schedule_integrates_each_rate_over_its_own_span():
    schedule = RateSchedule(100.0, 1000)
    schedule.set(110.0, 20_000)
    assert schedule.total(99.0) == 0
    assert schedule.total(105.0) == 5000
    assert schedule.total(112.5) == 10_000 + 50_000
    assert schedule.rate_at(109.9) == 1000
    assert schedule.rate_at(110.0) == 20_000


def test_schedule_refuses_a_change_before_the_last():
    schedule = RateSchedule(100.0, 1000)
    schedule.set(110.0, 5)
    with pytest.raises(ValueError, match="before the last"):
        schedule.set(109.0, 7)


# -- calibration ---------------------------------------------------------------------------


def test_fit_recovers_the_line_and_the_sustainable_rate():
    model = fit_cost([(1000, 0.302), (1000, 0.302), (20_000, 0.34), (100_000, 0.5)])
    assert model.fixed_s == pytest.approx(0.3)
    assert model.per_record_s == pytest.approx(2e-6)
    assert model.sustainable(1.0) == pytest.approx(350_000)


def test_fit_needs_two_batch_sizes_and_a_rising_cost():
    with pytest.raises(ValueError, match="two different sizes"):
        fit_cost([(1000, 0.3), (1000, 0.4)])
    with pytest.raises(ValueError, match="not slower"):
        fit_cost([(1000, 0.5), (50_000, 0.3)])


def test_a_fixed_cost_above_the_interval_sustains_nothing():
    assert CostModel(1.2, 1e-6).sustainable(1.0) < 0


# -- settling --------------------------------------------------------------------------------


def delays_from(step_s: float, values: list[float]) -> list[tuple[float, float]]:
    """Batches one second apart from one second before the step on."""
    return [(step_s - 1 + i, d) for i, d in enumerate(values)]


def test_settles_at_the_first_batch_of_the_last_run_under_the_limit():
    delays = delays_from(100, [0.1, 0.2, 3.5, 4.0, 2.5, 1.9, 0.5, 0.2, 0.1, 0.1])
    assert settle_time(delays, 100, 2.0, 3) == 4  # the batch at 104 (delay 1.9) onwards


def test_a_run_never_late_settles_at_its_first_batch_after_the_step():
    delays = delays_from(100, [5.0, 0.3, 0.4, 0.2, 0.1])  # the late one is before the step
    assert settle_time(delays, 100, 2.0, 3) == 0


def test_a_delay_exactly_at_the_limit_is_not_under_it():
    assert settle_time(delays_from(100, [0, 0, 0, 2.0, 0, 0]), 100, 2.0, 2) == 3


def test_never_settled_when_the_run_ends_late_or_the_calm_tail_is_short():
    assert settle_time(delays_from(100, [0.1, 1, 3, 5, 7]), 100, 2.0, 1) is None
    assert settle_time(delays_from(100, [0.1, 9, 9, 9, 0.5, 0.4]), 100, 2.0, 3) is None
    assert settle_time([], 100, 2.0, 1) is None


def test_batches_never_started_count_with_the_delay_they_reached():
    covered = {1000, 2000, 4000}  # 3000 merged into nothing, 5000 and 6000 still queued
    pending = pending_delays(covered, 1000, 6.5, 1.0)
    assert pending == [(3.0, 3.5), (5.0, 1.5), (6.0, 0.5)]
    started = [(1.0, 0.1), (2.0, 0.2), (4.0, 0.1)]
    assert settle_time(started + pending, 1.0, 2.0, 2) == 3  # after the one never started
    assert settle_time(started + pending, 1.0, 1.0, 2) is None  # 5 s is still queued


# -- the output check --------------------------------------------------------------------------


def test_exact_output_passes():
    outputs = {1000: Counter(a=2, b=1), 2000: Counter(a=1)}
    assert output_problems(outputs, {1000: 2, 2000: 1}, Counter(a=3, b=1), 3, True) == []


def test_lost_and_repeated_words_are_named():
    outputs = {1000: Counter(a=2), 2000: Counter(a=1, c=4)}
    problems = output_problems(outputs, {1000: 2, 2000: 1}, Counter(a=3, b=1), 3, True)
    assert problems == [
        "1 words of admitted records missing from the output",
        "4 words in the output beyond the admitted records",
    ]


def test_a_completed_batch_without_output_fails():
    problems = output_problems({}, {1000: 0}, Counter(), 0, True)
    assert problems == ["batch 1000 completed without output"]


def test_only_completed_batches_count():
    """A batch cut short at stop may have emitted output: it is not part of the run."""
    outputs = {1000: Counter(a=1), 2000: Counter(a=5)}
    assert output_problems(outputs, {1000: 1}, Counter(a=1), 9, False) == []


def test_admitted_records_must_match_what_the_source_handed_out():
    outputs = {1000: Counter(a=1)}
    graceful = output_problems(outputs, {1000: 1}, Counter(a=1), 2, True)
    assert graceful == ["batches admitted 1 records, the source handed out 2"]
    too_many = output_problems(outputs, {1000: 3}, Counter(a=1), 2, False)
    assert too_many == ["batches admitted 3 records, only 2 were sent"]
