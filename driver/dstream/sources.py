"""Input streams. A source never hands the driver records: it plans an input *range* per batch.

`plan(time, max_records)` runs on the driver at each batch time and returns a JSON-able range
(rate: offsets per partition; files: the exact file list; redis: entry IDs per stream) that goes
into the batch log before the batch runs; `compute(time)` turns the recorded range into an RDD
whose tasks read the records. A restarted driver feeds the same recorded ranges back, so a re-run
batch reads the same input. The concrete sources live in `dstream.connectors`; this module holds
what every source shares and the in-memory `queueStream`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark import RDD

from dstream.dstream import DStream

if TYPE_CHECKING:
    from dstream.context import StreamingContext


class SourceError(RuntimeError):
    """A source cannot deliver the input it must: its broker is unreachable, a stream is
    missing, or records of a planned or recorded range are gone. Running on would silently
    change the job's output, so the job stops with this message instead."""


class NotRestorableError(RuntimeError):
    """A stream of a checkpointed graph that cannot be restored from the checkpoint."""


class InputDStream(DStream):
    """A stream with no parents whose RDD for a time comes from that time's planned range."""

    replayable = True

    def __init__(self, ssc: StreamingContext, name: str):
        super().__init__(ssc, [], ssc._graph.batch_ms)
        self.name = name
        self._ranges: dict[int, Any] = {}
        ssc._graph.add_input(self)

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "name": self.name}

    def plan(self, time_ms: int, max_records: int | None) -> Any:
        """Decide (and remember) the input of the batch at time_ms: at most max_records."""
        planned = self._next_range(time_ms, max_records)
        self._ranges[time_ms] = planned
        return planned

    def replay(self, time_ms: int, planned: Any) -> None:
        """Adopt a range read back from the batch log."""
        self._ranges[time_ms] = planned
        self._advance_past(planned)

    def compute(self, time_ms: int) -> RDD | None:
        if time_ms not in self._ranges:
            return None
        return self._read(time_ms, self._ranges[time_ms])

    def forget_before(self, time_ms: int) -> None:
        for t in [t for t in self._ranges if t < time_ms]:
            del self._ranges[t]

    def records_in(self, planned: Any) -> int:
        raise NotImplementedError

    def backlog(self, now_ms: int) -> int | None:
        """Records available but not yet admitted (None when the source cannot tell)."""
        return None

    def backlog_by_partition(self) -> dict[str, int]:
        """The backlog per source partition (a broker's stream), for lag per partition; {} when
        the source has one partition or cannot tell."""
        return {}

    def position(self) -> Any:
        """Source state a restarted driver needs beyond the ranges (JSON-able)."""
        return None

    def restore_position(self, position: Any) -> None:
        """Inverse of position()."""

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        raise NotImplementedError

    def _advance_past(self, planned: Any) -> None:
        raise NotImplementedError

    def _read(self, time_ms: int, planned: Any) -> RDD:
        raise NotImplementedError


class QueueInputDStream(InputDStream):
    """queueStream: RDDs from a queue, one (or all) per batch. In memory, so not replayable.

    As in Spark, a checkpoint does not keep the queue: its RDDs would have to pass through the
    driver into the checkpoint, and could not be replayed anyway. A program reading one runs with
    a checkpoint, but getOrCreate restores it only by running its setup again (rebuild=True)."""

    replayable = False
    _UNPICKLED = (*InputDStream._UNPICKLED, "_queue", "_default", "_planned_rdds")

    def __init__(
        self, ssc: StreamingContext, rdds: list[RDD], one_at_a_time: bool, default: RDD | None
    ):
        super().__init__(ssc, f"queue-{len(ssc._graph.inputs)}")
        self._queue = list(rdds)
        self._one_at_a_time = one_at_a_time
        self._default = default
        self._planned_rdds: dict[int, RDD] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise NotRestorableError(
            f"{self.__class__.__name__}: a queueStream's RDDs are not kept in checkpoints (as in "
            "Spark); rebuild the graph with setup (getOrCreate(path, setup, rebuild=True))"
        )

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        if self._one_at_a_time and self._queue:
            taken = [self._queue.pop(0)]
        else:
            taken, self._queue = self._queue, []
        if taken:
            rdd = taken[0] if len(taken) == 1 else self._sc.union(taken)
        else:
            rdd = self._default if self._default is not None else self._sc.emptyRDD()
        self._planned_rdds[time_ms] = rdd
        return None

    def _advance_past(self, planned: Any) -> None:
        raise RuntimeError("queueStream keeps its RDDs in memory and cannot be replayed")

    def _read(self, time_ms: int, planned: Any) -> RDD:
        return self._planned_rdds[time_ms]

    def forget_before(self, time_ms: int) -> None:
        super().forget_before(time_ms)
        for t in [t for t in self._planned_rdds if t < time_ms]:
            del self._planned_rdds[t]

    def records_in(self, planned: Any) -> int:
        return 0


def split_budget(waiting: list[int], budget: int | None) -> list[int]:
    """Share a record budget across partitions in proportion to their backlog (all if no budget)."""
    total = sum(waiting)
    if budget is None or budget >= total:
        return list(waiting)
    shares = [w * budget // total for w in waiting]
    leftover = budget - sum(shares)
    by_remainder = sorted(range(len(waiting)), key=lambda i: -(waiting[i] * budget % total))
    for i in by_remainder[:leftover]:
        shares[i] += 1
    return shares
