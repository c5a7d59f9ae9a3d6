"""Judging a trial: did the output match the reference, and is the rate sustainable."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

INTERVAL_MS = 1000
GROWTH_LIMIT_MS = 250  # how much the scheduling delay may rise across the measured batches

# Verdict kinds; only "ok" passes.
OK, SLOW, WRONG, BUSY = "ok", "too slow", "wrong output", "machine busy"


@dataclass
class Verdict:
    kind: str
    reason: str
    processing_p50_ms: float
    processing_p90_ms: float
    delay_growth_ms: float
    batches: int

    @property
    def sustainable(self) -> bool:
        return self.kind == OK


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least q of the values at or below it."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def judge(
    processing_ms: list[float],
    scheduling_ms: list[float],
    expected: int,
    output_ok: bool,
    output_reason: str,
    interval_ms: int = INTERVAL_MS,
) -> Verdict:
    """A trial passes when its sampled outputs match the reference (a trial that completed no
    batch at all is too slow, not wrong), all `expected` measured
    batches completed, 90% of them processed within the interval, and the scheduling delay did
    not grow (mean of the last third minus the first third at most GROWTH_LIMIT_MS)."""
    n = len(processing_ms)
    p50 = statistics.median(processing_ms) if n else 0.0
    p90 = percentile(processing_ms, 0.9) if n else 0.0
    third = max(1, n // 3)
    growth = (
        statistics.mean(scheduling_ms[-third:]) - statistics.mean(scheduling_ms[:third])
        if n
        else 0.0
    )

    def verdict(kind: str, reason: str) -> Verdict:
        return Verdict(kind, reason, p50, p90, growth, n)

    if n == 0:
        return verdict(SLOW, "no measured batch completed in time")
    if not output_ok:
        return verdict(WRONG, output_reason)
    if n < expected:
        return verdict(SLOW, f"only {n}/{expected} batches completed in time")
    if p90 >= interval_ms:
        return verdict(SLOW, f"processing p90 {p90:.0f} ms >= interval")
    if growth > GROWTH_LIMIT_MS:
        return verdict(SLOW, f"scheduling delay grew {growth:.0f} ms")
    return verdict(OK, "ok")
