"""From a StreamingJob spec to a running StreamingContext: Spark settings, source, app and sink.

The CLI (`dstream run`) and the Kubernetes driver entrypoint (`python -m dstream.service.driver`) both go
through `JobRuntime`, so a manifest behaves the same on a laptop and on a cluster.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from pyspark import SparkConf, SparkContext

from dstream.connectors import create_sink, create_source
from dstream.context import StreamingContext
from dstream.runtime.control.failure import BatchFailedError
from dstream.runtime.leadership.fencing import DeposedError
from dstream.runtime.leadership.leader import move_aside_keeping_epoch
from dstream.runtime.scheduling import pools, timeline
from dstream.runtime.scheduling.batch import BatchInfo
from dstream.runtime.scheduling.scheduler import BatchScheduler
from dstream.runtime.state import memory as state_storage
from dstream.runtime.state import partition as state_store
from dstream.runtime.task_errors import raised_in_task
from dstream.service import executor_owner, jvm_archive
from dstream.service.apps import build_app
from dstream.service.metrics import StreamingMetrics
from dstream.sources import SourceError
from dstream.spec import StateStore, StreamingJob, duration_ms
from dstream.worker import pydaemon

log = logging.getLogger(__name__)


def spark_conf(job: StreamingJob, master: str | None, extra: dict[str, str]) -> SparkConf:
    """Spark settings the spec implies, then the spec's sparkConf, then command-line overrides;
    the JVMs' class archive, if the installation has one, added to their options; in a pod, its
    executors owned by it (executor_owner); the executors' JVMs without C2, and on Kubernetes
    the driver's."""
    spec = job.spec
    settings: dict[str, str] = {
        **pydaemon.SPARK_CONF,
        **pools.SPARK_CONF,
        **state_storage.SPARK_CONF,
        "spark.app.name": f"dstream-{job.metadata.name}",
        "spark.ui.showConsoleProgress": "false",
        # On Kubernetes Spark holds a new SparkContext back until 80% of its executors have
        # registered (for up to 30 s); a restarted driver takes the lead and reads its log
        # meanwhile instead, and its first tasks wait for the executors as they register.
        "spark.scheduler.minRegisteredResourcesRatio": "0",
        "spark.streaming.backpressure.enabled": str(spec.backpressure.enabled).lower(),
        "spark.streaming.backpressure.pid.proportional": str(spec.backpressure.pid.proportional),
        "spark.streaming.backpressure.pid.integral": str(spec.backpressure.pid.integral),
        "spark.streaming.backpressure.pid.derived": str(spec.backpressure.pid.derivative),
        "spark.streaming.backpressure.pid.minRate": str(spec.backpressure.min_rate),
        "spark.dstream.backpressure.maxStep": str(spec.backpressure.max_step),
        "spark.dstream.failurePolicy.retries": str(spec.failure_policy.retries),
        "spark.dstream.failurePolicy.backoffSeconds": str(spec.failure_policy.backoff_seconds),
        "spark.dstream.failurePolicy.onExhausted": spec.failure_policy.on_exhausted,
        "spark.speculation": str(spec.speculation.enabled).lower(),
        "spark.speculation.multiplier": str(spec.speculation.multiplier),
        "spark.speculation.quantile": str(spec.speculation.quantile),
    }
    settings.update(state_store_settings(spec.state))
    if spec.backpressure.initial_rate is not None:
        settings["spark.streaming.backpressure.initialRate"] = str(spec.backpressure.initial_rate)
    if spec.backpressure.max_rate is not None:
        settings["spark.dstream.backpressure.maxRate"] = str(spec.backpressure.max_rate)
    settings.update(spec.spark_conf)
    settings.update(extra)
    conf = SparkConf().setAll(list(jvm_archive.with_archive(settings).items()))
    conf.setMaster(master or conf.get("spark.master", "local[2]"))
    conf.setAll(list(executor_owner.owner_settings(conf.getAll()).items()))
    return conf.setAll(list(jit_settings(conf.getAll()).items()))


def state_store_settings(state: StateStore) -> dict[str, str]:
    """The spec's `state` block as the SparkConf keys a program sets (runtime/state)."""
    settings = {
        state_store.STORE_KEY: state.store,
        state_store.MEMORY_MB_KEY: str(state.memory_mb),
        state_store.SNAPSHOT_INTERVAL_KEY: str(state.snapshot_interval),
    }
    if state.local_dir is not None:
        settings[state_store.LOCAL_DIR_KEY] = state.local_dir
    return settings


# HotSpot's quick compiler only (C1, no C2); a job's own option after it wins, as the JVM takes
# the last.
QUICK_JIT = "-XX:TieredStopAtLevel=1"


def jit_settings(conf: list[tuple[str, str]]) -> dict[str, str]:
    """The executors' JVMs, and on Kubernetes the driver's, compile with C1 only. After a restart
    C2 competes for the cores with everything else a new executor does before its first commit,
    and it bought no steady-state speed for dstream's jobs, whose records are handled in Python
    while the JVM moves their bytes (bench/results/2026-11-27-recovery.md, "The executors' JVMs
    without C2"). In local mode the driver's JVM runs the tasks and keeps both compilers."""
    settings = dict(conf)
    keys = ["spark.executor.extraJavaOptions"]
    if settings.get("spark.master", "").startswith("k8s://"):
        keys.append("spark.driver.extraJavaOptions")
    return {key: f"{QUICK_JIT} {settings.get(key, '')}".strip() for key in keys}


def build_context(job: StreamingJob, sc: SparkContext) -> StreamingContext:
    """The job's graph: source -> app -> sink, with its checkpoint attached."""
    spec = job.spec
    ssc = StreamingContext(sc, spec.batch_interval_ms / 1000)
    if spec.checkpoint is not None:
        ssc.checkpoint(spec.checkpoint.path)
    source = create_source(ssc, spec.source)
    outputs = build_app(ssc, source, spec.app)
    if spec.checkpoint is not None and spec.checkpoint.interval is not None:
        interval_s = duration_ms(spec.checkpoint.interval) / 1000
        for stream in ssc.all_streams:
            if stream.checkpoint_data.required:
                stream.checkpoint(interval_s)
    for index, output in enumerate(outputs):
        output.foreachRDD(create_sink(job, index))
    return ssc


def ignore_sigterm_in_jvm(sc: SparkContext) -> None:
    """Kubernetes, like `kill -TERM -<pgid>`, signals every process of the driver, the Spark JVM
    included, whose default handler runs the shutdown hooks that stop the SparkContext and cancel
    the running batch. The Python driver owns the stop instead: it lets the batch finish and
    commit, then stops Spark itself. The JVM still exits when the Python process dies (it reads
    its stdin until EOF), and SIGKILL still reaches it."""
    signal = sc._jvm.sun.misc.Signal
    signal.handle(signal("TERM"), sc._jvm.sun.misc.SignalHandler.SIG_IGN)


def is_source_error(error: BaseException) -> bool:
    """A SourceError, raised on the driver or in a task (where Spark hands it back as text)."""
    return raised_in_task(error, SourceError) is not None


def source_error_text(error: BaseException) -> str:
    """The SourceError's own message, without Spark's stack traces around it."""
    message = raised_in_task(error, SourceError)
    return str(error) if message is None else message


class ProgressPrinter:
    """One line per completed batch: time, records, delays, rate limit (the demo's view)."""

    def onBatchCompleted(self, event: Any) -> None:
        info: BatchInfo = event.batchInfo()
        limits = [f"{r:,.0f}/s" for r in info.rate_limits.values() if r is not None]
        parts = [
            f"batch {info.batchTime():%H:%M:%S}",
            f"{info.numRecords():>8,} records",
            f"processing {info.processingDelay() / 1000:5.2f} s",
            f"scheduling delay {info.schedulingDelay() / 1000:5.2f} s",
            f"rate limit {', '.join(limits) if limits else 'none'}",
        ]
        if info.kind != "live":
            parts.append(info.kind)
        if info.coalesced:
            parts.append(f"{len(info.coalesced)} late batch times coalesced")
        if info.error:
            parts.append(f"FAILED: {info.error}")
        print(" | ".join(parts), flush=True)


class JobRuntime:
    """A running job: its SparkContext, StreamingContext and the state the API reports."""

    def __init__(
        self,
        job: StreamingJob,
        master: str | None = None,
        conf: dict[str, str] | None = None,
        fresh: bool = False,
    ):
        self.job = job
        self.fresh = fresh
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        timeline.mark_process_started()
        settings = spark_conf(job, master, conf or {})
        SparkContext._ensure_initialized(conf=settings)  # the JVM, timed apart from the context
        timeline.mark("jvm_up")
        self.sc = SparkContext.getOrCreate(settings)
        timeline.mark("sparkcontext_up")
        timeline.watch_executors(self.sc)
        self.sc.setLogLevel(os.environ.get("DSTREAM_SPARK_LOG_LEVEL", "WARN"))
        ignore_sigterm_in_jvm(self.sc)
        if fresh and job.spec.checkpoint is not None:
            move_aside_keeping_epoch(job.spec.checkpoint.path)
        self.ssc = build_context(job, self.sc)
        self.metrics = StreamingMetrics(job.metadata.name, self.ssc)
        self.ssc.addStreamingListener(self.metrics)
        self.started_at = time.time()
        self.stop_requested = False

    @property
    def scheduler(self) -> BatchScheduler | None:
        return self.ssc.scheduler

    def start(self, standby: bool = False) -> None:
        """Start the job; as a `standby`, first wait for the lead of its checkpoint."""
        self.ssc.start(standby=standby)

    def run_until_stopped(self, duration_s: float | None = None) -> None:
        """Block until a stop is requested or `duration_s` passes. A batch that failed for good
        (BatchFailedError) stops the job and is raised, as a SourceError when its cause is the
        input (unreachable or lost): going on would quietly change the job's output. A failed
        attempt of a batch that is being retried, or skipped, is logged. A newer driver taking
        the checkpoint over (DeposedError) stops the job and is raised."""
        deadline = None if duration_s is None else time.monotonic() + duration_s
        while not self.stop_requested:
            if deadline is not None and time.monotonic() >= deadline:
                break
            try:
                if self.ssc.awaitTerminationOrTimeout(0.5):
                    break
            except DeposedError:
                self.stop()
                raise
            except BatchFailedError as error:
                self.stop()
                cause = error.__cause__
                if isinstance(cause, DeposedError):
                    raise cause from None
                if cause is not None and is_source_error(cause):
                    raise SourceError(source_error_text(cause)) from error
                raise
            except Exception as error:
                log.error("batch failed: %s", error)
        self.stop()

    def stop(self) -> None:
        """Graceful: the running batch completes and commits, then Spark stops. A job that
        runs with a standby hands the lead over first, so that the standby's takeover does
        not wait for this batch (or, when the batch outlasts the pod's grace period, for the
        lease to expire); the batch then commits only if it gets there before the standby."""
        self.metrics.close()
        if self.job.spec.driver.standby and self.scheduler is not None:
            self.scheduler.hand_over()
        self.ssc.stop(stopSparkContext=True, stopGraceFully=True)
