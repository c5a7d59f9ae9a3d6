"""Judging a trial: is a rate sustainable, and what end-to-end latency did its records see."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.systems import Batch

INTERVAL_MS = 1000
GROWTH_LIMIT_MS = 250  # how much the scheduling delay may rise across the measured batches


@dataclass
class Verdict:
    sustainable: bool
    reason: str
    processing_p50_ms: float
    processing_p90_ms: float
    delay_growth_ms: float


def judge(batches: list[Batch], expected: int) -> Verdict:
    """Sustainable: all `expected` batches completed, 90% of them within the interval, and the
    scheduling delay did not grow (mean of the last third vs the first third)."""
    if not batches:
        return Verdict(False, "no batch completed", 0.0, 0.0, 0.0)
    processing = sorted(b.processing_ms for b in batches)
    p50 = statistics.median(processing)
    p90 = processing[min(len(processing) - 1, int(0.9 * len(processing)))]
    third = max(1, len(batches) // 3)
    first = statistics.mean(b.scheduling_ms for b in batches[:third])
    last = statistics.mean(b.scheduling_ms for b in batches[-third:])
    growth = last - first
    if len(batches) < expected:
        reason = f"only {len(batches)}/{expected} batches completed in time"
    elif p90 >= INTERVAL_MS:
        reason = f"processing p90 {p90:.0f} ms >= interval"
    elif growth > GROWTH_LIMIT_MS:
        reason = f"scheduling delay grew {growth:.0f} ms"
    else:
        return Verdict(True, "ok", p50, p90, growth)
    return Verdict(False, reason, p50, p90, growth)


def record_latencies(batches: list[Batch], points: int = 200) -> list[float]:
    """End-to-end latency of records, in ms, sampled evenly per batch: a batch due at T holds
    records that arrived uniformly over (T - interval, T] and are all output at the batch's end."""
    latencies: list[float] = []
    for batch in batches:
        newest = batch.end_ms - batch.time_ms
        latencies += [newest + INTERVAL_MS * (i + 0.5) / points for i in range(points)]
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
