"""The DStream graph: every stream in definition order, its inputs and outputs, and zero time.

Definition order gives each stream a stable index, which is how a restarted program's streams are
matched with the state checkpoints of the previous run (the signature must agree).

The graph is pickled into the checkpoint metadata (with cloudpickle, as pyspark.streaming pickles
its DStreams' functions), so `StreamingContext.getOrCreate` restores the program without running
its setup again. What only makes sense in one run (the SparkContext, RDDs, accumulators, locks)
is left out and re-created when the restored graph is attached to the new run's context.

The graph (and recovery, runtime/recovery.py) drives its streams through their underscore
methods (`_initialize`, `_remember`, `_clear_metadata`, `_attach`, `_restore`), as Spark's
DStreamGraph drives DStream's private[streaming] ones: they stay out of the names a
pyspark.streaming program sees. What a stream's checkpointing needs, including the writes of
its RDDs still pending, is its `checkpoint_data` (runtime/checkpoint_data.py); the graph starts
those writes, since it knows where the checkpoint is, and asks each stream's data which have
completed.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from py4j.protocol import Py4JJavaError
from pyspark import RDD, Accumulator, SparkContext
from pyspark.accumulators import AccumulatorParam
from pyspark.serializers import CloudPickleSerializer

from dstream.runtime.checkpoint import durable
from dstream.runtime.checkpoint.directory import CheckpointUnrecoverableError

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.dstream import DStream, OutputDStream
    from dstream.sources import InputDStream

_PICKLER = CloudPickleSerializer()
log = logging.getLogger(__name__)


class GraphNotSerializableError(Py4JJavaError):
    """A graph with a function that cannot be pickled, found at start() when checkpointing.

    pyspark.streaming raises py4j's Py4JJavaError there (the JVM fails to serialize the Python
    function while validating the checkpoint); this is the same type, carrying a real
    java.io.IOException, so code written against pyspark.streaming catches it unchanged. Unlike
    pyspark's, the message names the operation and the program line that created the stream."""

    def __init__(self, message: str, sc: SparkContext):
        jvm = sc._jvm
        assert jvm is not None
        super().__init__(
            "An error occurred while calling StreamingContext.start",
            jvm.java.io.IOException(message),
        )
        self.message = message

    def __str__(self) -> str:
        return f"{self.errmsg}: java.io.IOException: {self.message}"


@dataclass
class StoredRDD:
    """An RDD a stream holds (an initialRDD), kept in the checkpoint as pickle files that the
    executors write (`RDD.saveAsPickleFile`): its records never pass through the driver."""

    path: str
    partitions: int


@dataclass
class FreshAccumulator:
    """An accumulator a stream holds: a restored run counts again from zero."""

    zero: Any
    param: AccumulatorParam


# The attribute by which an RDD remembers where the checkpoint keeps it (one write per RDD).
_STORED_AS = "_dstream_stored_as"
# The attribute of an RDD reading a durable batch back: its reader (durable.PartReader).
READ_BY = "_dstream_read_by"


def detached(value: Any, store: Callable[[RDD], StoredRDD]) -> Any:
    """`value` as a stream's attribute is pickled: RDDs as what `store` made of them,
    accumulators as fresh ones."""
    if isinstance(value, RDD):
        return getattr(value, _STORED_AS, None) or store(value)
    if isinstance(value, Accumulator):
        return FreshAccumulator(value.accum_param.zero(value.value), value.accum_param)
    if isinstance(value, list):
        return [detached(v, store) for v in value]
    if isinstance(value, dict):
        return {k: detached(v, store) for k, v in value.items()}
    return value


def attached(value: Any, sc: SparkContext) -> Any:
    """The inverse of detached, in the restored run's SparkContext. An RDD whose files the
    previous run did not finish writing (it died within seconds of its first start) is
    refused by name: without it the stream's state would silently start from nothing."""
    if isinstance(value, StoredRDD):
        if not (Path(value.path) / "_SUCCESS").exists():
            raise CheckpointUnrecoverableError(
                f"{value.path}: an RDD the program's streams hold (an initialRDD) was not "
                "completely written to the checkpoint before the previous run ended; start "
                "fresh (getOrCreate(..., fresh=True), dstream run --fresh)"
            )
        rdd = sc.pickleFile(value.path, value.partitions)
        setattr(rdd, _STORED_AS, value)
        return rdd
    if isinstance(value, FreshAccumulator):
        return sc.accumulator(value.zero, value.param)
    if isinstance(value, list):
        return [attached(v, sc) for v in value]
    if isinstance(value, dict):
        return {k: attached(v, sc) for k, v in value.items()}
    return value


class DStreamGraph:
    def __init__(self, batch_ms: int):
        self.batch_ms = batch_ms
        self.zero_ms = 0
        self.streams: list[DStream] = []
        self.inputs: list[InputDStream] = []
        self.outputs: list[OutputDStream] = []
        self.remember_ms = 0
        self.checkpoint_path: Path | None = None
        # this run's directory under the checkpoint's state/ (Spark's checkpoint directory,
        # read once when set: each read is several py4j calls)
        self.state_run_dir: str | None = None
        self._deadletter_fallback: Path | None = None
        self.coalesced: set[int] = set()  # batch times merged into a later batch (scheduler.py)
        # A standby computing its leader's batches (shadow.py): it writes no state checkpoint
        # and no durable batch, as the leader writes them into the same checkpoint.
        self.shadowing = False
        self._rdd_writes: list[threading.Thread] = []
        self._hash_partitioned: dict[int, RDD] = {}  # an empty RDD per partition count

    # -- pickling into the checkpoint -----------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The program's part: streams, inputs, outputs and spans; not this run's bookkeeping."""
        keep = ("batch_ms", "streams", "inputs", "outputs", "remember_ms")
        return {key: self.__dict__[key] for key in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["batch_ms"])
        self.__dict__.update(state)

    def pickled(self, extra: Any, sc: SparkContext) -> bytes:
        """cloudpickle of (graph, extra); GraphNotSerializableError names the stream at fault."""
        try:
            return _PICKLER.dumps((self, extra))
        except Exception as error:
            raise GraphNotSerializableError(self._unpicklable(error), sc) from error

    def store_rdd(self, rdd: RDD) -> StoredRDD:
        """Where the checkpoint keeps an RDD a stream holds. Its executors write it in a Spark
        job of its own, started here and awaited by `finish_rdd_writes`, so start() pickles
        the graph without waiting for the records or collecting them to the driver."""
        assert self.checkpoint_path is not None, "RDDs are stored only into a checkpoint"
        stored = StoredRDD(
            str(self.checkpoint_path.resolve() / "rdds" / uuid.uuid4().hex), rdd.getNumPartitions()
        )
        setattr(rdd, _STORED_AS, stored)
        writer = threading.Thread(
            target=_write_rdd, args=(rdd, stored.path), name="dstream-rdd-writer", daemon=True
        )
        writer.start()
        self._rdd_writes.append(writer)
        return stored

    def finish_rdd_writes(self) -> None:
        """Wait for the stored RDDs' writes, so a stopped run leaves a complete checkpoint."""
        while self._rdd_writes:
            self._rdd_writes.pop().join()

    def _unpicklable(self, error: Exception) -> str:
        """Which operation's function failed: streams in definition order, so the first that
        fails alone is the culprit (its parents pickled fine before it), then its attributes."""
        for stream in self.streams:
            for key, value in stream.__getstate__().items():
                try:
                    _PICKLER.dumps(value)
                except Exception as value_error:
                    what = "the function given to" if callable(value) else f"`{key}` of"
                    reason = str(value_error).rstrip(".")
                    return (
                        f"DStream checkpointing is enabled but {what} {stream._origin} "
                        f"(stream #{stream.index}, {type(stream).__name__}) cannot be "
                        f"serialized: {reason}. Functions of a streaming graph are saved with "
                        "the checkpoint; they must not capture the SparkContext, the "
                        "StreamingContext or an RDD (use rdd.context inside the function)."
                    )
        return f"DStream checkpointing is enabled but the graph cannot be serialized: {error}"

    def attach(self, ssc: StreamingContext) -> None:
        """Bind a graph restored from a checkpoint to the new run's StreamingContext."""
        for stream in self.streams:
            stream._attach(ssc)

    def add_stream(self, stream: DStream) -> int:
        self.streams.append(stream)
        return len(self.streams) - 1

    def add_input(self, stream: InputDStream) -> None:
        if any(existing.name == stream.name for existing in self.inputs):
            stream.name = f"{stream.name}-{len(self.inputs)}"
        self.inputs.append(stream)

    def add_output(self, stream: OutputDStream) -> None:
        self.outputs.append(stream)

    def signature(self) -> list[dict[str, Any]]:
        return [s.signature() for s in self.streams]

    def stateful_streams(self) -> list[DStream]:
        return [s for s in self.streams if s._checkpoint_ms]

    def start(self, zero_ms: int) -> None:
        """Fix zero time, checkpoint intervals and remember spans; called once before batch 1."""
        if not self.outputs:
            raise ValueError("No output operations registered, so nothing to execute")
        self.zero_ms = zero_ms
        for stream in self.streams:
            stream._initialize()
        for output in self.outputs:
            output._remember(max(self.remember_ms, self.batch_ms))

    def max_remember_ms(self) -> int:
        return max((s.remember_ms for s in self.streams), default=self.batch_ms)

    def coalesce(self, times: list[int]) -> None:
        """These batch times are not batches: no stream has an RDD for them, and stateful
        streams step from the last batch that ran (DStream._previous_time)."""
        self.coalesced.update(times)

    def clear_metadata(self, time_ms: int) -> None:
        for stream in self.streams:
            stream._clear_metadata(time_ms)
        horizon = time_ms - self.max_remember_ms()
        for source in self.inputs:
            source.forget_before(horizon)
        self.coalesced = {t for t in self.coalesced if t >= horizon}

    def forget_state(self) -> None:
        """Drop (and unpersist) every RDD the streams hold and the checkpoints they keep in
        force: a standby's shadow given up, before recovery restores state from the checkpoint."""
        for stream in self.streams:
            stream._forget()
            stream.checkpoint_data.forget_in_force()

    # -- state checkpoints --------------------------------------------------------------

    @property
    def writes_checkpoints(self) -> bool:
        """Whether the streams' RDDs are written to the job's checkpoint (state checkpoints,
        durable batches): when it has one and this driver is not shadowing its leader."""
        return self.checkpoint_path is not None and not self.shadowing

    def mark_for_checkpoint(self, stream: DStream, rdd: RDD, time_ms: int) -> None:
        """Checkpoint to reliable storage when the job has a checkpoint path, else locally."""
        if self.checkpoint_path is not None:
            rdd.checkpoint()
        else:
            rdd.localCheckpoint()
        stream.checkpoint_data.marked(rdd, time_ms)

    def write_durably(self, stream: DStream, rdd: RDD, time_ms: int) -> RDD:
        """`rdd` passing through a task-side writer of its partitions (durable.py): the
        batch's output job writes it, no second job. Its directory takes a number that the
        context hands out as an RDD id, so it never meets a directory Spark names after an
        RDD's id beside it; `rdd.id()` would create `rdd`'s JVM RDD (a pickled function and
        about fifteen py4j calls, each batch) only for its id, as the writing RDD's tasks
        compute `rdd` in their own pipeline."""
        assert self.state_run_dir is not None, "durable batches are written into a checkpoint"
        directory = f"{self.state_run_dir}/rdd-{rdd.context._jsc.sc().newRddId()}"
        writer = durable.PartWriter(directory, _partition_count(rdd))
        written = rdd.mapPartitionsWithIndex(writer, preservesPartitioning=True)
        stream.checkpoint_data.writing(written, time_ms, writer)
        return written

    def write_missing_parts(self) -> None:
        """Run a job for the durable partitions and state store versions the batch's outputs
        did not compute (an output that took a few records), as Spark's checkpoint runs its
        own job."""
        pending = [write for s in self.streams for write in s.checkpoint_data.unwritten()]
        for rdd, writer in pending:
            missing = writer.missing()
            if missing:
                rdd.context.runJob(rdd, _drain, missing)
        for stream in self.streams:
            stream.checkpoint_data.versions_written()

    def read_durably(self, sc: SparkContext, directory: str, partitions: int | None = None) -> RDD:
        """A durable batch read back, hash-partitioned as written: each task reads its own
        part. Its parts are checked in the driver first unless `partitions` is given (this
        run's own tasks have just written them whole: a task reading one checks it anyway).
        The partitioner comes from an empty shuffle, so a window unites it with its other
        batches without moving records. Its reader is kept on the Python side (`READ_BY`),
        for a window's step to read the parts in its own tasks; naming the RDD in Spark would
        create its JVM RDD, which no job runs."""
        if partitions is None:
            partitions = durable.check_parts(directory)
        reader = durable.PartReader(directory, partitions)
        nothing = self._nothing(sc, partitions)
        rdd = nothing.mapPartitionsWithIndex(reader, preservesPartitioning=True)
        setattr(rdd, READ_BY, reader)
        return rdd

    def _nothing(self, sc: SparkContext, partitions: int) -> RDD:
        """An empty RDD hash-partitioned over `partitions`, made once per run and partition
        count: the shuffle that gives it its partitioner runs once, and every durable batch
        read after it (one a batch in steady state) skips that stage."""
        nothing = self._hash_partitioned.get(partitions)
        if nothing is None or nothing.context is not sc:
            nothing = sc.parallelize([], partitions).partitionBy(partitions)
            self._hash_partitioned[partitions] = nothing
        return nothing

    def completed_checkpoints(self) -> dict[str, dict[str, Any]]:
        """State checkpoints written since the last call: {stream index: {time, path}}."""
        done: dict[str, dict[str, Any]] = {}
        for stream in self.streams:
            for time_ms, path in stream.checkpoint_data.completed():
                done[str(stream.index)] = {"time": time_ms, "path": path}
                if stream.checkpoint_data.durable_batches:
                    stream._read_back(time_ms, lambda rdd, path=path: self._reread(rdd, path))
        return done

    def _reread(self, written: RDD, directory: str) -> RDD:
        """The durable batch that `written` has just written whole, read from its parts."""
        return self.read_durably(written.context, directory, _partition_count(written))

    def committed_versions(self, time_ms: int) -> dict[str, dict[str, Any]]:
        """The state store versions the batch at `time_ms` wrote whole, for its commit marker
        to list: {stream index: {time, token, snapshot}}; from now on each is in force."""
        versions = {}
        for stream in self.streams:
            listing = stream.checkpoint_data.committed_version(time_ms)
            if listing is not None:
                versions[str(stream.index)] = listing
        return versions

    def state_paths_in_force(self) -> set[str]:
        return {path for s in self.streams for _time, path in s.checkpoint_data.in_force}

    def oldest_checkpoint_in_force(self) -> int | None:
        times = [
            s.checkpoint_data.in_force[0][0] for s in self.streams if s.checkpoint_data.in_force
        ]
        return min(times) if times else None

    def log_needed_from(self, committed_ms: int) -> int | None:
        """The oldest batch time whose log entry a restart after the batch `committed_ms` may
        still need: back to the oldest state checkpoint kept, minus the longest window. None
        while a stateful stream has no checkpoint in force (the whole log is needed)."""
        if any(not s.checkpoint_data.in_force for s in self.stateful_streams()):
            return None
        oldest = self.oldest_checkpoint_in_force()
        anchor = oldest if oldest is not None else committed_ms
        return anchor - self.max_remember_ms() - self.batch_ms

    def keeps_checkpoint(self, rdd: RDD) -> bool:
        """RDDs marked for a checkpoint not yet written must stay cached (whichever stream
        forgets them: a stream may hold its parent's RDD)."""
        return any(s.checkpoint_data.pending(rdd) for s in self.streams)

    def deadletter_dir(self, time_ms: int) -> str:
        """Where malformed records of a batch go (under the checkpoint, else a temp dir)."""
        if self.checkpoint_path is not None:
            base = self.checkpoint_path / "deadletter"
        else:
            if self._deadletter_fallback is None:
                self._deadletter_fallback = Path(tempfile.mkdtemp(prefix="dstream-deadletter-"))
            base = self._deadletter_fallback
        return str(base / f"batch-{time_ms}")


def _partition_count(rdd: RDD) -> int:
    """From the partitioner when it is known (a reduction's is), without asking the JVM."""
    return rdd.partitioner.numPartitions if rdd.partitioner is not None else rdd.getNumPartitions()


def _drain(records: Any) -> list[Any]:
    for _record in records:
        pass
    return []


def _write_rdd(rdd: RDD, path: str) -> None:
    """An RDD's pickle files; a failure is logged, and a restore names the unfinished path."""
    try:
        rdd.saveAsPickleFile(path)
    except Exception:
        log.exception("writing an RDD a stream holds to %s failed", path)
