"""What checkpointing one stream's RDDs needs to know, held by the stream (as Spark's
DStreamCheckpointData) and set only through its methods: the streams that carry state (state,
reduced windows) call `require`, a reduced window calls `keep_durable` on its parent, the graph
records the writes it starts (`marked`, `writing`) and asks each stream's data which of them
have completed, the graph and recovery record the checkpoints in force with `keep`, and the
graph, the scheduler and recovery read the result instead of attributes set on other objects.
A stream whose state lives in a state store (runtime/state) calls `require_versions` and
records each batch's version write (`versioning`); the batch's commit lists the version, which
is then the one in force: the next batch starts from it, and recovery restores it from the log.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from dstream.runtime.checkpoint.durable import PartWriter

if TYPE_CHECKING:
    from pyspark import RDD


class VersionWrite(Protocol):
    """A batch's write of a version of a stream's state store, as its tasks do it (such as
    runtime/state/mapping.py's steps)."""

    def missing(self) -> list[int]:
        """The partitions whose part of the version is not written yet."""
        ...

    def listing(self) -> dict[str, Any]:
        """What the batch's commit marker lists of the version: its `time`, `token` and
        whether it was `snapshot`."""
        ...


class CheckpointData:
    """One stream's checkpoint needs: whether it must be checkpointed (it carries state from
    batch to batch), how many of its batches are written durably and kept (a reduced window
    subtracts them after a restart), how many hash partitions its restored RDDs have, and its
    checkpoints in force (the newest it keeps, which pruning must leave in place), and the
    writes of its RDDs this run started that have not completed yet."""

    def __init__(self) -> None:
        self._required = False
        self._versioned = False
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
        # by batch time: the version write, and whether all its partitions are written
        self._versions: dict[int, tuple[RDD, VersionWrite, bool]] = {}
        self._version_in_force: dict[str, Any] | None = None
        self._since_snapshot = 0

    def __getstate__(self) -> dict[str, object]:
        """Pickled with the graph, without the checkpoints or store version in force or pending:
        a restarted driver finds those in the batch log, not in the graph it pickled at its
        start."""
        run_only = ("_lock", "_marked", "_writing", "_versions")
        kept = {k: v for k, v in self.__dict__.items() if k not in run_only}
        return kept | {"_in_force": [], "_version_in_force": None, "_since_snapshot": 0}

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

    def require_versions(self) -> None:
        """The stream keeps its state in a state store: each batch writes a version of it."""
        self._versioned = True

    @property
    def versioned(self) -> bool:
        return self._versioned

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

    def unwritten(self) -> list[tuple[RDD, PartWriter | VersionWrite]]:
        """The durable writes and store versions started and not yet completed, with their
        writers (each knows its `missing()` partitions)."""
        with self._lock:
            durable = [(rdd, writer) for rdd, _time, writer in self._writing.values()]
            versions = [(rdd, write) for rdd, write, done in self._versions.values() if not done]
        return [*durable, *versions]

    def versioning(self, rdd: RDD, time_ms: int, write: VersionWrite) -> None:
        """`rdd`, the stream's RDD of `time_ms`, writes a version of its store as its tasks run."""
        with self._lock:
            self._versions[time_ms] = (rdd, write, False)

    def versions_written(self) -> None:
        """Every version write started is complete: the graph has run the partitions the
        batch's outputs did not."""
        with self._lock:
            self._versions = {
                t: (rdd, write, True) for t, (rdd, write, _) in self._versions.items()
            }

    def latest_version(self) -> dict[str, Any] | None:
        """The listing of the newest version written or being written (None: none yet): the
        one the next batch's version follows."""
        with self._lock:
            if self._versions:
                return self._versions[max(self._versions)][1].listing()
        return self._version_in_force

    def committed_version(self, time_ms: int) -> dict[str, Any] | None:
        """The listing of the newest complete version written by batches up to `time_ms`, which
        the batch's commit marker lists and which is in force from now on; None when there is
        none (a batch committed as skipped without its version complete leaves the one in force
        as it was). The writes of those batches are dropped either way."""
        with self._lock:
            done = [t for t in sorted(self._versions) if t <= time_ms]
            complete = [self._versions[t][1] for t in done if self._versions[t][2]]
            for t in done:
                del self._versions[t]
        if not complete:
            return None
        listing = complete[-1].listing()
        self.restore_version(listing, 0 if listing["snapshot"] else self._since_snapshot + 1)
        return listing

    def restore_version(self, listing: dict[str, Any], since_snapshot: int) -> None:
        """The version in force (from a commit marker), written `since_snapshot` versions after
        the last snapshot."""
        self._version_in_force = listing
        self._since_snapshot = since_snapshot

    @property
    def version_in_force(self) -> dict[str, Any] | None:
        return self._version_in_force

    def snapshot_due(self, interval: int) -> bool:
        """Whether the next version is to be snapshot, `interval` versions after the last."""
        return self._since_snapshot + 1 >= interval

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
                if not writer.missing():
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
