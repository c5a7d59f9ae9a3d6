"""Backpressure units: Spark's PID rate estimator rule by rule, the bound on one step, the rate
controller with fake times, and how sources spend a record budget."""

from __future__ import annotations

import logging
import math

import pytest
from dstream.context import StreamingContext
from dstream.runtime.control.backpressure import PIDRateEstimator, RateController
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
    """A controller past its unmeasured first batch (see the warm-up test)."""
    fresh = RateController(PIDRateEstimator(batch_ms), initial_rate=initial, max_rate=cap)
    fresh.update(0, 10, 60_000, 0)  # a minute of start-up for 10 records: not measured
    return fresh


def test_the_first_batch_with_records_is_not_measured():
    fresh = RateController(PIDRateEstimator(BATCH_MS), initial_rate=20_000)
    fresh.update(500, 0, 100, 0)  # no records: nothing to learn, still warming up
    fresh.update(1000, 200, 8000, 0)  # 25/s, because the Python workers were starting
    assert fresh.rate_limit == 20_000 and not fresh.estimator.primed
    fresh.update(2000, 20_000, 2000, 0)  # the first measured batch: 10,000/s
    assert fresh.rate_limit == pytest.approx(10_000)


def test_without_initial_rate_the_first_batches_are_unlimited():
    limited = controller()
    assert limited.rate_limit is None and limited.max_records() is None
    limited.update(1000, 5000, 1000, 0)  # the first valid update only records
    assert limited.max_records() is None
    limited.update(2000, 4000, 1000, 0)
    assert limited.rate_limit == pytest.approx(4000)


def test_initial_rate_limits_until_the_estimator_speaks():
    limited = controller(initial=1000)
    assert limited.rate_limit == 1000 and limited.max_records() == 1000
    limited.update(1000, 1000, 200, 0)  # processing 5000/s: recorded, not yet applied
    assert limited.rate_limit == 1000
    limited.update(2000, 1000, 200, 0)
    assert limited.rate_limit == pytest.approx(5000)


def test_an_initial_rate_above_the_first_measurement_comes_down_to_it_at_once():
    limited = controller(initial=50_000)
    limited.update(1000, 50_000, 10_000, 0)  # processing 5000/s, ten times below the limit
    assert limited.rate_limit == pytest.approx(5000)
    limited.update(2000, 5000, 1000, 0)  # then Spark's law, from that measurement
    assert limited.rate_limit == pytest.approx(5000)


def test_budget_is_rate_times_batch_interval():
    assert controller(batch_ms=500, initial=3000).max_records() == 1500
    assert controller(batch_ms=2000, initial=3000).max_records() == 6000
    assert controller(batch_ms=100, initial=5).max_records() == 1  # never a zero budget


def test_max_rate_caps_initial_rate_and_estimates():
    capped = controller(initial=50_000, cap=2000)
    assert capped.rate_limit == 2000 and capped.max_records() == 2000
    capped.update(1000, 10_000, 1000, 0)
    capped.update(2000, 10_000, 1000, 0)  # estimate 10000/s
    assert capped.rate_limit == 2000
    assert controller(cap=700).rate_limit == 700  # unlimited becomes the cap


def test_estimates_below_the_cap_pass():
    capped = controller(cap=2000)
    capped.update(1000, 1000, 1000, 0)
    capped.update(2000, 1000, 1000, 0)
    assert capped.rate_limit == pytest.approx(1000)


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
    assert source.records_in(planned) == 1500
    assert source.backlog(1000) == 10_000 - 1500
    assert source.records_in(source.plan(2000, None)) == 20_000 - 1500  # unlimited: all


def test_file_source_admits_whole_files_up_to_the_budget(ssc, tmp_path):
    for name in "abc":
        (tmp_path / name).write_text(("y" * 99 + "\n") * 30)  # 3000 bytes: 30 records estimated
    source = FileInputDStream(ssc, str(tmp_path))
    first = source.plan(1000, 70)
    assert first["files"] == ["a", "b"] and source.records_in(first) == 60
    assert source.backlog(1000) == 30
    second = source.plan(2000, 10)  # one file larger than the budget still goes, whole
    assert second["files"] == ["c"]


def test_batches_overrunning_the_interval_at_the_floor_are_warned_about_once(caplog):
    slow = controller(initial=100)
    with caplog.at_level(logging.WARNING, logger="dstream.runtime.control.backpressure"):
        for batch in range(1, 8):
            slow.update(batch * BATCH_MS, 100, 2 * BATCH_MS, BATCH_MS)
    assert slow.rate_limit == 100
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "fixed cost of a batch exceeds the interval" in warnings[0]


def test_an_overrun_above_the_floor_is_no_such_warning(caplog):
    busy = controller(initial=50_000)
    with caplog.at_level(logging.WARNING, logger="dstream.runtime.control.backpressure"):
        for batch in range(1, 4):
            busy.update(batch * BATCH_MS, 50_000, 2 * BATCH_MS, 0)
    assert busy.rate_limit > 100
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
