"""The three workloads written idiomatically in each system, and one trial run of them.

A `System` owns one SparkContext (one JVM) and runs trials on it one after another: a trial
starts a streaming job for a workload at a fixed input rate, waits until enough batches have
completed, stops the job (not Spark) and returns the batches' timings. Every system emits each
batch's result through a cheap action (a count, or the k top pairs), so output costs the same.

Workloads (the D-Stream paper's):
- grep: how many lines of each batch contain PATTERN;
- wordcount: word counts over a 30 s window sliding every 1 s;
- topk: the K most frequent words over the last 30 s, every second.
"""

from __future__ import annotations

import operator
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from dstream import pydaemon
from pyspark import SparkConf, SparkContext

from bench import feed

PATTERN = "bab"  # in about a quarter of the lines
WINDOW_S = 30
K = 10
SEED = 7
RECORD_BYTES = 100
WORKLOADS = ("grep", "wordcount", "topk")
SYSTEMS = ("dstream", "pyspark.streaming", "structured")


@dataclass
class Batch:
    """One completed batch; times in ms. `time_ms` ends the interval whose records it holds."""

    time_ms: int
    records: int
    scheduling_ms: int
    processing_ms: int
    end_ms: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def spark_conf(master: str, partitions: int, system: str | None = None) -> SparkConf:
    """The same Spark settings for every system: quiet, local, `partitions` tasks per stage;
    plus what the system itself sets (dstream: its Python worker daemon; the peers run as
    their users run them). Python workers run this interpreter (the venv, where dstream and
    bench import): PySpark reads PYSPARK_PYTHON when the SparkContext starts, and PYTHONPATH
    reaches the workers."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p
    )
    return SparkConf().setAll(
        [
            ("spark.master", master),
            ("spark.app.name", "dstream-bench"),
            ("spark.ui.enabled", "false"),
            ("spark.ui.showConsoleProgress", "false"),
            ("spark.driver.host", "127.0.0.1"),
            ("spark.driver.bindAddress", "127.0.0.1"),
            ("spark.default.parallelism", str(partitions)),
            ("spark.sql.shuffle.partitions", str(partitions)),
            ("spark.sql.ansi.enabled", "false"),
            ("spark.driver.memory", "2g"),
            *(SYSTEM_CLASSES[system].spark_settings.items() if system else ()),
        ]
    )


class System:
    """Base: a SparkContext, a job started per trial, and the batches its listener reports."""

    name = ""
    spark_settings: dict[str, str] = {}

    def __init__(self, sc: SparkContext, partitions: int):
        self.sc = sc
        self.partitions = partitions
        self.on_batch: Callable[[Batch], None] | None = None  # live report (recovery runs)
        self._batches: list[Batch] = []
        self._warmup = 0
        self._changed = threading.Condition()

    def _record(self, batch: Batch) -> None:
        with self._changed:
            self._batches.append(batch)
            self._changed.notify_all()
        if self.on_batch is not None:
            self.on_batch(batch)

    def batches_done(self) -> int:
        return len(self._batches)

    def wait_for(self, count: int, deadline: float) -> None:
        """Until `count` batches have completed or the deadline (time.monotonic()) passes."""
        with self._changed:
            self._changed.wait_for(
                lambda: len(self._batches) >= count, max(0.0, deadline - time.monotonic())
            )

    def run(
        self, workload: str, rate: int, warmup: int, measured: int, timeout_s: float
    ) -> list[Batch]:
        """Run `workload` at `rate` records/s for `warmup` + `measured` batches (or until the
        timeout) and return the measured ones."""
        self._batches = []
        self._warmup = warmup
        workdir = tempfile.mkdtemp(prefix=f"bench-{self.name}-")
        try:
            stop = self.start(workload, rate, workdir)
            try:
                self.wait_for(warmup + measured, time.monotonic() + timeout_s)
            finally:
                stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            for rdd in self.sc._jsc.getPersistentRDDs().values():
                rdd.unpersist(False)
        return self._measured()

    def _measured(self) -> list[Batch]:
        """The batches after the warm-up (listeners see them all)."""
        return self._batches[self._warmup :]

    def start(self, workload: str, rate: int, checkpoint: str) -> Callable[[], None]:
        """Start the job, recovering from `checkpoint` when it holds an earlier run; returns
        the function that stops it."""
        raise NotImplementedError


def _emit_count(rdd: Any) -> None:
    rdd.count()


def _emit_all(rdd: Any) -> None:
    rdd.collect()


def _emit_top(rdd: Any) -> None:
    k = K
    rdd.takeOrdered(k, key=lambda kv: (-kv[1], kv[0]))


class DStreamSystem(System):
    """This project's engine running its built-in apps, fed by its own rate source."""

    name = "dstream"
    spark_settings = pydaemon.SPARK_CONF

    def start(self, workload: str, rate: int, checkpoint: str) -> Callable[[], None]:
        from dstream import apps
        from dstream.context import StreamingContext
        from dstream.spec import GrepArgs, TopkArgs, WordcountArgs

        ssc = StreamingContext(self.sc, 1)
        ssc.checkpoint(checkpoint)  # recovers at start() when the checkpoint holds a run
        lines = ssc.rateStream(rate, self.partitions, SEED, RECORD_BYTES)
        window = f"{WINDOW_S}s"
        if workload == "grep":
            apps.grep(ssc, lines, GrepArgs(pattern=PATTERN)).foreachRDD(_emit_all)
        elif workload == "wordcount":
            args = WordcountArgs(window=window, slide="1s")
            apps.wordcount(ssc, lines, args).foreachRDD(_emit_count)
        else:
            apps.topk(ssc, lines, TopkArgs(k=K, window=window, slide="1s")).foreachRDD(_emit_all)
        ssc.addStreamingListener(_DStreamCollector(self))
        ssc.start()
        return lambda: ssc.stop(stopSparkContext=False)


class _DStreamCollector:
    def __init__(self, system: System):
        self._system = system

    def onBatchCompleted(self, event: Any) -> None:
        info = event.batchInfo()
        if info.error is not None:
            return
        self._system._record(
            Batch(
                info.batch_time_ms,
                info.numRecords(),
                info.schedulingDelay(),
                info.processingDelay(),
                info.processing_end_ms,
            )
        )


class LegacySystem(System):
    """pyspark.streaming, as its users write it (reduceByKeyAndWindow with an inverse)."""

    name = "pyspark.streaming"

    def start(self, workload: str, rate: int, checkpoint: str) -> Callable[[], None]:
        from pyspark.streaming import StreamingContext

        def setup() -> Any:
            ssc = StreamingContext(self.sc, 1)
            ssc.checkpoint(checkpoint)
            lines = legacy_rate_lines(ssc, rate, self.partitions)
            if workload == "grep":
                pattern = PATTERN
                matches = lines.filter(lambda line: re.search(pattern, line) is not None)
                matches.count().foreachRDD(_emit_all)
                return ssc
            pairs = lines.flatMap(lambda line: line.split()).map(lambda word: (word, 1))
            counts = pairs.reduceByKeyAndWindow(
                operator.add, operator.sub, WINDOW_S, 1, filterFunc=lambda kv: kv[1] > 0
            )
            counts.foreachRDD(_emit_count if workload == "wordcount" else _emit_top)
            return ssc

        ssc = StreamingContext.getOrCreate(checkpoint, setup)
        ssc.addStreamingListener(_legacy_listener(self, rate))
        ssc.start()
        return lambda: ssc.stop(stopSparkContext=False, stopGraceFully=False)


def legacy_rate_lines(ssc: Any, rate: int, partitions: int) -> Any:
    """The rate source's lines as a pyspark.streaming DStream: the batch at time T holds interval
    k = (T - origin) / 1 s, the origin being 1 s before the first batch. The origin is kept in the
    transform function's closure, which the checkpoint saves, so a restarted driver goes on."""
    from pyspark.streaming.dstream import DStream

    sc = ssc.sparkContext
    tick = sc.parallelize([0], 1)
    jrdd = tick._jrdd
    constant = sc._jvm.org.apache.spark.streaming.dstream.ConstantInputDStream(
        ssc._jssc.ssc(), jrdd.rdd(), jrdd.classTag()
    )
    java_stream = sc._jvm.org.apache.spark.streaming.api.java.JavaDStream(constant, jrdd.classTag())
    ticks = DStream(java_stream, ssc, tick._jrdd_deserializer)
    origin: dict[str, int | None] = {"ms": None}
    generate = feed.slice_lines(SEED, RECORD_BYTES)

    def interval_lines(time: Any, rdd: Any) -> Any:
        time_ms = round(time.timestamp() * 1000)
        if origin["ms"] is None:
            origin["ms"] = time_ms - 1000
        k = (time_ms - origin["ms"]) // 1000
        slices = feed.batch_slices(rate, partitions, k)
        return rdd.context.parallelize(slices, partitions).mapPartitionsWithIndex(generate)

    return ticks.transform(interval_lines)


def _legacy_listener(system: System, rate: int) -> Any:
    from pyspark.streaming.listener import StreamingListener

    class Collector(StreamingListener):
        def onBatchCompleted(self, batchCompleted: Any) -> None:
            info = batchCompleted.batchInfo()
            system._record(
                Batch(
                    info.batchTime().milliseconds(),
                    rate,
                    info.schedulingDelay(),
                    info.processingDelay(),
                    info.processingEndTime(),
                )
            )

    return Collector()


class StructuredSystem(System):
    """Structured Streaming, DataFrame API: event-time sliding windows, state store, 1 s trigger."""

    name = "structured"

    def __init__(self, sc: SparkContext, partitions: int):
        from pyspark.sql import SparkSession

        super().__init__(sc, partitions)
        self.spark = SparkSession(sc)
        self.pool = feed.pool_frame(self.spark, SEED, RECORD_BYTES).cache()
        self.pool.count()

    def lines(self, rate: int, start_ms: int, wall_clock: bool) -> Any:
        """The records as (line, timestamp) rows. Trials use `rate-micro-batch` (exactly one
        interval per micro-batch, like the DStream systems); recovery runs use `rate`, whose
        rows keep arriving by the wall clock while the driver is down, as the others' do."""
        from pyspark.sql import functions as sf

        reader = self.spark.readStream.option("numPartitions", self.partitions)
        if wall_clock:
            source = reader.format("rate").option("rowsPerSecond", rate).load()
        else:
            source = (
                reader.format("rate-micro-batch")
                .option("rowsPerBatch", rate)
                .option("startTimestamp", start_ms)
                .option("advanceMillisPerBatch", 1000)
                .load()
            )
        indexed = source.withColumn("idx", feed.pool_index_column("value", self.partitions, SEED))
        return indexed.join(sf.broadcast(self.pool), "idx").select("line", "timestamp")

    def start(
        self, workload: str, rate: int, checkpoint: str, wall_clock: bool = False
    ) -> Callable[[], None]:
        from pyspark.sql import functions as sf

        self._progress: list[dict[str, Any]] = []
        self._checkpoint = checkpoint
        self._wall_clock = wall_clock
        start_ms = int(time.time() * 1000)
        lines = self.lines(rate, start_ms, wall_clock)
        if workload == "grep":
            matches = lines.where(sf.col("line").rlike(PATTERN))
            writer = matches.writeStream.foreachBatch(lambda df, _id: df.count())
        else:
            words = lines.select(
                sf.explode(sf.split(sf.trim("line"), " +")).alias("word"), "timestamp"
            )
            counts = (
                words.withWatermark("timestamp", "1 second")
                .groupBy(sf.window("timestamp", f"{WINDOW_S} seconds", "1 second"), "word")
                .count()
            )
            writer = counts.writeStream.outputMode("update")
            if workload == "wordcount":
                writer = writer.format("noop")
            else:
                writer = writer.foreachBatch(_top_of_current_window(start_ms))
        self._query = (
            writer.option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second")
            .start()
        )
        return self._query.stop

    def wait_for(self, count: int, deadline: float) -> None:
        """Poll the query's progress (a completed micro-batch each) into batches."""
        while time.monotonic() < deadline:
            self._poll()
            if len(self._progress) >= count:
                return
            time.sleep(0.2)

    def batches_done(self) -> int:
        self._poll()
        return len(self._progress)

    def _poll(self) -> None:
        seen = {p["batchId"] for p in self._progress}
        fresh = [p for p in self._query.recentProgress if p["batchId"] not in seen]
        self._progress += fresh
        if self.on_batch is not None and fresh and self._wall_clock:
            created = rate_source_created_ms(self._checkpoint)
            for batch in rate_source_batches(fresh, created):
                self.on_batch(batch)

    def _measured(self) -> list[Batch]:
        return structured_batches(self._progress, self._warmup)


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
        start = _started_ms(p)
        processing = p["durationMs"].get("triggerExecution", 0)
        due = created_ms + int(end_second) * 1000
        batches.append(
            Batch(due, p["numInputRows"], max(0, start - due), processing, start + processing)
        )
    return batches


def _started_ms(progress: dict[str, Any]) -> int:
    from datetime import datetime

    stamp = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
    return round(stamp.timestamp() * 1000)


def _top_of_current_window(start_ms: int) -> Any:
    """foreachBatch: the K largest counts of the window that ends with this micro-batch."""

    def top(df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as sf

        end = sf.timestamp_millis(sf.lit(start_ms + (batch_id + 1) * 1000))
        current = df.where(sf.col("window.end") == end)
        current.orderBy(sf.desc("count"), "word").limit(K).collect()

    return top


def structured_batches(progress: list[dict[str, Any]], warmup: int) -> list[Batch]:
    """Batch timings from query progress. Batch b's input is interval b of a 1 s schedule that
    starts with the first measured batch (b = warmup): the rate-micro-batch source admits one
    interval per trigger and never catches up, so a lag left by the (slow) first batches would
    otherwise stay in every later delay; from there on a slow batch delays all later ones."""
    measured = [p for p in progress if p["batchId"] >= warmup]
    if not measured:
        return []
    # The most punctual batch defines the schedule (its scheduling delay is 0).
    zero = min(_started_ms(p) - p["batchId"] * 1000 for p in measured)
    batches = []
    for p in measured:
        start = _started_ms(p)
        due = zero + p["batchId"] * 1000
        processing = p["durationMs"].get("triggerExecution", 0)
        batches.append(
            Batch(due, p["numInputRows"], max(0, start - due), processing, start + processing)
        )
    return batches


SYSTEM_CLASSES: dict[str, type[System]] = {
    "dstream": DStreamSystem,
    "pyspark.streaming": LegacySystem,
    "structured": StructuredSystem,
}
