"""StreamingContext: pyspark.streaming's entry point, on the engine's own scheduler.

Backpressure is configured as in Spark, through the SparkConf
(`spark.streaming.backpressure.enabled`, `.initialRate`, `.pid.*`, and
`spark.dstream.backpressure.maxRate`, `.maxStep`), so pyspark.streaming programs keep their
settings and spec-driven jobs set the same keys.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from pyspark import RDD, SparkConf, SparkContext, StorageLevel
from pyspark.serializers import CloudPickleSerializer

from dstream.dstream import DStream, MultiTransformedDStream, UnionDStream
from dstream.runtime.checkpoint.directory import (
    METADATA_VERSION,
    CheckpointDir,
    CheckpointMismatchError,
)
from dstream.runtime.control.backpressure import PIDRateEstimator, RateController
from dstream.runtime.control.failure import FailurePolicy
from dstream.runtime.leadership.leader import move_aside_keeping_epoch
from dstream.runtime.scheduling.clock import ManualClock, SystemClock
from dstream.runtime.scheduling.graph import DStreamGraph
from dstream.runtime.scheduling.scheduler import BatchScheduler
from dstream.runtime.shipping import ship_to_workers
from dstream.runtime.timeutil import duration_to_ms
from dstream.sources import (
    BinaryRecordsInputDStream,
    FileInputDStream,
    InputDStream,
    QueueInputDStream,
    RateInputDStream,
    SocketInputDStream,
)

log = logging.getLogger(__name__)
# Settings that describe the process that wrote a checkpoint, not the program: a SparkContext
# re-created from the checkpoint takes them from its own run (as Spark's Checkpoint does).
_PER_RUN_SPARK_KEYS = frozenset(
    {
        "spark.app.id",
        "spark.app.startTime",
        "spark.app.submitTime",
        "spark.driver.host",
        "spark.driver.port",
        "spark.blockManager.port",
        "spark.ui.port",
        "spark.executor.id",
        "spark.kubernetes.driver.pod.name",
        "spark.kubernetes.executor.podNamePrefix",
    }
)


class StreamingContext:
    """Create DStreams, start and stop them; same constructor and methods as pyspark.streaming."""

    _activeContext: ClassVar[StreamingContext | None] = None

    def __init__(
        self,
        sparkContext: SparkContext,
        batchDuration: float = 1,
        *,
        clock: SystemClock | ManualClock | None = None,
    ):
        self._sc = sparkContext
        ship_to_workers(sparkContext)
        self._batch_ms = duration_to_ms(batchDuration)
        self._graph = DStreamGraph(self._batch_ms)
        self._clock = clock or SystemClock()
        self._checkpoint_dir: CheckpointDir | None = None
        self._scheduler: BatchScheduler | None = None
        self._pending_listeners: list[Any] = []
        self._terminated = threading.Event()
        self._error: BaseException | None = None
        self._state = "initialized"
        self.queryStreams: dict[str, DStream] = {}

    # -- construction from a checkpoint ---------------------------------------------------

    @classmethod
    def getOrCreate(
        cls,
        checkpointPath: str,
        setupFunc: Callable[[], StreamingContext],
        fresh: bool = False,
        rebuild: bool = False,
    ) -> StreamingContext:
        """The context of a previous run restored from its checkpoint, as pyspark.streaming
        does: its DStream graph and functions come from the checkpoint and setupFunc is not
        called (the SparkContext too, when none is active). Without a checkpoint, setupFunc()
        with the checkpoint attached. Either way the batch log and state recover at start().

        `rebuild=True` builds the graph with setupFunc even so: for a program whose functions
        changed while its streams stayed the same (checked at start against the checkpoint).
        `fresh=True` moves an existing checkpoint aside first and starts from nothing."""
        if fresh:
            move_aside_keeping_epoch(checkpointPath)
        metadata = CheckpointDir(checkpointPath).read_metadata()
        if metadata is not None and not rebuild:
            if "pickledGraph" in metadata:
                return cls._restore(checkpointPath, metadata)
            log.warning("checkpoint %s holds no graph (version 1): running setup", checkpointPath)
        ssc = setupFunc()
        ssc.checkpoint(checkpointPath)
        return ssc

    @classmethod
    def _restore(cls, checkpointPath: str, metadata: dict[str, Any]) -> StreamingContext:
        """A context around the graph pickled in the checkpoint's metadata."""
        sc = SparkContext._active_spark_context
        if sc is None:
            settings = [(k, v) for k, v in metadata["sparkConf"] if k not in _PER_RUN_SPARK_KEYS]
            sc = SparkContext(conf=SparkConf().setAll(settings))
        try:
            graph, query_streams = CloudPickleSerializer().loads(
                base64.b64decode(metadata["pickledGraph"])
            )
        except Exception as error:
            raise CheckpointMismatchError(
                f"checkpoint {checkpointPath} holds a streaming graph this program cannot load "
                f"({type(error).__name__}: {error}); if only the program's functions changed, "
                "StreamingContext.getOrCreate(path, setup, rebuild=True) builds the graph with "
                "setup again, else fresh=True moves the old checkpoint aside"
            ) from error
        ssc = cls(sc, graph.batch_ms / 1000)
        ssc._graph = graph
        graph.attach(ssc)
        ssc.queryStreams = query_streams
        ssc.checkpoint(checkpointPath)
        return ssc

    def _checkpoint_metadata(self, zero_ms: int) -> dict[str, Any]:
        """What a restart needs beside the batch log: the graph itself (getOrCreate restores
        it), its signature (checked when a program or job spec builds the graph again) and the
        Spark settings (to re-create a SparkContext that the program made in its setup)."""
        pickled = self._graph.pickled(self.queryStreams, self._sc)
        return {
            "version": METADATA_VERSION,
            "zeroMs": zero_ms,
            "batchMs": self._batch_ms,
            "graph": self._graph.signature(),
            "pickledGraph": base64.b64encode(pickled).decode("ascii"),
            "sparkConf": sorted(self._sc._conf.getAll()),
        }

    @classmethod
    def getActive(cls) -> StreamingContext | None:
        return cls._activeContext

    @classmethod
    def getActiveOrCreate(
        cls, checkpointPath: str | None, setupFunc: Callable[[], StreamingContext]
    ) -> StreamingContext:
        if not callable(setupFunc):
            raise TypeError("setupFunc should be callable.")
        active = cls.getActive()
        if active is not None:
            return active
        if checkpointPath is not None:
            return cls.getOrCreate(checkpointPath, setupFunc)
        return setupFunc()

    @property
    def sparkContext(self) -> SparkContext:
        return self._sc

    # -- read-only views for the job service, metrics and the HTTP API ---------------------

    @property
    def batch_interval_ms(self) -> int:
        """The batch interval, in milliseconds."""
        return self._batch_ms

    @property
    def input_streams(self) -> list[InputDStream]:
        """The graph's input streams, in the order they were created."""
        return list(self._graph.inputs)

    @property
    def all_streams(self) -> list[DStream]:
        """Every stream of the graph, in the order they were created."""
        return list(self._graph.streams)

    @property
    def stateful_streams(self) -> list[DStream]:
        """The streams whose RDDs are checkpointed (state, reduced windows, checkpoint())."""
        return self._graph.stateful_streams()

    @property
    def scheduler(self) -> BatchScheduler | None:
        """The batch scheduler, once start() has created it."""
        return self._scheduler

    # -- configuration --------------------------------------------------------------------

    def remember(self, duration: float) -> None:
        """Keep each stream's RDDs for at least `duration` seconds (for slice and queries)."""
        self._graph.remember_ms = duration_to_ms(duration)

    def checkpoint(self, directory: str) -> None:
        """Keep the batch log and state checkpoints in `directory` so a restart can recover."""
        self._checkpoint_dir = CheckpointDir(directory)
        self._checkpoint_dir.state_dir.mkdir(parents=True, exist_ok=True)
        self._sc.setCheckpointDir(str(self._checkpoint_dir.state_dir.resolve()))
        self._graph.checkpoint_path = self._checkpoint_dir.path
        self._graph.state_run_dir = self._sc.getCheckpointDir()

    def registerQueryStream(self, name: str, stream: DStream, retain: float = 60) -> DStream:
        """Name a stream for interactive queries (REST `slice`); its RDDs are kept `retain` s.
        Register it before deriving streams from it: a plain transform is otherwise folded into
        the stream derived from it, and never has RDDs of its own to query."""
        self.queryStreams[name] = stream
        stream._queryable = True
        stream._remember(duration_to_ms(retain))
        return stream

    def addStreamingListener(self, streamingListener: Any) -> None:
        """Listeners get onBatchSubmitted/Started/Completed(event) with event.batchInfo()."""
        if self._scheduler is not None:
            self._scheduler.add_listener(streamingListener)
        else:
            self._pending_listeners.append(streamingListener)

    # -- input streams --------------------------------------------------------------------

    def queueStream(
        self,
        rdds: list[Any],
        oneAtATime: bool = True,
        default: RDD | list[Any] | None = None,
    ) -> DStream:
        """One RDD (or all) from `rdds` per batch; lists are parallelized first."""
        if default is not None and not isinstance(default, RDD):
            default = self._sc.parallelize(default)
        queued = [r if isinstance(r, RDD) else self._sc.parallelize(r) for r in rdds]
        return QueueInputDStream(self, queued, oneAtATime, default)

    def textFileStream(self, directory: str) -> DStream:
        """Lines of files newly created in `directory` (files present at start are skipped)."""
        return FileInputDStream(self, directory, "text", new_files_only=True, name="textFileStream")

    def binaryRecordsStream(self, directory: str, recordLength: int) -> DStream:
        """Records of `recordLength` bytes of files newly created in `directory`, as `bytes`
        (files present at start are skipped); a file whose length is not a multiple of
        recordLength stops the run with a SourceError naming it (BinaryRecordsInputDStream)."""
        return BinaryRecordsInputDStream(self, directory, recordLength)

    def socketTextStream(
        self,
        hostname: str,
        port: int,
        storageLevel: StorageLevel = StorageLevel.MEMORY_AND_DISK_2,
    ) -> DStream:
        """UTF-8 lines from the TCP server at hostname:port, received by the driver from
        start(). Not replayable: a restart loses the lines not yet processed, which start()
        warns of (SocketInputDStream). `storageLevel` is accepted and has no effect: a batch's
        lines stay in the driver until the batch has run."""
        return SocketInputDStream(self, hostname, port)

    def fileStream(self, directory: str, format: str = "text", name: str = "files") -> DStream:
        """Every file in `directory` not yet processed, in name order; format 'text' or 'json'."""
        return FileInputDStream(self, directory, format, new_files_only=False, name=name)

    def rateStream(
        self,
        recordsPerSecond: int,
        partitions: int = 2,
        seed: int = 0,
        recordBytes: int = 100,
        name: str = "rate",
    ) -> DStream:
        """Deterministic text lines at a fixed rate; replays exactly after a restart."""
        return RateInputDStream(self, recordsPerSecond, partitions, seed, recordBytes, name)

    def union(self, *dstreams: DStream) -> DStream:
        if not dstreams:
            raise ValueError("should have at least one DStream to union")
        if len(dstreams) == 1:
            return dstreams[0]
        return UnionDStream(list(dstreams))

    def transform(
        self, dstreams: list[DStream], transformFunc: Callable[[list[RDD]], RDD]
    ) -> DStream:
        return MultiTransformedDStream(list(dstreams), transformFunc)

    # -- running --------------------------------------------------------------------------

    def _rate_controllers(self) -> dict[str, RateController]:
        conf = self._sc._conf
        if conf.get("spark.streaming.backpressure.enabled", "false").lower() != "true":
            return {}

        def number(key: str, default: str | None) -> float | None:
            value = conf.get(key, default)
            return None if value is None else float(value)

        controllers = {}
        for source in self._graph.inputs:
            estimator = PIDRateEstimator(
                self._batch_ms,
                proportional=number("spark.streaming.backpressure.pid.proportional", "1.0"),
                integral=number("spark.streaming.backpressure.pid.integral", "0.2"),
                derivative=number("spark.streaming.backpressure.pid.derived", "0.0"),
                min_rate=number("spark.streaming.backpressure.pid.minRate", "100"),
                max_step=number("spark.dstream.backpressure.maxStep", "2.0"),
            )
            controllers[source.name] = RateController(
                estimator,
                initial_rate=number("spark.streaming.backpressure.initialRate", None),
                max_rate=number("spark.dstream.backpressure.maxRate", None),
            )
        return controllers

    def start(self, *, standby: bool = False) -> None:
        """Start the streams; with a checkpoint from an earlier run, recover from it first.
        With a checkpoint, the graph is pickled into it first: a function that cannot be is
        reported here (GraphNotSerializableError, a Py4JJavaError as in pyspark.streaming).
        A checkpoint is led by one driver at a time (runtime/lease.py): one led by a live
        driver raises CheckpointInUseError, unless `standby`, which waits (following the
        checkpoint) until that driver is gone and then takes over."""
        if self._state == "active":
            raise RuntimeError("StreamingContext has already been started")
        if self._state == "stopped":
            raise RuntimeError("StreamingContext has already been stopped")
        self._scheduler = BatchScheduler(
            self._sc,
            self._graph,
            self._clock,
            self._checkpoint_dir,
            self._rate_controllers(),
            FailurePolicy.from_conf(self._sc._conf),
            report_error=self._report_error,
            checkpoint_metadata=self._checkpoint_metadata,
        )
        for listener in self._pending_listeners:
            self._scheduler.add_listener(listener)
        self._scheduler.start(standby=standby)
        for receiver in self._receivers():
            receiver.start_receiving()
        self._state = "active"
        StreamingContext._activeContext = self

    def _receivers(self) -> list[SocketInputDStream]:
        """The input streams whose records the driver receives while the context runs."""
        return [s for s in self._graph.inputs if isinstance(s, SocketInputDStream)]

    def _report_error(self, error: BaseException) -> None:
        """A failed attempt of a batch, kept for awaitTermination* to raise (the newest one,
        if several came between two calls). The run goes on: the scheduler retries the batch
        or, skipping it, runs later batches; after a BatchFailedError (failure.py) none runs."""
        self._error = error
        self._terminated.set()

    def awaitTermination(self, timeout: float | None = None) -> None:
        """Wait for stop or for a batch error (raised here)."""
        self.awaitTerminationOrTimeout(timeout)

    def awaitTerminationOrTimeout(self, timeout: float | None) -> bool:
        """True once stopped, False when the timeout elapsed; raises the error of a failed batch."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            stopped = self._terminated.wait(remaining)
            if self._error is not None:
                error, self._error = self._error, None
                if self._state != "stopped":
                    self._terminated.clear()
                raise error
            if stopped or remaining == 0.0:
                return stopped

    def stop(self, stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        """Stop after the running batch has finished and committed (gracefully or not: a batch cut
        short would only be replayed). Batch times already due but not started have no batch
        record yet; with a checkpoint, the next start runs them."""
        if self._state == "stopped":
            return
        if self._scheduler is not None:
            self._scheduler.stop()
            for receiver in self._receivers():
                receiver.stop_receiving()
        self._graph.finish_rdd_writes()
        self._state = "stopped"
        if StreamingContext._activeContext is self:
            StreamingContext._activeContext = None
        self._terminated.set()
        if stopSparkContext:
            self._sc.stop()
