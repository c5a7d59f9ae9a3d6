"""Overload with the real engine on the wall clock: a rate source offers far more than local[2]
processes. With backpressure the admitted rate converges and batches stop queueing; without it
the scheduling delay grows batch after batch. Assertions are on trends, never on absolute speed:
the offered load of the run without backpressure is derived from what the run with it achieved.
"""

from __future__ import annotations

import math
import operator
import statistics
import time
from dataclasses import dataclass

import pytest
from dstream import StreamingContext
from dstream.rate import PIDRateEstimator, RateController
from dstream.scheduler import BatchInfo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

INITIAL_RATE = 5000
# Far beyond what local[2] counts words at; with backpressure only the budget is ever read.
OFFERED_WITH_BACKPRESSURE = 5_000_000
OVERLOAD_FACTOR = 3
MAX_BATCHES = 45
TAIL = 10  # the batches that define the converged rate
STEADY = 0.8  # the share of batches after convergence that must stay in the band
OVERHEAD_MARGIN = 3
MAX_BATCH_S = 4
WARM_UP_JOBS = 3  # the first jobs of a fresh JVM and Python workers are slow


def words(line: str) -> list[tuple[str, int]]:
    return [(word, 1) for word in line.split()]


def count_words(rdd) -> int:
    return rdd.flatMap(words).reduceByKey(operator.add, 2).count()


def batch_interval_for_this_machine(sc) -> float:
    """Whole seconds, OVERHEAD_MARGIN times the cost of an almost empty batch (at least 1 s, at
    most MAX_BATCH_S): on a machine so loaded that a batch's fixed cost fills the interval, no
    rate keeps up, and the test would measure the machine instead of the controller."""
    tiny = sc.parallelize(["a b", "b c"], 2)
    costs = []
    for _ in range(WARM_UP_JOBS + 3):
        started = time.monotonic()
        count_words(tiny)
        costs.append(time.monotonic() - started)
    fixed_cost = min(costs[WARM_UP_JOBS:])
    return float(min(MAX_BATCH_S, max(1, math.ceil(OVERHEAD_MARGIN * fixed_cost))))


def run_overload(
    sc, monkeypatch, batch_s: float, offered: int, backpressure: bool, budget_s: float
) -> list[BatchInfo]:
    """Word counts over a rate source on the wall clock; the completed batches, oldest first."""
    ssc = StreamingContext(sc, batch_s)
    source = ssc.rateStream(offered, partitions=2, seed=7)
    source.foreachRDD(count_words)
    if backpressure:
        # The session SparkContext has backpressure off in its conf; give this context the
        # controllers its conf would build (Spark's defaults) without touching the shared conf.
        estimator = PIDRateEstimator(round(batch_s * 1000))
        controllers = {source.name: RateController(estimator, initial_rate=INITIAL_RATE)}
        monkeypatch.setattr(ssc, "_rate_controllers", lambda: controllers)
    ssc.start()
    deadline = time.monotonic() + budget_s
    try:
        while len(ssc._scheduler.history) < MAX_BATCHES and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    return list(ssc._scheduler.history)


@dataclass
class Convergence:
    index: int  # the first batch from which the rate limit stays (mostly) in the band
    rate: float  # median rate limit of the last TAIL batches
    seconds: float  # from the first batch to convergence


def convergence(batches: list[BatchInfo], source: str = "rate") -> Convergence | None:
    """The first batch inside a factor-3 band around the tail's median rate limit from which at
    least STEADY of the limits stay inside: the estimate follows measured processing rates, and
    on a shared machine a single batch can be measured far off without the loop diverging."""
    limits = [b.rate_limits[source] for b in batches]
    rate = statistics.median(limits[-TAIL:])
    inside = [rate / 3 <= limit <= rate * 3 for limit in limits]
    index = next(
        (
            i
            for i in range(len(inside))
            if inside[i] and sum(inside[i:]) >= STEADY * (len(inside) - i)
        ),
        None,
    )
    if index is None:
        return None
    seconds = (batches[index].batch_time_ms - batches[0].batch_time_ms) / 1000
    return Convergence(index, rate, seconds)


def delays_s(batches: list[BatchInfo]) -> list[float]:
    return [b.schedulingDelay() / 1000 for b in batches]


def timeline(batches: list[BatchInfo]) -> str:
    """Per batch: rate limit, records, processing and scheduling delay (for failure messages)."""
    return "\n".join(
        f"  limit {b.rate_limits.get('rate') or 0:>9,.0f}/s  records {b.numRecords():>9,}  "
        f"processing {b.processingDelay() / 1000:6.2f} s  delay {b.schedulingDelay() / 1000:6.2f} s"
        for b in batches
    )


def test_backpressure_converges_and_without_it_delay_grows(sc, monkeypatch):
    batch_s = batch_interval_for_this_machine(sc)
    limited = run_overload(
        sc, monkeypatch, batch_s, OFFERED_WITH_BACKPRESSURE, True, (MAX_BATCHES + 15) * batch_s
    )
    assert len(limited) >= 2 * TAIL, f"only {len(limited)} batches completed"
    converged = convergence(limited)
    assert converged is not None, "the rate limit never settled:\n" + timeline(limited)
    after = limited[converged.index :]
    assert len(after) >= TAIL, f"converged only at batch {converged.index}:\n" + timeline(limited)
    settled = delays_s(after)
    admitted = statistics.median(b.numRecords() for b in after) / batch_s

    offered = max(INITIAL_RATE, round(OVERLOAD_FACTOR * converged.rate))
    unlimited = run_overload(sc, monkeypatch, batch_s, offered, False, 25 * batch_s)
    growing = delays_s(unlimited)
    slope = statistics.linear_regression(range(len(growing)), growing).slope

    print(
        f"\nbatch interval {batch_s:.0f} s"
        f"\nwith backpressure: offered {OFFERED_WITH_BACKPRESSURE:,}/s, rate limit converged to "
        f"{converged.rate:,.0f}/s (admitted {admitted:,.0f}/s) after {converged.seconds:.0f} s "
        f"(batch {converged.index}); scheduling delay after convergence: median "
        f"{statistics.median(settled):.2f} s, max {max(settled):.2f} s, last {settled[-1]:.2f} s "
        f"over {len(after)} batches"
        f"\nwithout backpressure: offered {offered:,}/s; scheduling delay "
        f"{growing[0]:.2f} s -> {growing[-1]:.2f} s over {len(unlimited)} batches "
        f"(+{slope:.2f} s per batch)"
    )
    # With backpressure: it limits (far below the offer), and batches do not queue up.
    assert converged.rate < OFFERED_WITH_BACKPRESSURE / 10, timeline(limited)
    assert statistics.median(settled) <= 2 * batch_s, timeline(limited)
    assert sum(d <= 2 * batch_s for d in settled) >= STEADY * len(settled), timeline(limited)
    # Without: each batch waits longer than the one before.
    assert len(unlimited) >= 4, f"only {len(unlimited)} batches completed without backpressure"
    assert slope >= 0.5 * batch_s, timeline(unlimited)
    assert growing[-1] > growing[0] + 2 * batch_s, timeline(unlimited)
    assert growing[-1] > 2 * max(statistics.median(settled), batch_s)
