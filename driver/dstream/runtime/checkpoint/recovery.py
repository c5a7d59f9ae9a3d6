"""Recovery from a checkpoint: a restarted driver checks that the program is the one that wrote
the checkpoint, feeds every recorded input range back to its source, restores state from the
newest readable state checkpoints and finds the batches that were recorded but not committed, which
the scheduler then re-runs before any new batch. It refuses, with every reason named, when exact
recovery is impossible.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import RDD, SparkContext
from pyspark.rdd import Partitioner, portable_hash

from dstream.runtime.checkpoint import durable
from dstream.runtime.checkpoint.directory import (
    CheckpointDir,
    CheckpointMismatchError,
    CheckpointUnrecoverableError,
    LogState,
    compare_signatures,
    verify_state_checkpoint,
)
from dstream.runtime.timeutil import datetime_of

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject

    from dstream.dstream import DStream
    from dstream.runtime.leadership.fencing import Fence
    from dstream.runtime.leadership.shadow import Shadow
    from dstream.runtime.scheduling.graph import DStreamGraph

log = logging.getLogger(__name__)

# What a recovery did, by kind: dstream_recoveries_total{kind} and /v1/status's recoveries.
RECOVERY_KINDS = ("driver_restart", "replayed_batches", "restored_state", "torn_files")


@dataclass
class Recovery:
    """What a restart found in the checkpoint."""

    replayed: list[int]
    restored_state: dict[str, int]
    torn_files: list[str]
    resume_ms: int
    # The batch records of the replayed (recorded, uncommitted) batches, by batch time.
    pending_records: dict[int, dict[str, Any]]


def recovery_counts(recovery: Recovery | None) -> dict[str, int]:
    """Every kind of RECOVERY_KINDS with its count, all zero when the driver started fresh."""
    if recovery is None:
        return dict.fromkeys(RECOVERY_KINDS, 0)
    return {
        "driver_restart": 1,
        "replayed_batches": len(recovery.replayed),
        "restored_state": len(recovery.restored_state),
        "torn_files": len(recovery.torn_files),
    }


def verified_state(sc: SparkContext, path: str) -> JavaObject:
    """A state checkpoint's Java RDD, verified: in the driver against its checksums, or, where
    it has none beside it (HDFS, object stores), by Spark reading that RDD through once, so
    that the read which verified it is the one restored; raises when it is torn."""
    checked = verify_state_checkpoint(path)
    jrdd = sc._jsc.checkpointFile(path)
    if not checked:
        jrdd.count()
    return jrdd


def hash_partitioned_checkpoint(sc: SparkContext, path: str, partitions: int) -> JavaObject:
    """Spark's checkpoint at `path` read as partitioned by this run's `partitionBy`. Spark
    reads back the partitioner it wrote, but PySpark's names the hash function by its `id()`
    in the driver that wrote it, so it never equals a new driver's: the restored state's
    first cogroup or window union with a batch shuffled the whole state again."""
    jvm = sc._jvm
    assert jvm is not None
    partitioner = jvm.org.apache.spark.api.python.PythonPartitioner(partitions, id(portable_hash))
    rdd = jvm.org.apache.spark.rdd.ReliableCheckpointRDD(
        sc._jsc.sc(), path, jvm.scala.Some(partitioner), jvm.scala.reflect.ClassTag.AnyRef()
    )
    return rdd.toJavaRDD()


class CheckpointRecovery:
    """One restart's recovery of a graph from its checkpoint directory (`run` does it)."""

    def __init__(
        self,
        sc: SparkContext,
        graph: DStreamGraph,
        checkpoint: CheckpointDir,
        checkpoint_metadata: Callable[[int], dict[str, Any]] | None,
        fence: Fence | None = None,
        verified: frozenset[str] = frozenset(),
        shadow: Shadow | None = None,
    ):
        self._sc = sc
        self._checkpoint_metadata = checkpoint_metadata  # the graph in force, for a restart
        self._graph = graph
        self._checkpoint = checkpoint
        self._fence = fence
        self._verified = verified  # state checkpoints a standby read through already
        self._shadow = shadow  # the state a standby computed while following (shadow.py)

    def run(self) -> Recovery:
        """Rebuild sources and state from the checkpoint; return the uncommitted batches to re-run."""
        metadata = self._checkpoint.read_metadata() or {}
        self.start_graph(metadata)
        assert self._checkpoint_metadata is not None, "only a recovery that leads runs"
        # The graph in force (restored, or rebuilt by a setup or a job spec) for the next restart.
        self._checkpoint.write_metadata(self._checkpoint_metadata(metadata["zeroMs"]))
        found = self._checkpoint.load_log()
        if self._fence is not None:
            self._fence.check_written(found.newest_epoch)
        self.replay_log(found)
        if found.records:
            positions = found.records[max(found.records)].get("positions", {})
            for source in self._graph.inputs:
                source.restore_position(positions.get(source.name))
        if self._shadow is not None and self._shadow.usable(found):
            restored = self._shadow.take_over(found)
        else:
            if self._shadow is not None:
                self._shadow.discard()
            restored = self.restore_state(found.state_checkpoints(), found.torn)
        self.restore_store_versions(found)
        self.require_replayable(found, restored)
        last = found.last_time if found.last_time is not None else self._graph.zero_ms
        recovery = Recovery(
            found.pending,
            restored,
            found.torn,
            last + self._graph.batch_ms,
            {t: found.records[t] for t in found.pending},
        )
        log.warning(
            "recovered from %s: re-running %d uncommitted batches, state restored for %d streams, "
            "%d torn checkpoint files skipped; resuming at %s",
            self._checkpoint.path,
            len(found.pending),
            len(restored),
            len(found.torn),
            datetime_of(recovery.resume_ms),
        )
        return recovery

    def start_graph(self, metadata: dict[str, Any]) -> None:
        """Start the graph at the checkpoint's zero time and check it is the program that wrote
        the checkpoint. Start first: the saved signature was taken after start() settled
        default intervals."""
        self._graph.start(metadata["zeroMs"])
        self._check_signature(metadata)

    def replay_log(self, found: LogState) -> None:
        """Replay every batch record of the log, oldest first."""
        for time_ms in sorted(found.records):
            self.replay(time_ms, found.records[time_ms])

    def replay(self, time_ms: int, record: dict[str, Any]) -> None:
        """Feed a batch record's input ranges back to the sources and its coalesced times to
        the graph."""
        for source in self._graph.inputs:
            if source.name in record["ranges"]:
                source.replay(time_ms, record["ranges"][source.name])
        self._graph.coalesce(record.get("coalesced", []))

    def _check_signature(self, metadata: dict[str, Any]) -> None:
        """CheckpointMismatchError naming every difference between the saved graph and this one."""
        differences = compare_signatures(metadata.get("graph", []), self._graph.signature())
        if metadata.get("batchMs") != self._graph.batch_ms:
            differences.insert(
                0, f"batch interval was {metadata.get('batchMs')} ms, now {self._graph.batch_ms} ms"
            )
        if differences:
            raise CheckpointMismatchError(
                f"checkpoint {self._checkpoint.path} was written by a different streaming graph:\n"
                + "\n".join(f"  - {d}" for d in differences)
                + "\nrestore the original program, or start fresh (`dstream run --fresh`, or "
                "StreamingContext.getOrCreate(path, setup, fresh=True)), which moves the old "
                "checkpoint aside"
            )

    def restore_state(
        self, candidates: dict[str, list[tuple[int, str]]], torn: list[str]
    ) -> dict[str, int]:
        """Load each stateful stream's newest readable checkpoint; a torn one (added to `torn`)
        falls back to the one before, whose later batches the log still holds. A stream with
        durable batches gets every readable one back (a torn one is recomputed from its source);
        only state streams are counted as restored."""
        restored: dict[str, int] = {}
        for index, checkpoints in candidates.items():
            stream = self._graph.streams[int(index)]
            loaded: list[tuple[int, str]] = []
            data = stream.checkpoint_data
            if data.durable_batches:  # older ones in the log were pruned, not torn
                checkpoints = checkpoints[: data.checkpoints_kept()]
            for time_ms, path in checkpoints:
                rdd = self.read_checkpoint(stream, path, torn)
                if rdd is None:
                    continue
                stream._restore(time_ms, rdd)
                loaded.append((time_ms, path))
                if not data.durable_batches:
                    restored[index] = time_ms
                    break
            for time_ms, path in reversed(loaded):
                data.keep(time_ms, path)
        return restored

    def restore_store_versions(self, found: LogState) -> None:
        """Each state store stream's version in force, as the newest commit lists it: its next
        batch starts from that version, which its tasks load from their executor or the
        checkpoint (a batch re-run now finds the state as of the batch before it)."""
        for index, (listing, since_snapshot) in found.store_versions().items():
            self._graph.streams[int(index)].checkpoint_data.restore_version(listing, since_snapshot)

    def read_checkpoint(self, stream: DStream, path: str, torn: list[str]) -> RDD | None:
        """A state checkpoint as an RDD, verified once (its partitioner back when the stream's
        RDDs are hash-partitioned), or a durable batch checked part by part; None when torn.
        Spark's checkpoints are never changed once written, so a standby's check holds."""
        sc = self._sc
        try:
            if durable.is_durable(path):
                return self._graph.read_durably(sc, path)
            verified = path in self._verified
            jrdd = sc._jsc.checkpointFile(path) if verified else verified_state(sc, path)
        except Exception as error:
            log.warning(
                "checkpoint %s unreadable (%s): not used (an older one, or the source, serves)",
                path,
                str(error).splitlines()[0],
            )
            torn.append(path)
            return None
        rdd = RDD(jrdd, sc, sc.serializer)
        partitions = stream.checkpoint_data.partitions
        if partitions is not None and rdd.getNumPartitions() == partitions:
            rdd = RDD(hash_partitioned_checkpoint(sc, path, partitions), sc, sc.serializer)
            rdd.partitioner = Partitioner(partitions, portable_hash)
        return rdd

    def require_replayable(self, found: LogState, restored: dict[str, int]) -> None:
        """Refuse to go on when exact recovery is impossible, rather than emit wrong results: a
        batch record missing between others (its input is unknown), or a stateful stream with no
        readable state checkpoint while the log no longer reaches back to the first batch."""
        batch = self._graph.batch_ms
        times = sorted(found.records)
        covered = {t for r in found.records.values() for t in r.get("coalesced", [])}
        missing = [
            t
            for a, b in itertools.pairwise(times)
            for t in range(a + batch, b, batch)
            if t not in covered
        ]
        problems = [f"no readable batch record for {datetime_of(t)} ({t})" for t in missing]
        first = min([*times[:1], *covered], default=None)
        log_reaches_start = first is None or first <= self._graph.zero_ms + batch
        if not log_reaches_start:
            problems += [
                f"stream #{s.index} ({type(s).__name__}) has no readable state checkpoint and "
                f"the batch log now starts at {datetime_of(first)}"
                for s in self._graph.streams
                if s.checkpoint_data.required and str(s.index) not in restored
            ]
            problems += [
                f"stream #{s.index} ({type(s).__name__}) keeps its state in a store, but no "
                f"commit in the batch log (it starts at {datetime_of(first)}) lists its version"
                for s in self._graph.streams
                if s.checkpoint_data.versioned and s.checkpoint_data.version_in_force is None
            ]
        if problems:
            raise CheckpointUnrecoverableError(
                f"checkpoint {self._checkpoint.path} cannot be recovered exactly:\n"
                + "\n".join(f"  - {p}" for p in problems)
                + "\nstart fresh (`dstream run --fresh`) to move it aside and begin again"
            )
