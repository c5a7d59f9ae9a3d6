"""Prometheus metrics of a running job, kept in a registry of its own.

`StreamingMetrics` is a streaming listener: what a batch did (records, delays, failures, checkpoint
time) is recorded when the batch completes, while what the job *is* right now (rate limits, PID
terms, backlog, queued batches, recoveries, state size) is read from the scheduler at scrape time,
so a scrape never shows a stale backlog because the job is stuck in a long batch.

Every series carries a `job` label so that one Prometheus can tell many jobs apart.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dstream.runtime.checkpoint.recovery import recovery_counts
from dstream.runtime.control.latency import LATENCY_BUCKETS_S, BatchLatency
from dstream.runtime.scheduling.pools import QUERIES, use_pool

if TYPE_CHECKING:
    from pyspark import RDD

    from dstream.context import StreamingContext
    from dstream.dstream import DStream
    from dstream.runtime.scheduling.batch import BatchInfo
    from dstream.runtime.scheduling.scheduler import BatchScheduler

log = logging.getLogger(__name__)

BATCH_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, math.inf)
CHECKPOINT_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, math.inf)
# What a driver restart found, as counted by dstream_recoveries_total{kind}.
DEFAULT_STATE_KEYS_INTERVAL_S = 10.0
STATE_KEYS_INTERVAL_CONF = "dstream.metrics.stateKeysIntervalSeconds"
SAMPLER_JOB_GROUP = "dstream-state-keys"


class StreamingMetrics:
    """The job's metrics: a streaming listener plus a scrape-time collector, in one registry."""

    def __init__(
        self,
        job: str,
        ssc: StreamingContext,
        state_keys_interval_s: float | None = None,
    ):
        """`state_keys_interval_s` defaults to the Spark conf's
        dstream.metrics.stateKeysIntervalSeconds (spec.sparkConf), else 10 s."""
        self.job = job
        self.registry = CollectorRegistry(auto_describe=True)
        self._ssc = ssc
        self._batch_counters(job)
        self._last_batch_gauges(job)
        if state_keys_interval_s is None:
            state_keys_interval_s = state_keys_interval(ssc)
        self.state_keys = StateKeysSampler(ssc, state_keys_interval_s)
        self.registry.register(LiveCollector(job, ssc, self.state_keys))
        self.end_to_end = EndToEndLatency(job)
        self.registry.register(self.end_to_end)

    def _batch_counters(self, job: str) -> None:
        registry = self.registry
        self.batches_completed = Counter(
            "dstream_batches_completed_total",
            "Batches that finished, successfully or not (failed ones are also counted in "
            "dstream_failed_batches_total).",
            ["job"],
            registry=registry,
        ).labels(job=job)
        self.failed_batches = Counter(
            "dstream_failed_batches_total",
            "Batches whose output failed for good, after every retry (then the driver stops, "
            "or with onExhausted: skip the batch is skipped).",
            ["job"],
            registry=registry,
        ).labels(job=job)
        self.batch_retries = Counter(
            "dstream_batch_retries_total",
            "Output operations run again after failing (spec.failurePolicy.retries).",
            ["job"],
            registry=registry,
        ).labels(job=job)
        self.skipped_batches = Counter(
            "dstream_skipped_batches_total",
            "Batches that failed for good and were committed without their output "
            "(failurePolicy onExhausted: skip); their input ranges are in the commit marker.",
            ["job"],
            registry=registry,
        ).labels(job=job)
        self.coalesced_batches = Counter(
            "dstream_coalesced_batches_total",
            "Batch times merged into a later batch because they fell due while the job was behind "
            "(backpressure on): no input and no output of their own.",
            ["job"],
            registry=registry,
        ).labels(job=job)
        self.input_records = Counter(
            "dstream_input_records_total",
            "Records admitted into completed batches, per source.",
            ["job", "source"],
            registry=registry,
        )
        for source in self._ssc.input_streams:
            self.input_records.labels(job=job, source=source.name)
        self.processing = Histogram(
            "dstream_batch_processing_seconds",
            "Time a batch spent running its output jobs.",
            ["job"],
            buckets=BATCH_SECONDS_BUCKETS,
            registry=registry,
        ).labels(job=job)
        self.checkpoint = Histogram(
            "dstream_checkpoint_seconds",
            "Time spent writing a batch's record and commit marker to the checkpoint.",
            ["job"],
            buckets=CHECKPOINT_SECONDS_BUCKETS,
            registry=registry,
        ).labels(job=job)

    def _last_batch_gauges(self, job: str) -> None:
        def gauge(name: str, documentation: str) -> Any:
            return Gauge(name, documentation, ["job"], registry=self.registry).labels(job=job)

        self.last_processing = gauge(
            "dstream_last_batch_processing_seconds", "Processing time of the last completed batch."
        )
        self.last_scheduling_delay = gauge(
            "dstream_last_batch_scheduling_delay_seconds",
            "How long the last completed batch waited in the queue before it started.",
        )
        self.last_total_delay = gauge(
            "dstream_last_batch_total_delay_seconds",
            "Scheduling delay plus processing time of the last completed batch.",
        )
        self.last_batch_time = gauge(
            "dstream_last_completed_batch_timestamp_seconds",
            "Batch time (unix seconds) of the last completed batch; alert when it stops moving.",
        )
        gauge(
            "dstream_batch_interval_seconds",
            "The job's batch interval: processing above it means the job falls behind.",
        ).set(self._ssc.batch_interval_ms / 1000)

    # -- streaming listener ----------------------------------------------------------------

    def onBatchCompleted(self, event: Any) -> None:
        info: BatchInfo = event.batchInfo()
        self.batches_completed.inc()
        if info.error is not None:
            self.failed_batches.inc()
        self.batch_retries.inc(info.retries)
        if info.skipped:
            self.skipped_batches.inc()
        self.coalesced_batches.inc(len(info.coalesced))
        for source, records in info.records.items():
            self.input_records.labels(job=self.job, source=source).inc(records)
        processing, scheduling, total = (
            info.processingDelay(),
            info.schedulingDelay(),
            info.totalDelay(),
        )
        if processing is not None:
            self.processing.observe(processing / 1000)
            self.last_processing.set(processing / 1000)
        if scheduling is not None:
            self.last_scheduling_delay.set(scheduling / 1000)
        if total is not None:
            self.last_total_delay.set(total / 1000)
        if info.checkpoint_seconds is not None:
            self.checkpoint.observe(info.checkpoint_seconds)
        self.last_batch_time.set(info.batch_time_ms / 1000)
        if info.latency is not None:
            self.end_to_end.add(info.latency)
        self.state_keys.maybe_sample()

    def close(self) -> None:
        """Stop sampling state sizes; call before stopping the SparkContext."""
        self.state_keys.close()


class EndToEndLatency(Collector):
    """dstream_end_to_end_latency_seconds: every committed record's latency, added a batch at a
    time from the batch's bucket counts (prometheus_client's Histogram observes one value per
    call; a batch of a million records is one call here)."""

    def __init__(self, job: str):
        self._job = job
        self._lock = threading.Lock()
        self._buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self._sum_s = 0.0

    def add(self, batch: BatchLatency) -> None:
        with self._lock:
            self._buckets = [a + b for a, b in zip(self._buckets, batch.buckets, strict=True)]
            self._sum_s += batch.sum_s

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> list[Metric]:
        family = self._family()
        with self._lock:
            counts, sum_s = list(self._buckets), self._sum_s
        bounds = [*(str(b) for b in LATENCY_BUCKETS_S), "+Inf"]
        cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
        family.add_metric([self._job], list(zip(bounds, cumulative, strict=True)), sum_s)
        return [family]

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(
            "dstream_end_to_end_latency_seconds",
            "Per record, from when it became available at its source (rate: its scheduled "
            "time; files: the file's arrival; Redis: its entry ID; NATS: its stored timestamp) "
            "to when its batch's output committed.",
            labels=["job"],
        )


class StateKeysSampler:
    """Counts the records of the newest RDD of each queryable or stateful stream.

    Each count is a Spark job, so it runs at most once per interval, on a thread of its own (the
    batch runner must not wait for it), and never two at a time.
    """

    def __init__(self, ssc: StreamingContext, interval_s: float):
        self._ssc = ssc
        self.interval_s = interval_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dstream-state-keys")
        self._in_flight: Future[None] | None = None
        self._last_started = -math.inf
        self._lock = threading.Lock()
        self._closed = False
        self.counts: dict[str, int] = {}

    def maybe_sample(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._closed or now - self._last_started < self.interval_s:
                return
            if self._in_flight is not None and not self._in_flight.done():
                return
            newest = {name: rdd for name, rdd in self._newest_rdds() if rdd is not None}
            self._last_started = now
            self._in_flight = self._executor.submit(self._count, newest)

    def _sampled_streams(self) -> Iterator[tuple[str, DStream]]:
        """Registered query streams by name, then stateful streams nobody registered."""
        registered = self._ssc.queryStreams
        yield from registered.items()
        named = {id(stream) for stream in registered.values()}
        for stream in self._ssc.stateful_streams:
            if id(stream) not in named:
                yield f"{type(stream).__name__}-{stream.index}", stream

    def _newest_rdds(self) -> Iterator[tuple[str, RDD | None]]:
        for name, stream in self._sampled_streams():
            retained = stream.retained()
            yield name, retained[max(retained)] if retained else None

    def _count(self, newest: dict[str, RDD]) -> None:
        sc = self._ssc.sparkContext
        use_pool(sc, QUERIES)
        sc.setJobGroup(SAMPLER_JOB_GROUP, "dstream state size sample", True)
        sc.addJobTag(SAMPLER_JOB_GROUP)
        counts = dict(self.counts)
        for name, rdd in newest.items():
            try:
                counts[name] = rdd.count()
            except Exception as error:  # Spark stopping under us, or a lost RDD: keep the last.
                log.debug("counting the state of %s failed: %s", name, error)
        self.counts = counts  # replaced whole, so a scrape never sees it half-updated

    def close(self) -> None:
        """Cancel an in-flight count and wait for it, so stopping Spark finds nothing running;
        batches that complete afterwards (a graceful stop) sample nothing. Cancelled by job tag:
        cancelling a job group that has no jobs left makes Spark warn, and whether a count is
        still running cannot be known without a race."""
        with self._lock:
            self._closed = True
        self._ssc.sparkContext.cancelJobsWithTag(SAMPLER_JOB_GROUP)
        self._executor.shutdown(wait=True)


class LiveCollector(Collector):
    """Metrics read from the scheduler at scrape time: what the job is doing right now."""

    def __init__(self, job: str, ssc: StreamingContext, state_keys: StateKeysSampler):
        self._job = job
        self._ssc = ssc
        self._state_keys = state_keys

    def describe(self) -> list[Metric]:
        return list(self._families(None))

    def collect(self) -> list[Metric]:
        return list(self._families(self._ssc.scheduler))

    def _families(self, scheduler: BatchScheduler | None) -> Iterator[Metric]:
        job = self._job
        per_source = ["job", "source"]
        rate = GaugeMetricFamily(
            "dstream_rate_limit_records_per_second",
            "Records per second the next batch may admit, per source (absent: unlimited).",
            labels=per_source,
        )
        pid = {
            "error": GaugeMetricFamily(
                "dstream_pid_error",
                "PID proportional term: last rate limit minus the measured processing rate "
                "(records/s).",
                labels=per_source,
            ),
            "historical_error": GaugeMetricFamily(
                "dstream_pid_historical_error",
                "PID integral term: records/s of backlog that the scheduling delay represents.",
                labels=per_source,
            ),
            "derivative_error": GaugeMetricFamily(
                "dstream_pid_derivative_error",
                "PID derivative term: change of the error per second (records/s^2).",
                labels=per_source,
            ),
        }
        backlog = GaugeMetricFamily(
            "dstream_backlog_records",
            "Records available at the source but not admitted into any batch yet (source lag).",
            labels=per_source,
        )
        partition_backlog = GaugeMetricFamily(
            "dstream_partition_backlog_records",
            "Backlog of each partition of a source that has several (a Redis stream), i.e. the "
            "lag per partition.",
            labels=[*per_source, "partition"],
        )
        lost = CounterMetricFamily(
            "dstream_source_records_lost",
            "Records of a source partition skipped because they were removed (retention, "
            "deletion) before the job read them, under onDataLoss: skip; since the driver started.",
            labels=[*per_source, "partition"],
        )
        pending = GaugeMetricFamily(
            "dstream_pending_batches",
            "Batch times due (or recovered from the checkpoint) and not yet started.",
            labels=["job"],
        )
        recoveries = CounterMetricFamily(
            "dstream_recoveries",
            "What this driver's recovery from its checkpoint did, by kind (driver_restart: 1 "
            "when it started from an earlier run's checkpoint).",
            labels=["job", "kind"],
        )
        state = GaugeMetricFamily(
            "dstream_state_keys",
            "Keys (records) in the newest RDD of each queryable or stateful stream; sampled "
            "periodically because counting is a Spark job.",
            labels=["job", "stream"],
        )
        if scheduler is not None:
            now_ms = scheduler.clock.now_ms()
            for source in self._ssc.input_streams:
                controller = scheduler.rate_controllers.get(source.name)
                if controller is not None and controller.rate_limit is not None:
                    rate.add_metric([job, source.name], controller.rate_limit)
                terms = controller.estimator.last_terms if controller is not None else None
                if terms is not None:
                    pid["error"].add_metric([job, source.name], terms.error)
                    pid["historical_error"].add_metric([job, source.name], terms.historical_error)
                    pid["derivative_error"].add_metric([job, source.name], terms.derivative_error)
                waiting = source.backlog(now_ms)
                if waiting is not None:
                    backlog.add_metric([job, source.name], waiting)
                for partition, lag in source.backlog_by_partition().items():
                    partition_backlog.add_metric([job, source.name, partition], lag)
            pending.add_metric([job], scheduler.pending_batches())
            for kind, count in recovery_counts(scheduler.recovery).items():
                recoveries.add_metric([job, kind], count)
        for source in self._ssc.input_streams:  # counted when planning or replaying
            for partition, records in source.lost_by_partition().items():
                lost.add_metric([job, source.name, partition], records)
        for stream, keys in sorted(self._state_keys.counts.items()):
            state.add_metric([job, stream], keys)
        yield from (
            rate,
            *pid.values(),
            backlog,
            partition_backlog,
            lost,
            pending,
            recoveries,
            state,
        )


def state_keys_interval(ssc: StreamingContext) -> float:
    """The sampling interval from the Spark conf (a job sets it through spec.sparkConf)."""
    value = ssc.sparkContext._conf.get(STATE_KEYS_INTERVAL_CONF)
    return DEFAULT_STATE_KEYS_INTERVAL_S if value is None else float(value)
