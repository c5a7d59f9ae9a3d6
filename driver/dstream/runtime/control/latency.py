"""End-to-end latency per record: from when a record became available at its source to when its
batch's output committed.

A batch's records are described by their *ages* at its batch time (batch time minus the time each
record became available), counted per age bin: `Ages`. The driver knows when the batch committed,
so each record's latency is (commit time - batch time) + its age, and a batch's distribution
follows from its Ages without a timestamp per record ever reaching the driver. Where the ages
come from is the source's business (`InputDStream.record_ages`):

- derived on the driver from the recorded range, when availability is a function of the offset
  (the rate source: no per-record work at all);
- counted by the tasks that read the range (files: one arrival time per file; Redis: each entry
  ID's milliseconds; NATS: each message's stored timestamp), reported through an accumulator
  keyed by (batch time, slice). Spark applies an accumulator update from a transformation once
  per task *run*: a retried task, a recomputed stage or a second output operation reading the
  same input would count its records again. Each report is the whole slice's Ages under the
  slice's key and merging keeps one report per key, so any number of reads counts a slice once.
  A task reports only after it read its slice to the end; a slice that no output read completely
  (`take`, `first`) is not in its batch's distribution.

Bins are exact to the millisecond below 1 s of age and keep 3 significant digits above (a bin
holds ages from its value up to 1% more), so a catch-up batch of hours of backlog has at most a
few thousand bins and the percentiles are at most 1% of the age low.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark import Accumulator
from pyspark.accumulators import AccumulatorParam

T = TypeVar("T")

# Prometheus buckets of dstream_end_to_end_latency_seconds: fine around the paper's targets of
# 1 s (500 ms batches) and 2 s (1 s batches), up to 30 s.
LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0)
EXACT_BELOW_MS = 1000
SIGNIFICANT_DIGITS = 3

Ages = dict[int, int]  # age bin (ms before the batch time; negative: after it) -> records
SliceKey = tuple[Any, ...]  # (batch time ms, what names the slice: its index, its file range)


def age_bin(age_ms: int) -> int:
    """The bin of an age: itself below EXACT_BELOW_MS, else cut to SIGNIFICANT_DIGITS digits
    (towards zero)."""
    magnitude = abs(age_ms)
    if magnitude < EXACT_BELOW_MS:
        return age_ms
    step = 10 ** (len(str(magnitude)) - SIGNIFICANT_DIGITS)
    binned = magnitude - magnitude % step
    return binned if age_ms > 0 else -binned


def next_bin(bin_ms: int) -> int:
    """The first age of the bin after `bin_ms` (a bin of a non-negative age)."""
    if bin_ms < EXACT_BELOW_MS:
        return bin_ms + 1
    return bin_ms + 10 ** (len(str(bin_ms)) - SIGNIFICANT_DIGITS)


def add_age(ages: Ages, age_ms: int, records: int = 1) -> None:
    bin_ms = age_bin(age_ms)
    ages[bin_ms] = ages.get(bin_ms, 0) + records


def ages_at(batch_ms: int, available_ms: Iterable[int]) -> Ages:
    """The Ages of records that became available at these times (one time per record)."""
    ages: Ages = {}
    for time_ms in available_ms:
        add_age(ages, batch_ms - time_ms)
    return ages


def merged(parts: Iterable[Ages | None]) -> Ages:
    total: Ages = {}
    for part in parts:
        for bin_ms, records in (part or {}).items():
            total[bin_ms] = total.get(bin_ms, 0) + records
    return total


def first_time_reaching(
    count_by: Callable[[int], int], count: int, lo_ms: int, hint_ms: int
) -> int:
    """The first millisecond at or after lo_ms at which `count_by` (a count that never falls)
    reaches `count`, searched from hint_ms outwards: a time the records are known to exist by."""
    hi_ms = max(lo_ms, hint_ms)
    step = max(1, hi_ms - lo_ms)
    while count_by(hi_ms) < count:
        lo_ms, hi_ms, step = hi_ms + 1, hi_ms + step, step * 2
    while lo_ms < hi_ms:
        middle = (lo_ms + hi_ms) // 2
        if count_by(middle) >= count:
            hi_ms = middle
        else:
            lo_ms = middle + 1
    return lo_ms


def ages_of_schedule(
    batch_ms: int, first_ms: int, last_ms: int, available_by: Callable[[int], int]
) -> Ages:
    """The Ages of records whose availability is known as a count, without visiting a record:
    `available_by(t)` is how many of them were available at or before t, all of them between
    first_ms and last_ms. One call per bin. A record that became available after the batch
    time (a batch planned late, under coalescing, takes what arrived until then) counts as
    age 0: its latency is overstated by at most that wait, never understated."""
    ages: Ages = {}
    bin_ms = age_bin(max(0, batch_ms - last_ms))
    oldest = max(0, batch_ms - first_ms)
    newer = available_by(max(batch_ms - bin_ms, last_ms))
    while bin_ms <= oldest:
        upper = next_bin(bin_ms)
        older = available_by(batch_ms - upper)
        if newer > older:
            ages[bin_ms] = newer - older
        bin_ms, newer = upper, older
    return ages


@dataclass(frozen=True)
class BatchLatency:
    """A committed batch's end-to-end latency over the records whose availability is known."""

    records: int
    p50_s: float
    p99_s: float
    sum_s: float
    buckets: tuple[int, ...]  # records per LATENCY_BUCKETS_S bucket, then above the last

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "p50Seconds": self.p50_s, "p99Seconds": self.p99_s}


def summarize(ages: Ages, commit_delay_ms: int) -> BatchLatency | None:
    """The batch's latency distribution, committed commit_delay_ms after its batch time;
    percentiles by nearest rank. None when no record's availability is known."""
    total = sum(ages.values())
    if not total:
        return None
    buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
    ranks = {q: max(1, math.ceil(q * total)) for q in (0.5, 0.99)}
    found: dict[float, float] = {}
    seen, sum_s = 0, 0.0
    for bin_ms, records in sorted(ages.items()):
        latency_s = (commit_delay_ms + bin_ms) / 1000
        seen += records
        sum_s += latency_s * records
        buckets[_bucket(latency_s)] += records
        for q, rank in ranks.items():
            if q not in found and seen >= rank:
                found[q] = latency_s
    return BatchLatency(total, found[0.5], found[0.99], sum_s, tuple(buckets))


def _bucket(latency_s: float) -> int:
    for index, bound in enumerate(LATENCY_BUCKETS_S):
        if latency_s <= bound:
            return index
    return len(LATENCY_BUCKETS_S)


class SliceReports(AccumulatorParam):
    """An accumulator of {(batch time, slice): Ages}; a key reported again replaces its equal
    report, so a slice read more than once counts once."""

    def zero(self, value: dict[SliceKey, Ages]) -> dict[SliceKey, Ages]:
        return {}

    def addInPlace(
        self, held: dict[SliceKey, Ages], update: dict[SliceKey, Ages]
    ) -> dict[SliceKey, Ages]:
        held.update(update)
        return held


def slice_reports(sc: Any) -> Accumulator[dict[SliceKey, Ages]]:
    """A source's accumulator for the Ages its tasks count."""
    return sc.accumulator({}, SliceReports())


def reported_ages(reports: Accumulator[dict[SliceKey, Ages]], batch_ms: int) -> Ages | None:
    """The Ages the tasks reported for the batch at batch_ms, taken out of the accumulator with
    the reports of earlier batches (a later batch re-reading an old slice, a window recomputing
    its input); None when no slice reported."""
    held = reports.value
    keys = [key for key in list(held) if key[0] <= batch_ms]
    parts = [(key, held.pop(key, None)) for key in keys]
    mine = [ages for key, ages in parts if key[0] == batch_ms]
    return merged(mine) if mine else None


def reporting(
    records: Iterable[T],
    reports: Accumulator[dict[SliceKey, Ages]],
    key: SliceKey,
    ages: Ages,
) -> Iterator[T]:
    """The records, then `ages` (which reading them filled in) reported under the slice's key
    once all were read: the task-side half of a source whose tasks count ages."""
    yield from records
    reports.add({key: ages})
