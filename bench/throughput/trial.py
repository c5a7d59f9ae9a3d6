"""Judging a trial: did the output match the reference, and is the rate sustainable."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from dstream.runtime.control.latency import LATENCY_BUCKETS_S

INTERVAL_MS = 1000
GROWTH_LIMIT_MS = 250  # how much the scheduling delay may rise across the measured batches
# The D-Stream paper's targets: p99 end-to-end latency under 1 s with 500 ms batches, 2 s with 1 s.
LATENCY_TARGET_INTERVALS = 2
WITHIN_TARGET = 0.99  # the share of a trial's records that must make the target: its p99


def latency_target_ms(interval_ms: int) -> int:
    """The p99 a trial's records must make: LATENCY_TARGET_INTERVALS batch intervals."""
    return LATENCY_TARGET_INTERVALS * interval_ms


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
    latency_p99_ms: float | None = None  # the worst batch's
    within_target: float | None = None  # the share of the records within the latency target

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


def share_within(buckets: list[list[int] | None], target_ms: int) -> float | None:
    """The share of the records of all these batches whose latency was at most target_ms,
    from their counts per LATENCY_BUCKETS_S bucket (the target is a bucket bound); None when
    a batch's latency is unknown or there were no records."""
    known = [b for b in buckets if b is not None]
    if not known or len(known) < len(buckets):
        return None
    bound = LATENCY_BUCKETS_S.index(target_ms / 1000)
    total = sum(sum(b) for b in known)
    return sum(sum(b[: bound + 1]) for b in known) / total if total else None


def judge(
    processing_ms: list[float],
    scheduling_ms: list[float],
    expected: int,
    output_ok: bool,
    output_reason: str,
    interval_ms: int = INTERVAL_MS,
    latency_p99_ms: list[float | None] | None = None,
    latency_buckets: list[list[int] | None] | None = None,
) -> Verdict:
    """A trial passes when its sampled outputs match the reference (a trial that completed no
    batch at all is too slow, not wrong), all `expected` measured
    batches completed, 90% of them processed within the interval, the scheduling delay did
    not grow (mean of the last third minus the first third at most GROWTH_LIMIT_MS), and, when
    the batches' latencies are given, the p99 over all their records is within the latency
    target (LATENCY_TARGET_INTERVALS intervals): at least WITHIN_TARGET of the records made it.
    A batch without a measured latency fails it."""
    n = len(processing_ms)
    p50 = statistics.median(processing_ms) if n else 0.0
    p90 = percentile(processing_ms, 0.9) if n else 0.0
    third = max(1, n // 3)
    growth = (
        statistics.mean(scheduling_ms[-third:]) - statistics.mean(scheduling_ms[:third])
        if n
        else 0.0
    )
    known = [v for v in latency_p99_ms or [] if v is not None]
    p99 = max(known) if known else None
    target = latency_target_ms(interval_ms)
    within = share_within(latency_buckets or [], target)

    def verdict(kind: str, reason: str) -> Verdict:
        return Verdict(kind, reason, p50, p90, growth, n, p99, within)

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
    if latency_buckets is not None:
        measured = sum(b is not None for b in latency_buckets)
        if within is None:
            return verdict(SLOW, f"latency measured for {measured}/{n} batches")
        if within < WITHIN_TARGET:
            return verdict(
                SLOW, f"latency p99 over {target} ms: {within:.2%} of the records within it"
            )
    return verdict(OK, "ok")


def measured_latency(batches: list[dict[str, Any]], target_ms: int) -> dict[str, Any]:
    """The trial's end-to-end latency from each batch's measured distribution over its records:
    the median of the batches' medians, the worst batch's p99 (an upper bound of the p99 over
    all the trial's records: every batch has at least 99% of its records within it), and the
    share of all its records within the target (at least 99%: the p99 over them made it). {}
    for batches that carry none."""
    p50s = [b["latency_p50_ms"] for b in batches if b.get("latency_p50_ms") is not None]
    p99s = [b["latency_p99_ms"] for b in batches if b.get("latency_p99_ms") is not None]
    if not p50s:
        return {}
    within = share_within([b.get("latency_buckets") for b in batches], target_ms)
    return {
        "latency_p50_ms": round(percentile(p50s, 0.5)),
        "latency_p99_ms": round(max(p99s)),
        "latency_measured": True,  # rows of earlier runs hold a modelled latency
        **({} if within is None else {"latency_target_ms": target_ms, "within_target": within}),
    }
