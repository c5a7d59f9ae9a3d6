"""The systems under test, each running a workload variant at a fixed rate for one trial.

A `System` owns one SparkContext (one JVM) and runs trials on it one after another: a trial
starts a streaming job for a workload variant at a fixed input rate, waits until enough batches
have completed, stops the job (not Spark) and returns the batches' timings and output digests,
numbered by input interval k (batch k holds interval k's records, `feed`).

- dstream and pyspark.streaming run the same program text (`programs`) on the lines of
  their StreamingContext: dstream's own `rateStream`, and for pyspark.streaming a constant input
  stream transformed into the same per-batch RDD (a slice list, lines made in tasks).
- Structured Streaming runs its two formulations (`plain`, `expert`) on the `rate-micro-batch`
  source joined with the same line pool.
Grep's lines are made in Python (`grep`) or in the JVM (`grep-jvm`) for every system (`feed`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dstream.runtime.control import latency
from dstream.runtime.control.latency import BatchLatency
from pyspark import SparkConf, SparkContext

from bench.common import RECORD_BYTES, SEED, spark_conf
from bench.throughput import feed, programs
from bench.throughput.kafka_input import WATERMARK_DELAY, Fed, KafkaFeed
from bench.throughput.reference import (
    GREP_PATTERN,
    TOP_K,
    WINDOW_BATCHES,
    Slices,
    interval_slices,
)

WORKLOADS = programs.WORKLOADS
ON_TIME = 0.1  # a batch that started within this share of an interval of its time was not queued


@dataclass
class Batch:
    """One completed batch; times in ms. `time_ms` ends the interval whose records it holds.
    The latency percentiles are over its records, from each record's scheduled arrival to the
    end of the batch that output it (None where that is not known)."""

    time_ms: int
    records: int
    scheduling_ms: int
    processing_ms: int
    end_ms: int
    key: int  # what its output is recorded under: the batch time, or the micro-batch id
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    checkpoint_ms: float | None = None  # dstream: writing its batch record and commit marker
    # its records per bucket of dstream_end_to_end_latency_seconds (LATENCY_BUCKETS_S, then
    # above the last): the paper's targets are bucket bounds, so a trial counts exactly how many
    # of its records made the target
    latency_buckets: list[int] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def set_latency(self, measured: BatchLatency | None) -> None:
        """Its records' measured latency; left unknown when none was measured."""
        if measured is not None:
            self.latency_p50_ms = 1000 * measured.p50_s
            self.latency_p99_ms = 1000 * measured.p99_s
            self.latency_buckets = list(measured.buckets)


@dataclass
class TrialRun:
    """What one trial produced: the measured batches, their interval numbers and all outputs."""

    batches: list[Batch]
    intervals: list[int]  # k of each measured batch
    outputs: dict[int, Any]  # k -> digest, every batch that output
    inputs: dict[int, Slices] | None = None  # k -> what batch k read, where not interval k
    settled_after: int = 0  # batches after the warm-up until one started on schedule


def system_conf(
    system: str, master: str, partitions: int, daemon: str, settings: Sequence[str] = ()
) -> SparkConf:
    """The shared settings (`spark_conf`), then `settings` (KEY=VALUE), then the settings
    `system`'s engine starts with, where `settings` did not give them (a JVM option before
    theirs, so theirs win)."""
    conf = spark_conf(master, partitions, daemon)
    conf.setAll([tuple(setting.split("=", 1)) for setting in settings])
    return conf.setAll(list(SYSTEM_CLASSES[system].engine_settings(conf.getAll()).items()))


class System:
    """Base: a SparkContext, a job started per trial, and the batches its listener reports."""

    name = ""
    variants: tuple[str, ...] = ()
    reads_kafka = True  # whether it has a Kafka source on this Spark

    def __init__(self, sc: SparkContext, partitions: int, kafka: KafkaFeed | None = None):
        self.sc = sc
        self.partitions = partitions
        self.kafka = kafka  # trials read a topic it feeds, instead of the rate source
        self.on_batch: Callable[[Batch], None] | None = None  # live report (recovery runs)
        self.batch_ms = 1000  # the batch interval of the jobs `start` starts (`run` sets it)
        self._batches: list[Batch] = []
        self._changed = threading.Condition()

    @staticmethod
    def engine_settings(conf: list[tuple[str, str]]) -> dict[str, str]:
        """The Spark settings and JVM options its engine starts with, over the shared
        settings: none (Spark's defaults) unless it ships others."""
        return {}

    def _record(self, batch: Batch) -> None:
        with self._changed:
            self._batches.append(batch)
            self._changed.notify_all()
        if self.on_batch is not None:
            self.on_batch(batch)

    def wait_for(self, count: int, deadline: float) -> None:
        """Until `count` batches have completed or the deadline (time.monotonic()) passes."""
        with self._changed:
            self._changed.wait_for(
                lambda: len(self._batches) >= count, max(0.0, deadline - time.monotonic())
            )

    def completed(self) -> int:
        return len(self._batches)

    def wait_until_on_schedule(self, since: int, in_a_row: int, deadline: float) -> None:
        """Until `in_a_row` batches in a row from number `since` on started on time (within
        ON_TIME of an interval: the job's queue has drained) or the deadline passes."""

        def on_schedule() -> bool:
            late = [b.scheduling_ms > self.batch_ms * ON_TIME for b in self._batches[since:]]
            return len(late) >= in_a_row and not any(late[-in_a_row:])

        with self._changed:
            self._changed.wait_for(on_schedule, max(0.0, deadline - time.monotonic()))

    def run(
        self,
        workload: str,
        variant: str,
        rate: int,
        warmup: int,
        measured: int,
        timeout_s: float,
        batch_ms: int = 1000,
    ) -> TrialRun:
        """Run the variant at `rate` records/s for `warmup` batches of batch_ms, then until
        `measured` batches have completed from the first that started on schedule (or until the
        timeout); the measured batches and every batch's output. A new job's first batches (the
        JIT, fresh Python functions) can queue the next ones for seconds: measuring from where
        that queue has drained compares steady latency, as Structured Streaming's schedule
        (`structured_batches`) already starts at its first measured batch."""
        self.batch_ms = batch_ms
        self._batches = []
        programs.OUTPUTS.clear()
        workdir = tempfile.mkdtemp(prefix=f"bench-{self.name}-")
        if self.kafka is not None:
            self.kafka.open(self.name, rate)
        try:
            stop = self.start(workload, variant, rate, workdir)
            try:
                trailing = self.output_lag(workload, variant)
                settled = self._run_until_settled(warmup, measured + trailing, timeout_s)
            finally:
                stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            for rdd in self.sc._jsc.getPersistentRDDs().values():
                rdd.unpersist(False)
        after = self._measured(warmup)
        # a batch whose output a later one emits (append mode) is measured only if that one ran
        batches = after[settled : min(settled + measured, len(after) - trailing)]
        inputs = self.inputs(workload)
        if self.kafka is not None:
            self.kafka.close()
        outputs = {self.interval(t): digest for t, digest in programs.OUTPUTS.items()}
        return TrialRun(batches, self.intervals(batches), outputs, inputs, settled)

    def _run_until_settled(self, warmup: int, then: int, timeout_s: float) -> int:
        """Wait for `then` batches after the warm-up and the first batch after it that started
        on time (within ON_TIME of an interval: the queue had drained); how many batches that
        first one came after the warm-up (all of them when none did before the timeout)."""
        deadline = time.monotonic() + timeout_s
        count = warmup + then
        while True:
            self.wait_for(count, deadline)
            after = self._measured(warmup)
            settled = next(
                (i for i, b in enumerate(after) if b.scheduling_ms <= self.batch_ms * ON_TIME),
                len(after),
            )
            if warmup + settled + then <= count or time.monotonic() >= deadline:
                return settled
            count = warmup + settled + then

    def intervals(self, batches: list[Batch]) -> list[int]:
        """The k whose output each measured batch committed (what the checker samples)."""
        return [self.interval(b.key) for b in batches]

    @property
    def fed(self) -> Fed:
        """The topic of the running Kafka trial."""
        assert self.kafka is not None and self.kafka.current is not None
        return self.kafka.current

    def inputs(self, workload: str) -> dict[int, Slices] | None:
        """What each batch k read, where that is not interval k: None for the rate source."""
        return None

    def _measured(self, warmup: int) -> list[Batch]:
        return self._batches[warmup:]

    def interval(self, key: int) -> int:
        """The input interval k of an output key (a batch time for the DStream systems)."""
        raise NotImplementedError

    def output_lag(self, workload: str, variant: str) -> int:
        """How many batches after its own a batch's output comes (a trial runs them too)."""
        return 0

    def start(self, workload: str, variant: str, rate: int, checkpoint: str) -> Callable[[], None]:
        """Start the job, recovering from `checkpoint` when it holds an earlier run; returns
        the function that stops it."""
        raise NotImplementedError


class DStreamSystem(System):
    """This project's engine running the shared program on its own rate source."""

    name = "dstream"
    variants = programs.VARIANTS

    def __init__(self, sc: SparkContext, partitions: int, kafka: KafkaFeed | None = None):
        super().__init__(sc, partitions, kafka)
        self.read: dict[int, Slices] = {}  # batch time -> the Kafka offsets it read

    @staticmethod
    def engine_settings(conf: list[tuple[str, str]]) -> dict[str, str]:
        """As `dstream run` starts: the executors compile with C1 only (without it a
        replacement executor's C2 compiler takes the cores its backlog drains on), and they
        ask the driver for their peers every second, so a second copy of state finds the
        replacement (bench/results/2026-12-02-recovery.md, "The executors as `dstream run`
        starts them", "The second copy after a loss")."""
        from dstream.runtime.state.memory import SPARK_CONF
        from dstream.service.job import jit_settings

        given = dict(conf)
        unset = {key: value for key, value in SPARK_CONF.items() if key not in given}
        return {**unset, **jit_settings(conf)}

    def start(self, workload: str, variant: str, rate: int, checkpoint: str) -> Callable[[], None]:
        from dstream import StreamingContext

        self.read = {}

        def setup() -> Any:
            ssc = StreamingContext(self.sc, self.batch_ms / 1000)
            if self.kafka is not None:
                programs.build(workload, variant, kafka_lines(ssc, self.fed), self.batch_ms / 1000)
                return ssc
            lines = ssc.rateStream(rate, self.partitions, SEED, RECORD_BYTES)
            if workload in programs.JVM_LINES:  # its batches' times and latency stay the rate's
                origin: dict[str, int | None] = {"ms": None}
                made = interval_lines(rate, self.partitions, origin, self.batch_ms, in_jvm=True)
                lines = lines.transform(made)
            programs.build(workload, variant, lines, self.batch_ms / 1000)
            return ssc

        ssc = StreamingContext.getOrCreate(checkpoint, setup)
        ssc.addStreamingListener(_DStreamCollector(self))
        ssc.start()
        self._graph = ssc._graph
        return lambda: ssc.stop(stopSparkContext=False)

    def interval(self, key: int) -> int:
        return (key - self._graph.zero_ms) // self.batch_ms

    def inputs(self, workload: str) -> dict[int, Slices] | None:
        if self.kafka is None:
            return None
        return {self.interval(t): slices for t, slices in self.read.items()}


def kafka_lines(ssc: Any, fed: Fed) -> Any:
    """dstream's Kafka source on the trial's topic, from its first offset, with the settings a
    user leaves alone: one task per partition (the cores), no cap per batch."""
    from dstream.connectors.kafka_source import KafkaInputDStream
    from dstream.spec import KafkaSource

    settings = KafkaSource.model_validate(
        {"bootstrapServers": fed.bootstrap, "topics": [fed.topic], "startingOffsets": "earliest"}
    )
    return KafkaInputDStream(ssc, settings)


class _DStreamCollector:
    def __init__(self, system: DStreamSystem):
        self._system = system

    def onBatchCompleted(self, event: Any) -> None:
        info = event.batchInfo()
        if info.error is not None:
            return
        measured = info.latency  # what /v1/batches and the latency histogram report
        if "kafka" in info.ranges:
            read = [(p, a, b) for _topic, p, a, b in info.ranges["kafka"]["slices"]]
            self._system.read[info.batch_time_ms] = tuple(read)
        batch = Batch(
            info.batch_time_ms,
            info.numRecords(),
            info.schedulingDelay(),
            info.processingDelay(),
            info.processing_end_ms,
            info.batch_time_ms,
            checkpoint_ms=info.checkpoint_seconds and 1000 * info.checkpoint_seconds,
        )
        batch.set_latency(measured)
        self._system._record(batch)


class LegacySystem(System):
    """pyspark.streaming running the shared program on a stream of the same per-batch RDDs."""

    name = "pyspark.streaming"
    variants = programs.VARIANTS
    # Its Kafka DStream API (KafkaUtils) was removed from PySpark in Spark 3.0 (SPARK-25705).
    reads_kafka = False

    def start(self, workload: str, variant: str, rate: int, checkpoint: str) -> Callable[[], None]:
        from pyspark.streaming import StreamingContext

        origin: dict[str, int | None] = {"ms": None}

        def setup() -> Any:
            ssc = StreamingContext(self.sc, batch_ms / 1000)
            ssc.checkpoint(checkpoint)
            in_jvm = workload in programs.JVM_LINES
            lines = legacy_rate_lines(ssc, rate, self.partitions, origin, batch_ms, in_jvm)
            programs.build(workload, variant, lines, batch_ms / 1000)
            return ssc

        batch_ms = self.batch_ms
        ssc = StreamingContext.getOrCreate(checkpoint, setup)
        ssc.addStreamingListener(_legacy_listener(self, rate, origin, batch_ms))
        ssc.start()
        self._origin = origin
        return lambda: ssc.stop(stopSparkContext=False, stopGraceFully=False)

    def interval(self, key: int) -> int:
        assert self._origin["ms"] is not None
        return (key - self._origin["ms"]) // self.batch_ms


def legacy_rate_lines(
    ssc: Any,
    rate: int,
    partitions: int,
    origin: dict[str, Any],
    batch_ms: int = 1000,
    in_jvm: bool = False,
) -> Any:
    """The rate source's lines as a pyspark.streaming DStream: a constant input stream whose
    batches `interval_lines` turns into the interval's lines."""
    from pyspark.streaming.dstream import DStream

    sc = ssc.sparkContext
    tick = sc.parallelize([0], 1)
    jrdd = tick._jrdd
    constant = sc._jvm.org.apache.spark.streaming.dstream.ConstantInputDStream(
        ssc._jssc.ssc(), jrdd.rdd(), jrdd.classTag()
    )
    java_stream = sc._jvm.org.apache.spark.streaming.api.java.JavaDStream(constant, jrdd.classTag())
    ticks = DStream(java_stream, ssc, tick._jrdd_deserializer)
    return ticks.transform(interval_lines(rate, partitions, origin, batch_ms, in_jvm))


def interval_lines(
    rate: int, partitions: int, origin: dict[str, Any], batch_ms: int, in_jvm: bool
) -> Callable[[Any, Any], Any]:
    """The transform function whose batch at time T is the lines of interval
    k = (T - origin) / batch_ms, the origin being one interval before the first batch: made in
    tasks as `RateInputDStream._read` makes them, or (`in_jvm`) by Spark SQL. The origin is kept
    in the closure, which a checkpoint saves, so a restarted driver goes on."""
    generate = feed.slice_lines(SEED, RECORD_BYTES)

    def lines_of_interval(time: Any, rdd: Any) -> Any:
        time_ms = round(time.timestamp() * 1000)
        if origin["ms"] is None:
            origin["ms"] = time_ms - batch_ms
        k = (time_ms - origin["ms"]) // batch_ms
        if in_jvm:
            first, last = rate * (k - 1) * batch_ms // 1000, rate * k * batch_ms // 1000
            return feed.jvm_lines(first, last, partitions, SEED, RECORD_BYTES)
        slices = feed.batch_slices(rate, partitions, k, batch_ms)
        return rdd.context.parallelize(slices, partitions).mapPartitionsWithIndex(generate)

    return lines_of_interval


def scheduled_latency(
    rate: int, origin_ms: int, time_ms: int, end_ms: int, batch_ms: int = 1000
) -> BatchLatency | None:
    """The latency of the records of the batch at time_ms, from each record's arrival on the
    rate source's schedule (record v arrives ceil((v + 1) * 1000 / rate) ms after the origin,
    as RateInputDStream.available_at has it) to the batch's end: what dstream's rate source
    reports for the same records, computed the same way."""
    k = (time_ms - origin_ms) // batch_ms
    # the interval's sequence numbers, as feed.batch_slices counts them
    first, last = rate * (k - 1) * batch_ms // 1000, rate * k * batch_ms // 1000 - 1

    def arrival(v: int) -> int:
        return origin_ms + -(-(v + 1) * 1000 // rate)

    def arrived_by(at_ms: int) -> int:
        highest = rate * max(0, at_ms - origin_ms) // 1000 - 1
        return max(0, min(last, highest) - first + 1)

    ages = latency.ages_of_schedule(time_ms, arrival(first), arrival(last), arrived_by)
    return latency.summarize(ages, end_ms - time_ms)


def _legacy_listener(
    system: System, rate: int, origin: dict[str, int | None], batch_ms: int
) -> Any:
    from pyspark.streaming.listener import StreamingListener

    class Collector(StreamingListener):
        def onBatchCompleted(self, batchCompleted: Any) -> None:
            info = batchCompleted.batchInfo()
            time_ms, end_ms = info.batchTime().milliseconds(), info.processingEndTime()
            known = origin["ms"]  # set by the first batch's transform of this driver's graph
            measured = scheduled_latency(rate, known, time_ms, end_ms, batch_ms) if known else None
            batch = Batch(
                time_ms,
                rate * batch_ms // 1000,
                info.schedulingDelay(),
                info.processingDelay(),
                end_ms,
                time_ms,
            )
            batch.set_latency(measured)
            system._record(batch)

    return Collector()


class StructuredSystem(System):
    """Structured Streaming, DataFrame API, one trigger per batch interval, in two formulations:
    - plain: grep with `rlike`; counts with `groupBy(window(ts, 30 s, slide), word).count()`,
      update mode, the default state store; a micro-batch outputs the current window's counts
      of the words it updated (update mode's semantics, checked as such);
    - expert: grep with `contains`; counts as Spark 4's experts chain window aggregations: a
      pre-aggregate per batch interval, then the sliding window over its `window_time`, in
      append mode. Append mode emits a window once the watermark has passed its end, so the
      window that ends with interval k comes out OUTPUT_LAG triggers after the one that read k;
      its latency includes them.
    Both keep their state in the default (HDFS-backed, in-memory) state store. Not RocksDB: on
    Spark 4.0 a streaming aggregation opens a read-only store beside the one it writes and
    aborts it when its task ends, which makes RocksDB drop the version it just committed and
    load it again from the checkpoint at the next trigger (a snapshot plus every changelog
    since), for each operator and partition (SPARK-51955, fixed in Spark 4.1). With the
    chained windows' 100,000+ state rows updated per trigger that reload was most of every
    trigger (bench/results/2026-11-25-bench.md, "Structured Streaming's expert formulation with
    RocksDB")."""

    name = "structured"
    variants = ("plain", "expert")
    OUTPUT_LAG = 2

    def __init__(self, sc: SparkContext, partitions: int, kafka: KafkaFeed | None = None):
        from pyspark.sql import SparkSession

        super().__init__(sc, partitions, kafka)
        self.spark = SparkSession(sc)
        self.spark.conf.set("spark.sql.ansi.enabled", "false")  # feed.pool_index_column wraps
        self.spark.conf.set("spark.sql.shuffle.partitions", str(partitions))  # state partitions
        self._progress: list[dict[str, Any]] = []
        self._emitted: dict[int, int] = {}  # interval k -> the micro-batch that output it
        self._appends = False  # whether outputs come OUTPUT_LAG micro-batches later
        self._rate = 0
        self._wall_clock = False

    @functools.cached_property
    def pool(self) -> Any:
        """The line pool as a cached table, built by the first trial that joins it (a Kafka
        trial reads its lines from the topic and never does)."""
        pool = feed.pool_frame(self.spark, SEED, RECORD_BYTES).cache()
        pool.count()
        return pool

    def lines(self, rate: int, start_ms: int, wall_clock: bool, in_jvm: bool = True) -> Any:
        """The records as (line, timestamp) rows. Trials use `rate-micro-batch` (exactly one
        interval per micro-batch, like the DStream systems); recovery runs use `rate`, whose
        rows keep arriving by the wall clock while the driver is down, as the others' do.
        Lines made in the JVM (the pool joined by index), or in Python (`feed.python_lines`)."""
        from pyspark.sql import functions as sf

        if self.kafka is not None:
            return self.kafka_lines()
        reader = self.spark.readStream.option("numPartitions", self.partitions)
        if wall_clock:
            source = reader.format("rate").option("rowsPerSecond", rate).load()
        else:
            if rate * self.batch_ms % 1000:
                raise ValueError(f"structured: {rate}/s is no whole number of rows per batch")
            source = (
                reader.format("rate-micro-batch")
                .option("rowsPerBatch", rate * self.batch_ms // 1000)
                .option("startTimestamp", start_ms)
                .option("advanceMillisPerBatch", self.batch_ms)
                .load()
            )
        if not in_jvm:
            made = feed.python_lines(self.partitions, SEED, RECORD_BYTES)
            return source.mapInArrow(made, "line string, timestamp timestamp")
        indexed = source.withColumn("idx", feed.pool_index_column("value", self.partitions, SEED))
        return indexed.join(sf.broadcast(self.pool), "idx").select("line", "timestamp")

    def kafka_lines(self) -> Any:
        """The trial's topic as (line, timestamp) rows, the Kafka timestamp as event time. As
        an expert sets it for a latency target: every trigger reads all that has arrived (no
        maxOffsetsPerTrigger: a cap only leaves records waiting), one task per partition (no
        minPartitions: there are as many partitions as cores), from the topic's start."""
        from pyspark.sql import functions as sf

        fed = self.fed
        source = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", fed.bootstrap)
            .option("subscribe", fed.topic)
            .option("startingOffsets", "earliest")
            .load()
        )
        return source.select(sf.col("value").cast("string").alias("line"), "timestamp")

    def start(
        self, workload: str, variant: str, rate: int, checkpoint: str, wall_clock: bool = False
    ) -> Callable[[], None]:
        from pyspark.sql import functions as sf

        if self.kafka is not None and variant != "expert":
            raise ValueError(f"structured {variant}: reads the rate source only (Kafka: expert)")
        self._progress = []
        self._emitted = {}
        self._appends = self.output_lag(workload, variant) > 0
        self._rate = rate
        self._checkpoint = checkpoint
        self._wall_clock = wall_clock
        expert = variant == "expert"
        start_ms = (int(time.time()) - 60) * 1000  # whole seconds: window ends are aligned
        if self.kafka is not None:
            start_ms = self.fed.origin_ms  # window k ends k s after the first timestamp
        in_jvm = workload not in programs.GREPS or workload in programs.JVM_LINES
        lines = self.lines(rate, start_ms, wall_clock, in_jvm)
        if workload in programs.GREPS:
            line = sf.col("line")
            matches = lines.where(
                line.contains(GREP_PATTERN) if expert else line.rlike(GREP_PATTERN)
            )
            writer = matches.writeStream.foreachBatch(_record_count)
        else:
            words = lines.select(
                sf.explode(sf.split(sf.trim("line"), " +")).alias("word"), "timestamp"
            ).withWatermark("timestamp", self.watermark_delay(expert))
            slide, length = f"{self.batch_ms} milliseconds", f"{WINDOW_BATCHES} seconds"
            if expert:
                per_interval = words.groupBy(sf.window("timestamp", slide), "word").count()
                window = sf.window(sf.window_time("window"), length, slide)
                counts = per_interval.groupBy(window, "word").agg(sf.sum("count").alias("count"))
                sink = _ClosedWindowSink(workload, start_ms, self.batch_ms, self._emitted)
                writer = counts.writeStream.outputMode("append").foreachBatch(sink)
            else:
                counts = words.groupBy(sf.window("timestamp", length, slide), "word").count()
                current = _CurrentWindowSink(workload, start_ms, self.batch_ms)
                writer = counts.writeStream.outputMode("update").foreachBatch(current)
        self._query = (
            writer.option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{self.batch_ms} milliseconds")
            .start()
        )
        return self._query.stop

    def watermark_delay(self, expert: bool) -> str:
        """rate-micro-batch's rows come in order (the expert's 0 s); a topic's partitions are
        read as far as each has got (kafka_input.WATERMARK_DELAY)."""
        if self.kafka is not None:
            return WATERMARK_DELAY
        return "0 seconds" if expert else "1 second"

    def output_lag(self, workload: str, variant: str) -> int:
        return self.OUTPUT_LAG if variant == "expert" and workload not in programs.GREPS else 0

    def inputs(self, workload: str) -> dict[int, Slices] | None:
        """Grep over Kafka: what each micro-batch read (its windows hold intervals by their
        timestamps, so WordCount's need none)."""
        if self.kafka is None or workload not in programs.GREPS:
            return None
        return {self.interval(p["batchId"]): progress_slices(p) for p in self._progress}

    def interval(self, key: int) -> int:
        return key + 1  # batch id b holds rows [b * rows, (b + 1) * rows): interval b + 1

    def wait_for(self, count: int, deadline: float) -> None:
        """Poll the query's progress (a completed micro-batch each) into batches; a query that
        failed ends the wait with its error."""
        while time.monotonic() < deadline:
            if not self._query.isActive and self._query.exception() is not None:
                raise RuntimeError(f"the query failed: {self._query.exception()}")
            self._poll()
            if len(self._progress) >= count:
                return
            time.sleep(0.2)

    def _poll(self) -> None:
        seen = {p["batchId"] for p in self._progress}
        # each progress as one JSON string: converting its maps key by key through py4j
        # raced with the query's own thread and failed a trial once
        recent = [json.loads(p.json()) for p in self._query._jsq.recentProgress()]
        fresh = [p for p in recent if p["batchId"] not in seen]
        self._progress += fresh
        if self.on_batch is not None and fresh and self._wall_clock:
            created = rate_source_created_ms(self._checkpoint)
            for batch in rate_source_batches(fresh, created):
                self.on_batch(batch)

    def _measured(self, warmup: int) -> list[Batch]:
        emitted = self._emitted if self._appends else None
        if self.kafka is None:
            return structured_batches(self._progress, warmup, self._rate, self.batch_ms, emitted)
        fed = self.fed

        def read_by(progress: dict[str, Any]) -> list[tuple[int, int, int]]:
            """The records whose output micro-batch `progress` committed."""
            if emitted is None:
                return list(progress_slices(progress))
            closed = [k for k, b in emitted.items() if b == progress["batchId"]]
            return [s for k in closed for s in interval_slices(fed.rate, fed.partitions, k)]

        batches = structured_batches(self._progress, warmup, self._rate, self.batch_ms)
        for batch in batches:  # key: the micro-batch id
            batch.set_latency(fed.latency(read_by(self._by_id(batch.key)), batch.end_ms))
        return batches

    def intervals(self, batches: list[Batch]) -> list[int]:
        """Over Kafka, a micro-batch's id says nothing of the windows it closed (its first
        one read all the seconds since the feeder's origin): the newest window each closed."""
        if self.kafka is None or not self._appends:
            return super().intervals(batches)
        closed = [[k for k, b in self._emitted.items() if b == batch.key] for batch in batches]
        return [max(ks) for ks in closed if ks]

    def _by_id(self, batch_id: int) -> dict[str, Any]:
        return next(p for p in self._progress if p["batchId"] == batch_id)


def progress_slices(progress: dict[str, Any]) -> Slices:
    """The Kafka offsets a micro-batch read, from its progress (a first micro-batch has no
    start offsets: it read from each partition's start, 0 on a fresh topic)."""
    source = progress["sources"][0]
    start = source.get("startOffset") or {}
    end = source.get("endOffset") or {}
    read = []
    for topic, offsets in end.items():
        for partition, until in offsets.items():
            begin = start.get(topic, {}).get(partition, 0)
            read.append((int(partition), int(begin), int(until)))
    return tuple(sorted(read))


def _record_count(df: Any, batch_id: int) -> None:
    programs.OUTPUTS[batch_id] = df.count()


def _sql_digest(workload: str, counts: Any) -> Any:
    """The digest of a (word, count) DataFrame, computed in the JVM."""
    from pyspark.sql import functions as sf

    if workload == "wordcount":
        row = counts.agg(
            sf.count("*"),
            sf.sum("count"),
            sf.sum(sf.crc32(sf.col("word").cast("binary")) * sf.col("count")),
        ).first()
        return [int(v or 0) for v in row]
    top = counts.orderBy(sf.desc("count"), "word").limit(TOP_K).collect()
    return [[r["word"], int(r["count"])] for r in top]


def _window_end(start_ms: int, batch_ms: int, k: int) -> Any:
    """The end of the window whose newest interval is k (rate-micro-batch stamps micro-batch
    b's rows start + b * batch_ms, which is interval b + 1)."""
    from pyspark.sql import functions as sf

    return sf.timestamp_millis(sf.lit(start_ms + k * batch_ms))


class _CurrentWindowSink:
    """foreachBatch of the plain formulation: the rows of the window whose newest interval is
    this micro-batch's."""

    def __init__(self, workload: str, start_ms: int, batch_ms: int):
        self.workload = workload
        self.start_ms = start_ms
        self.batch_ms = batch_ms

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as sf

        end = _window_end(self.start_ms, self.batch_ms, batch_id + 1)
        current = df.where(sf.col("window.end") == end).select("word", "count")
        programs.OUTPUTS[batch_id] = _sql_digest(self.workload, current)


class _ClosedWindowSink:
    """foreachBatch of the expert formulation: each window that append mode closed in this
    micro-batch (one a trigger once running), digested under the interval it ends with."""

    def __init__(self, workload: str, start_ms: int, batch_ms: int, emitted: dict[int, int]):
        self.workload = workload
        self.start_ms = start_ms
        self.batch_ms = batch_ms
        self.emitted = emitted

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as sf

        df.persist()  # several actions: the stateful plan runs once
        try:
            ends = df.select(sf.unix_millis("window.end").alias("end")).distinct().collect()
            for (end_ms,) in ends:
                k = (end_ms - self.start_ms) // self.batch_ms
                end = _window_end(self.start_ms, self.batch_ms, k)
                window = df.where(sf.col("window.end") == end).select("word", "count")
                programs.OUTPUTS[k - 1] = _sql_digest(self.workload, window)
                self.emitted[k] = batch_id
        finally:
            df.unpersist()


def rate_source_created_ms(checkpoint: str) -> int:
    """When the `rate` source started counting: its rows of second s arrive in [s, s + 1)."""
    with open(os.path.join(checkpoint, "sources", "0", "0")) as metadata:
        return int(metadata.read().split()[-1])


def rate_source_batches(progress: list[dict[str, Any]], created_ms: int) -> list[Batch]:
    """Micro-batches of the `rate` source as batches due when their newest second ended."""
    batches = []
    for p in progress:
        end_second = p["sources"][0]["endOffset"]
        if end_second is None:
            continue
        due = created_ms + int(end_second) * 1000
        batches.append(_progress_batch(p, due))
    return batches


def _progress_batch(progress: dict[str, Any], due: int) -> Batch:
    """One query progress entry as a Batch that was due at `due` (ms)."""
    start = _started_ms(progress)
    processing = progress["durationMs"].get("triggerExecution", 0)
    return Batch(
        due,
        progress["numInputRows"],
        max(0, start - due),
        processing,
        start + processing,
        progress["batchId"],
    )


def _started_ms(progress: dict[str, Any]) -> int:
    from datetime import datetime

    stamp = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
    return round(stamp.timestamp() * 1000)


def structured_batches(
    progress: list[dict[str, Any]],
    warmup: int,
    rate: int,
    batch_ms: int = 1000,
    emitted: dict[int, int] | None = None,
) -> list[Batch]:
    """Batch timings from query progress. Batch b's input is interval b + 1 of a schedule
    that starts with the first measured batch (b = warmup): the rate-micro-batch source admits
    one interval per trigger and never catches up, so a lag left by the (slow) first batches
    would otherwise stay in every later delay; from there on a slow batch delays all later ones.

    Its records' latency runs from their arrival on that schedule (spread over the interval, as
    the DStream systems' rate sources have them) to the end of the micro-batch that output
    them: b itself, or in append mode the one `emitted` names (interval -> micro-batch)."""
    measured = sorted((p for p in progress if p["batchId"] >= warmup), key=lambda p: p["batchId"])
    if not measured:
        return []
    # The most punctual batch defines the schedule (its scheduling delay is 0).
    zero = min(_started_ms(p) - p["batchId"] * batch_ms for p in measured)
    ends = {p["batchId"]: _progress_batch(p, 0).end_ms for p in progress}
    batches = []
    for p in measured:
        batch = _progress_batch(p, zero + p["batchId"] * batch_ms)
        output_by = p["batchId"] if emitted is None else emitted.get(p["batchId"] + 1)
        if output_by in ends:
            origin = zero - batch_ms  # interval k ends at origin + k * batch_ms
            batch.set_latency(
                scheduled_latency(rate, origin, batch.time_ms, ends[output_by], batch_ms)
            )
        batches.append(batch)
    return batches


SYSTEM_CLASSES: dict[str, type[System]] = {
    "dstream": DStreamSystem,
    "pyspark.streaming": LegacySystem,
    "structured": StructuredSystem,
}
SYSTEMS = tuple(SYSTEM_CLASSES)
