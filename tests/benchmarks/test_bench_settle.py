"""What `python -m bench.backpressure.settle` concludes from a run's batches and latency
histogram (the runs themselves take minutes of `dstream run` each: the benchmark measures them)."""

from __future__ import annotations

import math

import pytest

from bench.backpressure.settle import (
    STEADY_BATCHES,
    Batch,
    batches_of,
    histogram,
    quantile,
    time_to_steady,
)


def batch(t_s: float, p99_s: float | None) -> Batch:
    return Batch(t_s, 100, 1000.0, 0.2, p99_s)


def test_steady_from_the_first_batch_that_begins_a_steady_run():
    slow = [batch(0.5 * k, 9.0) for k in range(6)]
    blip = [batch(3.0 + 0.5 * k, 1.0) for k in range(4)] + [batch(5.0, 4.0)]
    steady = [batch(5.5 + 0.5 * k, 1.0) for k in range(STEADY_BATCHES)]
    assert time_to_steady(slow + blip + steady, 0.0, 2.0) == pytest.approx(5.5)
    assert time_to_steady(slow + blip + steady, 1.0, 2.0) == pytest.approx(4.5)  # from a burst
    assert time_to_steady(slow + blip, 0.0, 2.0) is None  # no run long enough came


def test_batches_without_records_count_as_steady():
    empty = [batch(0.5 * k, None) for k in range(STEADY_BATCHES)]
    assert time_to_steady(empty, 0.0, 2.0) == 0.0


def test_api_rows_are_timed_from_the_reference_and_sorted():
    rows = [
        {
            "time": f"2026-12-06T10:00:0{s}+00:00",
            "records": 10,
            "rateLimit": {"kafka": 500.0},
            "processingSeconds": 0.1,
            "latencyP99Seconds": 0.7,
        }
        for s in (2, 1)
    ]
    reference = 1796551200.0  # 2026-12-06T10:00:00Z
    assert [b.t_s for b in batches_of(rows, reference)] == [1.0, 2.0]
    assert batches_of(rows, reference)[0].limit == 500.0


METRICS = """\
# TYPE dstream_end_to_end_latency_seconds histogram
dstream_end_to_end_latency_seconds_bucket{job="j",le="1.0"} 90.0
dstream_end_to_end_latency_seconds_bucket{job="j",le="2.0"} 99.0
dstream_end_to_end_latency_seconds_bucket{job="j",le="30.0"} 100.0
dstream_end_to_end_latency_seconds_bucket{job="j",le="+Inf"} 100.0
dstream_end_to_end_latency_seconds_count{job="j"} 100.0
dstream_end_to_end_latency_seconds_sum{job="j"} 80.0
"""


def test_quantiles_are_interpolated_within_the_histograms_buckets():
    counted = histogram(METRICS)
    assert counted == {1.0: 90.0, 2.0: 99.0, 30.0: 100.0, math.inf: 100.0}
    assert quantile(counted, {}, 0.5) == pytest.approx(0.5 / 0.9)
    assert quantile(counted, {}, 0.99) == pytest.approx(2.0)
    earlier = {1.0: 90.0, 2.0: 90.0, 30.0: 90.0, math.inf: 90.0}  # what came before the window
    assert quantile(counted, earlier, 0.5) == pytest.approx(1.0 + 0.5 / 0.9)
    assert quantile(counted, counted, 0.5) is None  # nothing counted in between


def test_a_quantile_above_the_last_bound_is_infinite():
    late = {1.0: 0.0, 30.0: 10.0, math.inf: 100.0}
    assert quantile(late, {}, 0.99) == math.inf
