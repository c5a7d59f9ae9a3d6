"""The API's view of a running job (dstream_api.view.JobView), implemented over the job
service's JobRuntime: the one place that reads the engine's scheduler, streams and RDDs for
the HTTP layer.
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from dstream_api.models import Batch, LastBatch, SliceResult, Status, StreamSummary, TopEntry
from dstream_api.view import (
    QueryFailedError,
    QueryNotApplicableError,
    SliceQuery,
    UnknownStreamError,
)

from dstream.runtime.checkpoint.recovery import recovery_counts
from dstream.runtime.scheduling.pools import QUERIES, use_pool

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from pyspark import RDD, SparkContext

    from dstream.context import StreamingContext
    from dstream.dstream import DStream
    from dstream.runtime.scheduling.batch import BatchInfo
    from dstream.runtime.scheduling.scheduler import BatchScheduler
    from dstream.spec import StreamingJob


def utc(time_ms: int) -> datetime:
    return datetime.fromtimestamp(time_ms / 1000, UTC)


def seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def batch_of(info: BatchInfo) -> Batch:
    return Batch(
        time=utc(info.batch_time_ms),
        kind=info.kind,
        coalesced_batches=len(info.coalesced),
        records=info.numRecords(),
        records_by_source=dict(info.records),
        rate_limit=dict(info.rate_limits),
        scheduling_delay_seconds=seconds(info.schedulingDelay()),
        processing_seconds=seconds(info.processingDelay()),
        total_delay_seconds=seconds(info.totalDelay()),
        checkpoint_seconds=info.checkpoint_seconds,
        error=info.error,
        latency_p50_seconds=info.latency.p50_s if info.latency else None,
        latency_p99_seconds=info.latency.p99_s if info.latency else None,
    )


def last_batch_of(info: BatchInfo) -> LastBatch:
    return LastBatch(
        time=utc(info.batch_time_ms),
        processing_seconds=seconds(info.processingDelay()),
        scheduling_delay_seconds=seconds(info.schedulingDelay()),
        total_delay_seconds=seconds(info.totalDelay()),
        records=info.numRecords(),
    )


def jsonable(value: Any) -> Any:
    """Records as JSON: tuples become lists, other objects their repr (keys can be anything)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    return repr(value)


def is_numeric_pair(record: Any) -> bool:
    return (
        isinstance(record, tuple)
        and len(record) == 2
        and isinstance(record[1], (int, float))
        and not isinstance(record[1], bool)
    )


class JobMetrics(Protocol):
    """A job's metrics, as far as the API serves them."""

    registry: CollectorRegistry


class RunningJob(Protocol):
    """What RuntimeView reads from a running job. The job service's JobRuntime is one; the API
    depends on this shape, not on the service layer above it (which composes the two)."""

    job: StreamingJob
    sc: SparkContext
    ssc: StreamingContext
    metrics: JobMetrics
    stop_requested: bool  # set by the API's stop request, honoured by the job's run loop

    @property
    def scheduler(self) -> BatchScheduler | None: ...


class RuntimeView:
    """JobView over a RunningJob (the real driver)."""

    def __init__(self, runtime: RunningJob):
        self._runtime = runtime
        self.registry = runtime.metrics.registry
        self._query_lock = threading.Lock()

    # -- job state ----------------------------------------------------------------------

    def _state(self) -> str:
        scheduler = self._runtime.scheduler
        if scheduler is None:
            return "starting"
        if self._runtime.stop_requested and scheduler.state in ("running", "recovering"):
            return "stopping"
        return scheduler.state

    def _history(self) -> list[BatchInfo]:
        scheduler = self._runtime.scheduler
        return list(scheduler.history) if scheduler is not None else []

    def status(self) -> Status:
        runtime = self._runtime
        scheduler = runtime.scheduler
        sources = runtime.ssc.input_streams
        history = self._history()
        rate_limit: dict[str, float | None] = {source.name: None for source in sources}
        backlog: dict[str, int | None] = {source.name: None for source in sources}
        if scheduler is not None:
            for name, controller in scheduler.rate_controllers.items():
                rate_limit[name] = controller.rate_limit
            now_ms = scheduler.clock.now_ms()
            if scheduler.state != "standby":  # a standby's sources start when it leads
                backlog = {source.name: source.backlog(now_ms) for source in sources}
        return Status(
            job=runtime.job.metadata.name,
            state=self._state(),
            epoch=scheduler.fence.epoch if scheduler is not None and scheduler.fence else None,
            batch_interval_seconds=runtime.job.spec.batch_interval_ms / 1000,
            last_batch=last_batch_of(history[-1]) if history else None,
            rate_limit=rate_limit,
            pending_batches=scheduler.pending_batches() if scheduler is not None else 0,
            backlog=backlog,
            recoveries=recovery_counts(scheduler.recovery) if scheduler is not None else {},
        )

    def readiness(self) -> tuple[bool, str]:
        state = self._state()
        if state in ("stopping", "stopped"):
            return False, f"the job is {state}"
        if not self._history():
            return False, "no batch has completed yet"
        return True, "batches are completing"

    def batches(self, limit: int) -> list[Batch]:
        return [batch_of(info) for info in reversed(self._history()[-limit:])]

    def request_stop(self) -> str:
        self._runtime.stop_requested = True
        return self._state()

    # -- interactive queries ------------------------------------------------------------

    def _last_completed_ms(self) -> int | None:
        history = self._history()
        return history[-1].batch_time_ms if history else None

    def _retained(self, stream: DStream, from_ms: int | None, to_ms: int | None) -> dict[int, RDD]:
        """The stream's RDDs of completed batches in [from_ms, to_ms]. Only what the stream
        retains: a query never makes the engine compute batches it has not run (or dropped)."""
        bounds = retained_bounds(from_ms, to_ms, self._last_completed_ms())
        return stream.retained(*bounds) if bounds is not None else {}

    def streams(self) -> list[StreamSummary]:
        summaries = []
        for name, stream in sorted(self._runtime.ssc.queryStreams.items()):
            times = sorted(self._retained(stream, None, None))
            summaries.append(
                StreamSummary(
                    name=name,
                    slide_seconds=stream.slide_ms / 1000,
                    retain_seconds=stream.remember_ms / 1000,
                    retained_batches=len(times),
                    oldest=utc(times[0]) if times else None,
                    newest=utc(times[-1]) if times else None,
                )
            )
        return summaries

    def slice(self, query: SliceQuery) -> SliceResult:
        stream = self._runtime.ssc.queryStreams.get(query.stream)
        if stream is None:
            raise UnknownStreamError(query.stream)
        retained = self._retained(stream, query.from_ms, query.to_ms)
        times = slice_times(query, retained)
        result = empty_slice(query, times)
        if not times:
            return result
        sc = self._runtime.sc
        rdds = [retained[t] for t in times]
        with self._query_lock:  # one Spark query at a time, in the pool that yields to batches
            try:
                use_pool(sc, QUERIES)
                sc.setJobGroup("dstream-api-query", f"slice {query.stream}", True)
                union = (sc.union(rdds) if len(rdds) > 1 else rdds[0]).coalesce(
                    query_partitions(sc)
                )
                answer_slice(query, union, result)
            except QueryNotApplicableError:
                raise
            except Exception as error:
                raise QueryFailedError(str(error).splitlines()[0]) from error
        return result


def retained_bounds(
    from_ms: int | None, to_ms: int | None, newest_ms: int | None
) -> tuple[float, float] | None:
    """The batch times a slice may read: [from_ms, to_ms] clipped to the newest completed
    batch; None before any batch has completed."""
    if newest_ms is None:
        return None
    upper = newest_ms if to_ms is None else min(to_ms, newest_ms)
    lower = -math.inf if from_ms is None else from_ms
    return lower, upper


def slice_times(query: SliceQuery, retained: Iterable[int]) -> list[int]:
    """The retained batch times the query reads, oldest first: all, or the newest only."""
    times = sorted(retained)
    return times[-1:] if query.combine == "latest" else times


def empty_slice(query: SliceQuery, times: list[int]) -> SliceResult:
    """The result over no records: an empty top-K, or a zero count and an empty sample."""
    return SliceResult(
        stream=query.stream,
        batch_times=[utc(t) for t in times],
        combine=query.combine,
        top=[] if query.top is not None else None,
        count=None if query.top is not None else 0,
        sample=None if query.top is not None else [],
    )


def answer_slice(query: SliceQuery, union: RDD, result: SliceResult) -> None:
    """Fill `result` from the union of the selected batches' RDDs: the top-K pairs, or the
    record count and the first `limit` records."""
    if query.top is not None:
        result.top = top_k(union, query.top, query.combine == "sum", query.stream)
    else:
        result.count = union.count()
        result.sample = [jsonable(record) for record in union.take(query.limit)]


def query_partitions(sc: Any) -> int:
    """At most half the task slots: a query's tasks then never hold every slot, and the
    stream's next tasks start at once (the FAIR pools, dstream/runtime/scheduling/pools.py, give them the free
    ones first), while the query still runs in parallel on a larger cluster."""
    return max(1, sc.defaultParallelism // 2)


def top_k(union: RDD, k: int, summed: bool, stream: str) -> list[TopEntry]:
    """The k (key, value) pairs with the largest values; values summed per key across batches."""
    first = union.take(1)
    if first and not is_numeric_pair(first[0]):
        raise QueryNotApplicableError(
            f"top-K needs (key, number) records; stream {stream!r} has e.g. {jsonable(first[0])!r}"
        )
    pairs = union.filter(is_numeric_pair)
    if summed:
        pairs = pairs.reduceByKey(operator.add)
    best = pairs.takeOrdered(k, key=lambda pair: -pair[1])
    return [TopEntry(key=jsonable(key), value=value) for key, value in best]
