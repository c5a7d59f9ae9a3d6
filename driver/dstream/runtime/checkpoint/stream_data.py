"""What checkpointing one stream's RDDs needs to know, held by the stream (as Spark's
DStreamCheckpointData) and set only through its methods: the streams that carry state (state,
reduced windows) call `require`, a reduced window calls `keep_durable` on its parent, the graph
records the writes it starts (`marked`, `writing`) and asks each stream's data which of them
have completed, the graph and recovery record the checkpoints in force with `keep`, and the
graph, the scheduler and recovery read the result instead of attributes set on other objects.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from dstream.runtime.checkpoint.durable import PartWriter, missing_parts

if TYPE_CHECKING:
    from pyspark import RDD


class CheckpointData:
    """One stream's checkpoint needs: whether it must be checkpointed (it carries state from
    batch to batch), how many of its batches are written durably and kept (a reduced window
    subtracts them after a restart), how many hash partitions its restored RDDs have, and its
    checkpoints in force (the newest it keeps, which pruning must leave in place), and the
    writes of its RDDs this run started that have not completed yet."""

    def __init__(self) -> None:
        self._required = False
        self._durable_batches = 0
        self._partitions: int | None = None
        self._in_force: list[tuple[int, str]] = []
        self._run_only()

    def _run_only(self) -> None:
        """What belongs to this run alone: the pending writes (keyed by the RDD's id) and the
        lock that guards them against the batch threads and the scheduler's commit."""
        self._lock = threading.Lock()
        self._marked: dict[int, tuple[RDD, int]] = {}
        self._writing: dict[int, tuple[RDD, int, PartWriter]] = {}

    def __getstate__(self) -> dict[str, object]:
        """Pickled with the graph, without the checkpoints in force or pending: a restarted
        driver finds those in the batch log, not in the graph it pickled at its start."""
        run_only = ("_lock", "_marked", "_writing")
        return {k: v for k, v in self.__dict__.items() if k not in run_only} | {"_in_force": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restored with the graph: no write of this run is pending yet."""
        self.__dict__.update(state)
        self._run_only()

    def require(self, partitions: int) -> None:
        """The stream carries state: it is checkpointed at its interval (10 s by default) and a
        restored checkpoint gets back its hash partitioner over `partitions`."""
        self._required = True
        self._partitions = partitions

    def keep_durable(self, batches: int, partitions: int) -> None:
        """A reduced window subtracts this stream's batches: write each one durably and keep
        the newest `batches` (the most any window over it asks for); they are reduced by key
        into `partitions`, which a restored one gets back as its partitioner."""
        self._durable_batches = max(self._durable_batches, batches)
        self._partitions = partitions

    @property
    def required(self) -> bool:
        """Whether the stream must have a state checkpoint to be recovered exactly."""
        return self._required

    @property
    def durable_batches(self) -> int:
        """How many of its newest batches are written durably and kept (0: none)."""
        return self._durable_batches

    @property
    def partitions(self) -> int | None:
        """The hash partition count of its RDDs, when checkpointing depends on it."""
        return self._partitions

    @property
    def in_force(self) -> tuple[tuple[int, str], ...]:
        """(batch time, path) of its checkpoints in force, oldest first."""
        return tuple(self._in_force)

    def marked(self, rdd: RDD, time_ms: int) -> None:
        """`rdd`, the stream's RDD of `time_ms`, is marked for Spark's checkpoint (written by
        the first job that computes it)."""
        with self._lock:
            self._marked[id(rdd)] = (rdd, time_ms)

    def writing(self, rdd: RDD, time_ms: int, writer: PartWriter) -> None:
        """`rdd`, the stream's RDD of `time_ms`, writes its partitions durably through
        `writer` as its tasks compute them."""
        with self._lock:
            self._writing[id(rdd)] = (rdd, time_ms, writer)

    def unwritten(self) -> list[tuple[RDD, PartWriter]]:
        """The durable writes started and not yet completed, with their writers."""
        with self._lock:
            return [(rdd, writer) for rdd, _time, writer in self._writing.values()]

    def pending(self, rdd: RDD) -> bool:
        """Whether `rdd` is marked for a checkpoint not yet written (it must stay cached)."""
        with self._lock:
            return id(rdd) in self._marked

    def completed(self) -> list[tuple[int, str]]:
        """(batch time, path) of the writes completed since the last call, durable writes
        first (complete when all their parts are), each now in force."""
        done: list[tuple[int, str]] = []
        with self._lock:
            for key, (_rdd, time_ms, writer) in list(self._writing.items()):
                if not missing_parts(writer.directory, writer.partitions):
                    del self._writing[key]
                    done.append((time_ms, writer.directory))
            for key, (rdd, time_ms) in list(self._marked.items()):
                if rdd.isCheckpointed():
                    del self._marked[key]
                    path = rdd.getCheckpointFile()
                    if path:
                        done.append((time_ms, path))
            for time_ms, path in done:
                self.keep(time_ms, path)
        return done

    def keep(self, time_ms: int, path: str) -> None:
        """A checkpoint of the stream is complete: it is in force, and the oldest beyond
        `checkpoints_kept()` no longer are."""
        self._in_force.append((time_ms, path))
        del self._in_force[: -self.checkpoints_kept()]

    def forget_in_force(self) -> None:
        """No checkpoint is in force any more (a standby's shadow given up: recovery keeps
        them again as it restores them)."""
        self._in_force.clear()

    def checkpoints_kept(self) -> int:
        """How many of its newest checkpoints stay in force: two for state (if the newest is
        torn, the older serves), or every batch a restarted window may still subtract."""
        return max(2, self._durable_batches)
