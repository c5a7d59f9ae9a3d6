"""A standby's shadow of its leader: the state of every batch the leader commits, computed by
the standby itself, so that a takeover starts from state its executors hold already.

Without it a standby that takes over restores state from the last state checkpoint and its
first batches recompute everything since (the input of the batches after that checkpoint read
again, their state and window steps run again), on executors that have not yet run the job's
functions (bench/results/2026-11-25-recovery.md, "Where a standby's takeover goes"; the design:
docs/fault-tolerance.md, "The standby's shadow"). The shadow does that
work while the leader is alive: it restores state once as recovery does, then for each batch
the leader commits it feeds the batch's recorded input ranges to the sources and computes the
stateful streams' RDDs of that time through the graph's own generation path
(`DStream.getOrCompute`), keeping them cached, and forgets the superseded ones as the leader's
batches do (`DStreamGraph.clear_metadata`). The graph is in shadowing mode meanwhile: it
writes no state checkpoint and no durable batch, so the shadow writes nothing anywhere; where
the leader wrote a state checkpoint, the shadow takes that batch's state from it (reading it
through), so its lineage is cut where the leader's is, and it keeps the checkpoints in force
as the leader's commits list them, as recovery would.

A step that fails ends the shadow: the takeover then restores state from the checkpoint, as
without a shadow, and says so. So does a shadow that fell behind the leader so far that a
checkpoint it relies on was pruned.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from dstream.runtime.checkpoint.directory import CheckpointDir, LogState
from dstream.runtime.checkpoint.files import local_path
from dstream.runtime.checkpoint.recovery import CheckpointRecovery
from dstream.runtime.timeutil import datetime_of

if TYPE_CHECKING:
    import threading

    from pyspark import SparkContext

    from dstream.dstream import DStream
    from dstream.runtime.scheduling.graph import DStreamGraph

log = logging.getLogger(__name__)

JOB_DESCRIPTION = "spark.job.description"  # what Spark's UI and event log show of a job


class ShadowStepError(RuntimeError):
    """A committed batch the shadow could not compute as its leader did."""


class Shadow:
    """The state of the leader's committed batches, computed on this standby's executors.

    `catch_up` runs in the follower's thread; `usable`, `take_over` and `discard` in the
    takeover's, once the follower has stopped."""

    def __init__(
        self,
        sc: SparkContext,
        graph: DStreamGraph,
        checkpoint: CheckpointDir,
    ):
        self._sc = sc
        self._graph = graph
        self._checkpoint = checkpoint
        self._recovery = CheckpointRecovery(sc, graph, checkpoint, None)
        # by stream, the time of the newest state checkpoint its state is held from
        self.restored: dict[str, int] | None = None
        self.stepped_ms: int | None = None  # the last committed batch whose state it holds
        self.failure: str | None = None

    def catch_up(self, stop: threading.Event) -> int:
        """Compute every batch the leader committed since the last call; how many. A failure
        ends the shadow (the takeover restores from the checkpoint); a stop (the lead taken,
        its job cancelled) leaves it at the last batch it completed."""
        if self.failure is not None:
            return 0
        stepped = 0
        try:
            found = self._checkpoint.load_log(tidy=False)
            if self.restored is None:
                if not self._start(found):
                    return 0
                # The leader went on while the state was restored (minutes on a loaded machine):
                # a round that stepped nothing of a stale log would call the shadow caught up.
                found = self._checkpoint.load_log(tidy=False)
            assert self.stepped_ms is not None
            for time_ms in sorted(t for t in found.commits if t > self.stepped_ms):
                if stop.is_set():
                    return stepped
                self._step(time_ms, found)
                stepped += 1
            return stepped
        except Exception as error:
            if stop.is_set():
                return stepped
            self.failure = f"{type(error).__name__}: {(str(error) or '-').splitlines()[0]}"
            log.warning(
                "standby: shadowing the leader failed after %s (%s); a takeover restores state "
                "from the checkpoint instead",
                datetime_of(self.stepped_ms) if self.stepped_ms is not None else "its start",
                self.failure,
            )
            return stepped

    def _start(self, found: LogState) -> bool:
        """Restore state from the checkpoint as recovery does; False while the leader has
        committed nothing yet (there is nothing to shadow), or when it pruned a checkpoint
        while the shadow read it (the next round starts again from newer ones)."""
        metadata = self._checkpoint.read_metadata()
        if metadata is None or not found.commits:
            return False
        self._recovery.start_graph(metadata)
        self._graph.shadowing = True
        self._recovery.replay_log(found)
        torn: list[str] = []
        restored = self._recovery.restore_state(found.state_checkpoints(), torn)
        if any(not local_path(path).exists() for path in torn):
            log.info("standby: the leader pruned a state checkpoint as it was read: next round")
            self._graph.forget_state()
            return False
        if torn:
            raise ShadowStepError(f"state checkpoints unreadable: {', '.join(torn)}")
        self._recovery.require_replayable(found, restored)
        self.restored = restored
        self.stepped_ms = max(restored.values(), default=self._graph.zero_ms)
        log.info("standby: shadowing the leader from %s", datetime_of(self.stepped_ms))
        return True

    def _step(self, time_ms: int, found: LogState) -> None:
        """Compute the committed batch at time_ms, its Spark jobs described as its shadow (the
        standby's UI and event log tell them from the follower's other jobs, and set them
        beside the leader's `batch ...`: tests/fault/standby_cost.py times them so)."""
        previous = self._sc.getLocalProperty(JOB_DESCRIPTION)  # None: unset again after
        description = f"standby: shadow of batch {datetime_of(time_ms)}"
        self._sc.setLocalProperty(JOB_DESCRIPTION, description)
        try:
            self._compute(time_ms, found)
        finally:
            self._sc.setLocalProperty(JOB_DESCRIPTION, previous)

    def _compute(self, time_ms: int, found: LogState) -> None:
        """The batch's input ranges from its record, its state from the leader's state
        checkpoint of that time when there is one, else stepped from the previous state; then
        forget what the leader's batch forgot."""
        record = found.records.get(time_ms)
        if record is not None:
            self._recovery.replay(time_ms, record)
        self._keep_checkpoints(found.commits[time_ms], time_ms)
        stateful = [stream.getOrCompute(time_ms) for stream in self._graph.stateful_streams()]
        rdds = [rdd for rdd in stateful if rdd is not None]
        if rdds:  # one job computes (and caches) them all
            self._sc.union(rdds).count()
        self._graph.clear_metadata(time_ms)
        self.stepped_ms = time_ms

    def _keep_checkpoints(self, commit: dict[str, Any], time_ms: int | None) -> None:
        """Keep in force the state checkpoints a commit lists, as the leader did. Those of the
        batch at `time_ms` (None: none) become the streams' state of that time, read back from
        the checkpoint, where the leader's lineage was cut too."""
        for index, entry in commit.get("state", {}).items():
            stream = self._graph.streams[int(index)]
            data = stream.checkpoint_data
            kept = (entry["time"], entry["path"])
            if kept in data.in_force:
                continue
            if entry["time"] == time_ms and not data.durable_batches:
                self._restore(stream, entry["path"], time_ms)
            if not data.durable_batches and self.restored is not None:
                self.restored[index] = entry["time"]  # its state is held from there on
            data.keep(*kept)

    def _restore(self, stream: DStream, path: str, time_ms: int) -> None:
        """The stream's state of time_ms from the leader's checkpoint of it. One the leader has
        pruned, before or while the shadow read it (the shadow lags behind a leader catching
        up), is computed instead, its lineage cut at a later one; one that is there but
        unreadable ends the shadow."""
        rdd = None
        if local_path(path).exists():
            rdd = self._recovery.read_checkpoint(stream, path, [])
        if rdd is None and not local_path(path).exists():
            log.info(
                "standby: state checkpoint %s pruned by the leader: computing it instead", path
            )
            return
        if rdd is None:
            raise ShadowStepError(f"state checkpoint {path} unreadable")
        stream._restore(time_ms, rdd)

    def usable(self, found: LogState) -> bool:
        """Whether a takeover can start from the shadow: it never failed, and every checkpoint
        it keeps in force is still in the log (else it fell behind: the leader pruned what its
        state may still need). Logs why not."""
        if self.restored is None or self.failure is not None:
            reason = self.failure or "it had not started"
        else:
            listed = {path for kept in found.state_checkpoints().values() for _t, path in kept}
            missing = [
                path
                for stream in self._graph.streams
                for _time, path in stream.checkpoint_data.in_force
                if path not in listed
            ]
            if not missing:
                return True
            reason = f"it fell behind: {missing[0]} is no longer in the log"
        log.warning(
            "standby: taking over without the shadowed state (%s); restoring state from the "
            "checkpoint",
            reason,
        )
        return False

    def take_over(self, found: LogState) -> dict[str, int]:
        """Lead from the shadowed state: the checkpoints of the commits it did not compute are
        kept in force (their batches' state is computed by the first batch, from the state the
        shadow holds); the graph writes checkpoints again. The time of the newest state
        checkpoint of each stateful stream, as recovery reports the state it restored."""
        assert self.restored is not None and self.stepped_ms is not None
        behind = sorted(t for t in found.commits if t > self.stepped_ms)
        for time_ms in behind:
            self._keep_checkpoints(found.commits[time_ms], None)
        self._graph.shadowing = False
        log.warning(
            "standby: taking over with the state it shadowed up to %s (%d committed batches "
            "after it left to the first batch)",
            datetime_of(self.stepped_ms),
            len(behind),
        )
        return self.restored

    def discard(self) -> None:
        """Give the shadowed state up before recovery restores it from the checkpoint."""
        self._graph.forget_state()
        self._graph.shadowing = False
