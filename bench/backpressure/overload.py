"""What an overload-step run decides, kept free of Spark so that it is unit-tested on its own:
the offered rate's schedule, the cost model a calibration fits, when the scheduling delay
settled after the step, and whether a system's output equals the counts of what it admitted.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass


class RateSchedule:
    """A piecewise-constant offered rate: records arrive at `rate` from each change on.

    Both systems' sources read it: dstream's rate source asks how many records had arrived by
    a batch time, the socket server how many it should have sent by now. Changes may be added
    while a run goes on (thread-safe), each at a later time than the last.
    """

    def __init__(self, start_s: float, rate: float):
        self._changes: list[tuple[float, float]] = [(start_s, rate)]
        self._lock = threading.Lock()

    def set(self, at_s: float, rate: float) -> None:
        with self._lock:
            if at_s < self._changes[-1][0]:
                raise ValueError(f"a change at {at_s} comes before the last one")
            self._changes.append((at_s, rate))

    @property
    def start_s(self) -> float:
        return self._changes[0][0]

    def rate_at(self, t_s: float) -> float:
        with self._lock:
            changes = list(self._changes)
        current = 0.0
        for at_s, rate in changes:
            if at_s <= t_s:
                current = rate
        return current

    def total(self, t_s: float) -> int:
        """Records arrived by time t_s (0 before the start)."""
        with self._lock:
            changes = list(self._changes)
        ends = [at_s for at_s, _rate in changes[1:]] + [math.inf]
        arrived = 0.0
        for (at_s, rate), end_s in zip(changes, ends, strict=True):
            arrived += rate * max(0.0, min(t_s, end_s) - at_s)
        return int(arrived)


@dataclass(frozen=True)
class CostModel:
    """A batch's processing time = fixed_s + per_record_s * records, fitted by least squares."""

    fixed_s: float
    per_record_s: float

    def sustainable(self, interval_s: float) -> float:
        """Records per second at which a batch takes exactly one interval."""
        return (interval_s - self.fixed_s) / self.per_record_s / interval_s


def fit_cost(samples: list[tuple[int, float]]) -> CostModel:
    """Least-squares line through (records, processing seconds) of calibration batches."""
    if len({records for records, _ in samples}) < 2:
        raise ValueError("calibration needs batches of at least two different sizes")
    n = len(samples)
    mean_x = sum(x for x, _ in samples) / n
    mean_y = sum(y for _, y in samples) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in samples)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in samples)
    slope = sxy / sxx
    if slope <= 0:
        raise ValueError(f"larger batches were not slower (slope {slope:.3g} s/record)")
    return CostModel(mean_y - slope * mean_x, slope)


def settle_time(
    delays: list[tuple[float, float]], step_s: float, limit_s: float, min_tail: int
) -> float | None:
    """Seconds from the step to the first batch from which every scheduling delay stays under
    `limit_s`, given (batch time, scheduling delay) of every batch due by the end of the run
    (a batch not started by then counts with the delay it had reached). None when no such run
    of at least `min_tail` batches ends the run: the end of a run proves nothing about batches
    it did not reach."""
    after = sorted((t, d) for t, d in delays if t >= step_s)
    tail = 0
    for _t, delay in reversed(after):
        if delay >= limit_s:
            break
        tail += 1
    if tail < min_tail:
        return None
    return after[len(after) - tail][0] - step_s


def pending_delays(
    covered: set[int], first_ms: int, stopped_s: float, interval_s: float
) -> list[tuple[float, float]]:
    """(batch time, delay reached) for every batch time on the grid from `first_ms` that was
    due when the run stopped but never started (nor was merged into one that did): its delay
    was at least the time it had waited by then."""
    step_ms = round(interval_s * 1000)
    last_ms = math.floor(stopped_s * 1000)
    return [
        (t / 1000, stopped_s - t / 1000)
        for t in range(first_ms, last_ms + 1, step_ms)
        if t not in covered
    ]


def output_problems(
    outputs: Mapping[int, Counter[str]],
    admitted: Mapping[int, int],
    expected: Counter[str],
    handed_out: int,
    all_completed: bool,
) -> list[str]:
    """What is wrong with a run's output (empty: nothing). `admitted` maps each completed batch
    to the records it admitted, `outputs` each batch to the word counts it emitted, `expected`
    holds the word counts of exactly the records the completed batches admitted, read from
    the source, and `handed_out` is how many records the source gave the system: all of them
    were processed when the system stopped after its running batch (`all_completed`), else
    the batches admitted at most that many."""
    problems = [f"batch {t} completed without output" for t in sorted(admitted) if t not in outputs]
    total_admitted = sum(admitted.values())
    if all_completed and total_admitted != handed_out:
        problems.append(
            f"batches admitted {total_admitted} records, the source handed out {handed_out}"
        )
    if total_admitted > handed_out:
        problems.append(f"batches admitted {total_admitted} records, only {handed_out} were sent")
    emitted: Counter[str] = Counter()
    for t in admitted:
        emitted.update(outputs.get(t, Counter()))
    lost, extra = expected - emitted, emitted - expected
    if lost:
        problems.append(f"{sum(lost.values())} words of admitted records missing from the output")
    if extra:
        problems.append(f"{sum(extra.values())} words in the output beyond the admitted records")
    return problems
