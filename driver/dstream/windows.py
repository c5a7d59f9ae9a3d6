"""Window operators: plain windows (union of the batches in range) and incremental reduced windows.

An incremental window keeps its previous RDD and computes the new one as
old window + reduce(entering batches) - reduce(leaving batches), which is what makes long windows
cheap; like every stateful stream it is checkpointed so its lineage stays short.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pyspark import RDD
from pyspark.rdd import Partitioner, portable_hash

from dstream.dstream import DStream
from dstream.runtime.checkpoint.durable import PartReader
from dstream.runtime.scheduling.graph import READ_BY
from dstream.runtime.state.memory import state_storage_level
from dstream.runtime.timeutil import duration_to_ms
from dstream.worker import combine
from dstream.worker.window_step import Entering, Leaving, WindowStep


class WindowedDStream(DStream):
    """Every RDD is the union of the parent's RDDs in (time - window, time]."""

    def __init__(self, parent: DStream, window: float, slide: float | None):
        self._window_ms = duration_to_ms(window)
        slide_ms = duration_to_ms(slide) if slide is not None else parent._slide_ms
        super().__init__(parent._ssc, [parent], slide_ms)
        if parent._storage_level is None:
            parent.persist(state_storage_level(parent._sc))

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "windowMs": self._window_ms}

    def _parent_remember_ms(self) -> int:
        return self._remember_ms + self._window_ms

    def compute(self, time_ms: int) -> RDD | None:
        parent = self._parents[0]
        rdds = parent._slice_ms(time_ms - self._window_ms + parent._slide_ms, time_ms)
        return self._sc.union(rdds) if rdds else self._sc.emptyRDD()


class ReducedWindowedDStream(DStream):
    """reduceByKeyAndWindow with an inverse function, as Spark's ReducedWindowedDStream."""

    def __init__(
        self,
        reduced: DStream,
        func: Callable[[Any, Any], Any],
        inv_func: Callable[[Any, Any], Any],
        window: float,
        slide: float | None,
        num_partitions: int,
        filter_func: Callable[[Any], bool] | None,
    ):
        self._window_ms = duration_to_ms(window)
        slide_ms = duration_to_ms(slide) if slide is not None else reduced._slide_ms
        self._func = func
        self._inv_func = inv_func
        self._partitions = num_partitions
        self._filter = filter_func
        super().__init__(reduced._ssc, [reduced], slide_ms)
        self.checkpoint_data.require(num_partitions)
        self.persist(state_storage_level(self._sc))
        if reduced._storage_level is None:
            reduced.persist(state_storage_level(reduced._sc))

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "windowMs": self._window_ms}

    def _parent_remember_ms(self) -> int:
        return self._remember_ms + self._window_ms

    def _initialize(self) -> None:
        """Make the parent's per-batch reductions durable. A restarted driver steps the window
        from its state checkpoint, which may be two checkpoint intervals old, and then subtracts
        the batches leaving it: were those lost with the old driver's cache, each would be
        recomputed from its source (read and reduced again), doubling the work of every batch
        for one window length after a restart. A batch's reduction holds at most one record
        per key, and the tasks that compute it for the batch's output write it as they go
        (dstream.runtime.checkpoint.durable): no second job per batch. The parent's partitioner is
        restored with them."""
        super()._initialize()
        parent = self._parents[0]
        assert self._checkpoint_ms is not None  # settled by super(): the window is stateful
        span_ms = self._window_ms + 2 * self._checkpoint_ms
        parent.checkpoint_data.keep_durable(span_ms // parent._slide_ms + 1, self._partitions)

    def _batches(self, rdds: list[RDD]) -> RDD:
        """The parent's RDDs of some batches as one RDD reduced by key into this stream's
        partitions. The parent is reduceByKey(func, n) of the input (reduceByKeyAndWindow builds
        it so), so a single batch's RDD already is: reducing it again would only pass every
        record through Python once more."""
        if len(rdds) == 1 and rdds[0].partitioner == Partitioner(self._partitions, portable_hash):
            return rdds[0]
        return combine.reduceByKey(self._sc.union(rdds), self._func, self._partitions)

    def _step(self, old: RDD, leaving: list[RDD], entering: list[RDD]) -> RDD:
        """The window after `old`: old - leaving + entering, filtered. The entering batches'
        values are tagged (dstream.worker.window_step), the old window's are not, and they are
        united; they share this stream's partitioner, so the union needs no shuffle, and each
        partition's state is walked once. (A leftOuterJoin to subtract and a reduceByKey to
        add walked it about ten times, through PySpark's spilling merger, every batch.) The
        leaving batches read back from their durable parts are read by the step's own tasks;
        any other leaving batch is tagged and united too. After a recovery the old window may
        lack the partitioner: then partitionBy shuffles once."""
        readers = {id(rdd): self._part_reader(rdd) for rdd in leaving}
        united_leaving = [rdd for rdd in leaving if readers[id(rdd)] is None]
        parts = [old]
        if united_leaving:
            parts.append(self._batches(united_leaving).mapValues(Leaving))
        if entering:
            parts.append(self._batches(entering).mapValues(Entering))
        united = functools.reduce(RDD.union, parts).partitionBy(self._partitions)
        read = tuple(reader for reader in readers.values() if reader is not None)
        step = WindowStep(self._func, self._inv_func, self._filter, read)
        return united.mapPartitionsWithIndex(step, preservesPartitioning=True)

    def _part_reader(self, rdd: RDD) -> PartReader | None:
        """The reader of a batch read back from durable parts partitioned as this window
        (part i holds partition i's keys), else None."""
        reader = getattr(rdd, READ_BY, None)
        return reader if reader is not None and reader.partitions == self._partitions else None

    def _whole(self, window: list[RDD]) -> RDD:
        result = self._batches(window)
        return result.filter(self._filter) if self._filter else result

    def compute(self, time_ms: int) -> RDD | None:
        parent = self._parents[0]
        step = parent._slide_ms
        begin = time_ms - self._window_ms
        previous_end = self._previous_time(time_ms)
        previous = self.getOrCompute(previous_end)
        # Spark's rule: for a short window, reducing it whole beats adding and subtracting. The
        # previous window may end more than a slide back (coalesced times): the same formula
        # then adds and subtracts several batches at once, as long as the two windows overlap.
        incremental = self._window_ms >= 5 * self._slide_ms and previous_end > begin
        if previous is not None and incremental:
            leaving = parent._slice_ms(previous_end - self._window_ms + step, begin)
            entering = parent._slice_ms(previous_end + step, time_ms)
            return self._step(previous, leaving, entering)
        window = parent._slice_ms(begin + step, time_ms)
        return self._whole(window) if window else None
