"""Backpressure units: Spark's PID rate estimator rule by rule, the bound on one step, the rate
controller with fake times, and how sources spend a record budget."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from dstream.context import StreamingContext
from dstream.runtime.control.backpressure import WARMUP_BATCHES, PIDRateEstimator, RateController
from dstream.runtime.scheduling.clock import ManualClock
from dstream.sources import FileInputDStream, RateInputDStream, split_budget

BATCH_MS = 1000


def primed(processing_rate: float = 1000.0, **gains: float) -> PIDRateEstimator:
    """An estimator whose first valid update has recorded `processing_rate` at t=1000 ms; the
    step bound is off unless given, so that Spark's own law shows rule by rule."""
    estimator = PIDRateEstimator(BATCH_MS, **{"max_step": math.inf, **gains})
    assert estimator.compute(1000, int(processing_rate), 1000, 0) is None
    return estimator


# -- the update rules -------------------------------------------------------------------


def test_no_update_without_records():
    estimator = primed()
    assert estimator.compute(2000, 0, 500, 0) is None
    assert estimator.compute(2000, 500, 500, 0) == pytest.approx(1000)  # t=2000 still counts


def test_no_update_without_processing_time():
    estimator = primed()
    assert estimator.compute(2000, 1000, 0, 0) is None
    assert estimator.last_terms is None


def test_no_update_without_elapsed_time():
    estimator = primed()
    assert estimator.compute(1000, 2000, 1000, 0) is None
    assert estimator.compute(900, 2000, 1000, 0) is None
    assert estimator.compute(1001, 2000, 1000, 0) is not None


def test_first_valid_update_only_records_the_processing_rate():
    estimator = PIDRateEstimator(BATCH_MS)
    assert estimator.compute(500, 0, 100, 0) is None  # invalid: does not count as the first
    assert estimator.compute(1000, 3000, 1000, 5000) is None  # first valid: rate 3000/s kept
    assert estimator.last_terms is None
    # Same processing rate, no delay: no error, so the estimate is exactly what was recorded.
    assert estimator.compute(2000, 3000, 1000, 0) == pytest.approx(3000)


def test_spark_control_law_with_every_term():
    estimator = primed(1000, proportional=1.0, integral=0.2, derivative=0.1)
    rate = estimator.compute(3000, 1500, 1000, 500)
    # processingRate 1500; error 1000-1500 = -500; historical 500*1500/1000 = 750;
    # dError (-500 - 0) / 2 s = -250; new = 1000 + 500 - 0.2*750 + 0.1*250 = 1375.
    assert rate == pytest.approx(1375)
    terms = estimator.last_terms
    assert (terms.processing_rate, terms.error) == (pytest.approx(1500), pytest.approx(-500))
    assert terms.historical_error == pytest.approx(750)
    assert terms.derivative_error == pytest.approx(-250)
    assert terms.rate == pytest.approx(1375)


# -- steady state -----------------------------------------------------------------------


def test_without_error_it_follows_the_processing_rate():
    estimator = primed(1000)
    for step, processing_rate in enumerate([1000, 2500, 2500, 800, 800], start=2):
        rate = estimator.compute(step * BATCH_MS, processing_rate, 1000, 0)
        assert rate == pytest.approx(processing_rate)


def test_accumulated_scheduling_delay_pushes_the_rate_below_processing():
    estimator = primed(1000)
    rates = [estimator.compute(step * BATCH_MS, 1000, 1000, 2000) for step in range(2, 6)]
    # Each batch waited two intervals: historical error 2000/s, so 1000 - 0.2*2000 = 600.
    assert rates == [pytest.approx(600)] * 4
    assert all(rate < 1000 for rate in rates)


# -- one pathological batch ----------------------------------------------------------------


def test_one_slow_batch_at_most_halves_the_rate_and_the_next_restores_it():
    estimator = primed(1000, max_step=2)
    # A batch slowed 20x by something else (a query, a GC): Spark's law would go to minRate.
    assert estimator.compute(2000, 1000, 20_000, 0) == pytest.approx(500)
    # Normal batches again (coalescing keeps their delay under an interval): the proportional
    # term follows the processing rate back up.
    assert estimator.compute(3000, 500, 500, 500) == pytest.approx(900)
    assert estimator.compute(4000, 900, 900, 0) == pytest.approx(1000)


def test_a_real_overload_still_halves_the_rate_every_batch_until_it_fits():
    estimator = primed(100_000, max_step=2)
    rates = [estimator.compute(t * BATCH_MS, 100_000, 100_000 // 10, 0) for t in range(2, 7)]
    # Processing 10,000/s: each step at most halves, then the estimate settles on it.
    assert rates == [50_000, 25_000, 12_500, 10_000, 10_000]


def test_never_below_min_rate():
    estimator = primed(1000, min_rate=250)
    assert estimator.compute(2000, 1000, 1000, 60_000) == 250
    assert estimator.compute(3000, 1, 1000, 60_000) == 250


@pytest.mark.parametrize(
    "arguments",
    [
        {"proportional": -0.1},
        {"integral": -1},
        {"derivative": -0.5},
        {"min_rate": 0},
        {"min_rate": -10},
        {"max_step": 1},
    ],
)
def test_rejects_invalid_gains(arguments):
    with pytest.raises(ValueError, match=next(iter(arguments)).split("_")[0]):
        PIDRateEstimator(BATCH_MS, **arguments)


def test_rejects_a_non_positive_batch_interval():
    with pytest.raises(ValueError, match="batch interval"):
        PIDRateEstimator(0)


# -- the controller ---------------------------------------------------------------------


def controller(
    batch_ms: int = BATCH_MS, initial: float | None = None, cap: float | None = None
) -> RateController:
    """A controller past its unmeasured warm-up (see the warm-up tests), nothing measured yet."""
    fresh = RateController(PIDRateEstimator(batch_ms), initial_rate=initial, max_rate=cap)
    for batch in range(WARMUP_BATCHES):  # a minute of start-up for 10 records: not measured
        fresh.update(batch, 10, 60_000, 0, limited=True)
    return fresh


def test_the_first_batch_with_records_is_not_measured_even_when_quick():
    fresh = RateController(PIDRateEstimator(BATCH_MS), initial_rate=20_000)
    fresh.update(500, 0, 100, 0, limited=False)  # no records: nothing to learn, still cold
    fresh.update(1000, 20_000, 900, 0, limited=True)  # the first with records: never measured
    assert fresh.rate_limit == 20_000 and not fresh.estimator.primed
    fresh.update(2000, 20_000, 800, 0, limited=True)  # kept up: warm, measured
    assert fresh.estimator.primed


def test_cold_batches_that_overrun_after_the_first_are_not_measured_either():
    fresh = RateController(PIDRateEstimator(BATCH_MS), initial_rate=20_000)
    fresh.update(1000, 20_000, 8000, 0, limited=True)  # Python workers and the JVM starting
    fresh.update(2000, 20_000, 2900, 0, limited=True)  # still cold: 6,900/s
    assert fresh.rate_limit == 20_000 and not fresh.estimator.primed
    fresh.update(3000, 20_000, 800, 0, limited=True)  # warm: kept up, ends the warm-up
    fresh.update(4000, 20_000, 2900, 0, limited=True)  # now an overrun is measured: 6,900/s
    assert fresh.rate_limit == pytest.approx(12_500)  # half the 25,000/s measured before


def test_the_warm_up_is_bounded_so_a_real_overload_from_the_start_still_comes_down():
    fresh = RateController(PIDRateEstimator(BATCH_MS), initial_rate=50_000)
    for batch in range(1, WARMUP_BATCHES + 1):  # every batch overruns: 5,000/s
        fresh.update(batch * BATCH_MS, 50_000, 10_000, 0, limited=True)
    assert fresh.rate_limit == 50_000
    fresh.update((WARMUP_BATCHES + 1) * BATCH_MS, 50_000, 10_000, 0, limited=True)
    assert fresh.rate_limit == pytest.approx(5000)


def test_without_initial_rate_a_limit_comes_only_from_batches_that_overran():
    limited = controller()
    assert limited.rate_limit is None and limited.max_records() is None
    limited.update(1000, 5000, 500, 0, limited=False)  # kept up with everything: says nothing
    assert not limited.estimator.primed
    limited.update(2000, 5000, 2000, 0, limited=False)  # fell behind: the first valid update
    assert limited.max_records() is None
    limited.update(3000, 5000, 2000, 0, limited=False)
    assert limited.rate_limit == pytest.approx(2500)


def test_initial_rate_limits_until_the_estimator_speaks():
    limited = controller(initial=1000)
    assert limited.rate_limit == 1000 and limited.max_records() == 1000
    limited.update(1000, 1000, 200, 0, limited=True)  # processing 5000/s: recorded, not applied
    assert limited.rate_limit == 1000
    limited.update(2000, 1000, 200, 0, limited=True)
    assert limited.rate_limit == pytest.approx(5000)


def test_an_initial_rate_above_the_first_measurement_comes_down_to_it_at_once():
    limited = controller(initial=50_000)
    limited.update(1000, 50_000, 10_000, 0, limited=True)  # processing 5000/s, 10x below
    assert limited.rate_limit == pytest.approx(5000)
    limited.update(2000, 5000, 1000, 0, limited=True)  # then Spark's law, from that measurement
    assert limited.rate_limit == pytest.approx(5000)


def test_a_batch_that_admitted_everything_available_neither_lowers_nor_raises_the_limit():
    quiet = controller(initial=20_000)
    quiet.update(1000, 20_000, 500, 0, limited=True)
    quiet.update(2000, 20_000, 500, 0, limited=True)  # 40,000/s
    assert quiet.rate_limit == pytest.approx(40_000)
    for batch in range(3, 60):  # 147 records a batch (294/s): Spark's law would follow them
        quiet.update(batch * BATCH_MS, 147, 100, 0, limited=False)
        assert quiet.rate_limit == pytest.approx(40_000)
    quiet.update(60 * BATCH_MS, 20_000, 50, 0, limited=False)  # 400,000/s, not at the limit
    assert quiet.rate_limit == pytest.approx(40_000)
    quiet.update(61 * BATCH_MS, 147, 3000, 5000, limited=False)  # slow, but not for its records
    assert quiet.rate_limit == pytest.approx(40_000)


def test_after_a_quiet_spell_the_limit_jumps_to_the_recent_capacity():
    job = controller(initial=30_000)
    job.update(1000, 30_000, 1000, 0, limited=True)  # recorded: 30,000/s
    job.update(2000, 30_000, 1500, 0, limited=True)  # an overloaded batch: 20,000/s
    job.update(3000, 20_000, 2000, 0, limited=True)  # a slow one (a GC): halved to 10,000/s
    assert job.rate_limit == pytest.approx(10_000)
    job.update(4000, 300, 100, 0, limited=False)  # then the input went quiet
    job.update(5000, 10_000, 400, 0, limited=True)  # a burst: 25,000/s, bounded to 20,000/s...
    assert job.rate_limit == pytest.approx(30_000)  # ...but up at once to the best measured
    assert job.capacity == pytest.approx(30_000)
    job.update(6000, 30_000, 500, 0, limited=True)  # the next step is bounded from there
    assert job.rate_limit == pytest.approx(60_000)


def test_without_a_quiet_spell_an_increase_stays_bounded():
    busy = controller(initial=30_000)
    busy.update(1000, 30_000, 1000, 0, limited=True)
    busy.update(2000, 30_000, 3000, 0, limited=True)  # halved
    busy.update(3000, 15_000, 3000, 0, limited=True)  # 5,000/s: halved again, 7,500/s
    busy.update(4000, 7_500, 100, 0, limited=True)  # 75,000/s measured: at most doubled
    assert busy.rate_limit == pytest.approx(15_000)


def test_a_limited_batch_that_overran_after_a_quiet_spell_does_not_jump():
    job = controller(initial=30_000)
    job.update(1000, 30_000, 1000, 0, limited=True)
    job.update(2000, 30_000, 1000, 0, limited=True)
    job.update(3000, 300, 100, 0, limited=False)
    job.update(4000, 30_000, 3000, 0, limited=True)  # 10,000/s: the job got slower meanwhile
    assert job.rate_limit == pytest.approx(15_000)


def test_budget_is_rate_times_batch_interval():
    assert controller(batch_ms=500, initial=3000).max_records() == 1500
    assert controller(batch_ms=2000, initial=3000).max_records() == 6000
    assert controller(batch_ms=100, initial=5).max_records() == 1  # never a zero budget


def test_max_rate_caps_initial_rate_and_estimates():
    capped = controller(initial=50_000, cap=2000)
    assert capped.rate_limit == 2000 and capped.max_records() == 2000
    capped.update(1000, 2000, 200, 0, limited=True)
    capped.update(2000, 2000, 200, 0, limited=True)  # estimate 10000/s
    assert capped.rate_limit == 2000
    assert controller(cap=700).rate_limit == 700  # unlimited becomes the cap


def test_estimates_below_the_cap_pass():
    capped = controller(cap=2000)
    capped.update(1000, 1000, 1000, 0, limited=True)
    capped.update(2000, 1000, 1000, 0, limited=True)
    assert capped.rate_limit == pytest.approx(1000)


# -- whole jobs on fake time: the two cases ---------------------------------------


@dataclass(frozen=True)
class Step:
    limit: float | None
    records: int
    processing_ms: int
    left: int  # records available that the batch did not admit


def fake_job(
    control: RateController,
    batches: int,
    offered: Callable[[int], float],
    cost_ms: Callable[[int, int], int],
) -> list[Step]:
    """Batches of a job on fake time: batch k admits what has arrived, up to its budget, and
    takes cost_ms(k, records); the next starts an interval later, or when it ends if it
    overran (due times coalesce). offered(k): records/s arriving during batch k."""
    interval = control.estimator.batch_interval_ms
    waiting, now, steps = offered(0) * interval / 1000, 0, []
    for k in range(batches):
        budget = control.max_records()
        records = int(waiting) if budget is None else min(budget, int(waiting))
        processing = cost_ms(k, records)
        steps.append(Step(control.rate_limit, records, processing, int(waiting) - records))
        elapsed = max(interval, processing)
        now += elapsed
        limited = budget is not None and records >= budget
        control.update(now, records, processing, 0, limited=limited)
        waiting += offered(k) * elapsed / 1000 - records
    return steps


def warm_cost(records: int) -> int:
    """A warm batch of the tutorial's WordCount: 100 ms, and 100,000 records/s on top (25,000
    records in 350 ms, as the issue saw; a batch of 500 ms holds 40,000)."""
    return 100 + records // 100


def test_a_cold_start_does_not_cut_the_limit_and_the_backlog_drains_at_capacity():
    """The tutorial's job: 500 ms batches, 50,000 lines/s, initialRate 20,000/s, and a first
    batch 2.9 s and a second 1.5 s slow for their JVM, workers and caches."""
    cold = {0: 2900, 1: 1500}
    steps = fake_job(
        RateController(PIDRateEstimator(500), initial_rate=20_000),
        40,
        lambda k: 50_000,
        lambda k, records: cold.get(k, warm_cost(records)),
    )
    limits = [step.limit for step in steps]
    assert min(limits) == 20_000  # no cold batch lowered it
    drained = next(k for k, step in enumerate(steps) if step.left == 0)
    # 4.4 s of input waiting (220,000 records) drain at the 30,000/s that the job's 80,000/s
    # in 500 ms batches leaves: 7.3 s, 15 batches, once the limit has risen (2 batches)
    assert drained <= 20, [(s.limit, s.records, s.left) for s in steps]
    assert all(step.processing_ms <= 500 for step in steps[drained:])


def test_a_burst_after_a_quiet_spell_is_admitted_at_the_limit_the_job_had():
    """A Kafka copy job: busy, then 294 records/s for a minute, then 20,000/s."""
    offered = [40_000] * 20 + [294] * 120 + [20_000] * 20
    steps = fake_job(
        controller(batch_ms=500, initial=20_000),
        len(offered),
        lambda k: offered[k],
        lambda k, records: warm_cost(records),
    )
    busy_limit = steps[19].limit
    quiet, burst = steps[20:140], steps[140:]
    assert all(step.limit == busy_limit for step in quiet)  # it did not follow the quiet input
    assert burst[0].limit == busy_limit
    assert all(step.left == 0 for step in burst[2:]), [(s.limit, s.left) for s in burst]


# -- sources spend the budget ------------------------------------------------------------


def test_split_budget_follows_each_partitions_backlog():
    assert split_budget([300, 100], 200) == [150, 50]
    assert split_budget([5, 5, 5], 7) == [3, 2, 2]
    assert split_budget([10, 0], 50) == [10, 0]  # budget above backlog: everything
    assert split_budget([10, 20], None) == [10, 20]


@pytest.fixture
def ssc(sc):
    return StreamingContext(sc, BATCH_MS / 1000, clock=ManualClock())


def test_rate_source_admits_exactly_the_budget(ssc):
    source = RateInputDStream(ssc, records_per_second=10_000, partitions=4)
    planned = source.plan(1000, 1500)
    assert source.records_in(planned) == 1500 and source.held_back(planned, 1500)
    assert source.backlog(1000) == 10_000 - 1500
    rest = source.plan(2000, None)  # unlimited: all
    assert source.records_in(rest) == 20_000 - 1500 and not source.held_back(rest, None)
    within = source.plan(3000, 50_000)  # a budget above what arrived: all, nothing held back
    assert source.records_in(within) == 10_000 and not source.held_back(within, 50_000)


def test_file_source_admits_whole_files_up_to_the_budget(ssc, tmp_path):
    for name in "abc":
        (tmp_path / name).write_text(("y" * 99 + "\n") * 30)  # 3000 bytes: 30 records estimated
    source = FileInputDStream(ssc, str(tmp_path))
    first = source.plan(1000, 70)
    assert first["files"] == ["a", "b"] and source.records_in(first) == 60
    assert source.held_back(first, 70)  # under its budget, but file c did not fit
    assert source.backlog(1000) == 30
    second = source.plan(2000, 10)  # one file larger than the budget still goes, whole
    assert second["files"] == ["c"] and not source.held_back(second, 10)


def test_batches_overrunning_the_interval_at_the_floor_are_warned_about_once(caplog):
    slow = controller(initial=100)
    with caplog.at_level(logging.WARNING, logger="dstream.runtime.control.backpressure"):
        for batch in range(1, 8):
            slow.update(batch * BATCH_MS, 100, 2 * BATCH_MS, BATCH_MS, limited=True)
    assert slow.rate_limit == 100
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "fixed cost of a batch exceeds the interval" in warnings[0]


def test_an_overrun_above_the_floor_is_no_such_warning(caplog):
    busy = controller(initial=50_000)
    with caplog.at_level(logging.WARNING, logger="dstream.runtime.control.backpressure"):
        for batch in range(1, 4):
            busy.update(batch * BATCH_MS, 50_000, 2 * BATCH_MS, 0, limited=True)
    assert busy.rate_limit > 100
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
