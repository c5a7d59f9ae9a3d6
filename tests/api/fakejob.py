"""A deterministic JobView for testing the HTTP layer without Spark.

Batches are real BatchInfo objects (so the status and batch mapping is the production code's);
stream contents are Python lists per batch time, and a slice runs view.py's own selection and
answer over them, through `ListRDD`, a stand-in for the few RDD methods that answer uses.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from dstream.runtime.checkpoint.recovery import RECOVERY_KINDS
from dstream.runtime.control import latency
from dstream.runtime.scheduling.batch import BatchInfo
from dstream.service.job_view import (
    answer_slice,
    batch_of,
    empty_slice,
    last_batch_of,
    retained_bounds,
    slice_times,
    utc,
)
from dstream_api.models import Batch, SliceResult, Status, StreamSummary
from dstream_api.view import QueryFailedError, SliceQuery, UnknownStreamError
from prometheus_client import CollectorRegistry, Counter

JOB = "fake"
ZERO_MS = 1_700_000_000_000
BATCH_MS = 1000


def batch_info(n: int) -> BatchInfo:
    """The n-th batch (1-based): n*100 records, 50 ms of scheduling delay, 200 ms processing."""
    time_ms = ZERO_MS + n * BATCH_MS
    info = BatchInfo(time_ms, time_ms, {"rate": n * 100}, {"rate": 5000.0})
    info.processing_start_ms = time_ms + 50
    info.processing_end_ms = time_ms + 250
    info.checkpoint_seconds = 0.004
    info.latency = latency.summarize({100: 1, 400: n}, commit_delay_ms=250)
    return info


def stream_contents(batches: int) -> dict[str, dict[int, list[Any]]]:
    """`counts` holds (word, count) pairs per batch; `lines` holds plain text records."""
    counts = {
        ZERO_MS + n * BATCH_MS: [("a", n), ("b", 2 * n), (("t", n), 1)]
        for n in range(1, batches + 1)
    }
    lines = {
        ZERO_MS + n * BATCH_MS: [f"line {n}.{i}" for i in range(3)] for n in range(1, batches + 1)
    }
    return {"counts": counts, "lines": lines, "broken": dict.fromkeys(counts, [("x", 1)])}


class ListRDD:
    """The RDD methods a slice's answer calls, over a list in one partition, with PySpark's
    results: reduceByKey keeps keys in first-seen order, takeOrdered is a stable sort."""

    def __init__(self, records: list[Any]):
        self.records = records

    def count(self) -> int:
        return len(self.records)

    def take(self, num: int) -> list[Any]:
        return self.records[:num]

    def filter(self, keep: Callable[[Any], bool]) -> ListRDD:
        return ListRDD([record for record in self.records if keep(record)])

    def reduceByKey(self, func: Callable[[Any, Any], Any]) -> ListRDD:
        reduced: dict[Any, Any] = {}
        for key, value in self.records:
            reduced[key] = func(reduced[key], value) if key in reduced else value
        return ListRDD(list(reduced.items()))

    def takeOrdered(self, num: int, key: Callable[[Any], Any]) -> list[Any]:
        return heapq.nsmallest(num, self.records, key=key)


class FakeJob:
    """JobView with `batches` completed batches; `stop_requested` records POST /v1/stop."""

    def __init__(self, batches: int = 5):
        self.history = [batch_info(n) for n in range(1, batches + 1)]
        self.contents = stream_contents(batches)
        self.stop_requested = False
        self.registry = CollectorRegistry()
        Counter(
            "dstream_batches_completed_total", "Batches.", ["job"], registry=self.registry
        ).labels(job=JOB).inc(batches)

    def status(self) -> Status:
        return Status(
            job=JOB,
            state="stopping" if self.stop_requested else "running",
            batch_interval_seconds=BATCH_MS / 1000,
            last_batch=last_batch_of(self.history[-1]) if self.history else None,
            rate_limit={"rate": 5000.0},
            pending_batches=0,
            backlog={"rate": 1234},
            recoveries=dict.fromkeys(RECOVERY_KINDS, 0),
        )

    def readiness(self) -> tuple[bool, str]:
        if not self.history:
            return False, "no batch has completed yet"
        return True, "batches are completing"

    def batches(self, limit: int) -> list[Batch]:
        return [batch_of(info) for info in reversed(self.history[-limit:])]

    def streams(self) -> list[StreamSummary]:
        return [
            StreamSummary(
                name=name,
                slide_seconds=1,
                retain_seconds=60,
                retained_batches=len(by_time),
                oldest=utc(min(by_time)) if by_time else None,
                newest=utc(max(by_time)) if by_time else None,
            )
            for name, by_time in sorted(self.contents.items())
        ]

    def slice(self, query: SliceQuery) -> SliceResult:
        if query.stream == "broken":
            raise QueryFailedError("SparkContext was shut down")
        if query.stream not in self.contents:
            raise UnknownStreamError(query.stream)
        by_time = self.contents[query.stream]
        bounds = retained_bounds(query.from_ms, query.to_ms, self.history[-1].batch_time_ms)
        lower, upper = bounds if bounds is not None else (0, -1)
        times = slice_times(query, (t for t in by_time if lower <= t <= upper))
        result = empty_slice(query, times)
        if times:
            answer_slice(query, ListRDD([record for t in times for record in by_time[t]]), result)
        return result

    def request_stop(self) -> str:
        self.stop_requested = True
        return "stopping"
