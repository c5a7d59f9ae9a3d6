"""Window operators: plain windows (union of the batches in range) and incremental reduced windows.

An incremental window keeps its previous RDD and computes the new one as
old window + reduce(entering batches) - reduce(leaving batches), which is what makes long windows
cheap; like every stateful stream it is checkpointed so its lineage stays short.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from pyspark import RDD, StorageLevel
from pyspark.rdd import Partitioner, portable_hash

from dstream.dstream import DStream
from dstream.timeutil import datetime_of, duration_to_ms


class WindowedDStream(DStream):
    """Every RDD is the union of the parent's RDDs in (time - window, time]."""

    def __init__(self, parent: DStream, window: float, slide: float | None):
        self._window_ms = duration_to_ms(window)
        slide_ms = duration_to_ms(slide) if slide is not None else parent._slide_ms
        super().__init__(parent._ssc, [parent], slide_ms)
        if parent._storage_level is None:
            parent.persist(StorageLevel.MEMORY_ONLY)

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
        self._must_checkpoint = True
        self.persist(StorageLevel.MEMORY_ONLY)
        if reduced._storage_level is None:
            reduced.persist(StorageLevel.MEMORY_ONLY)

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "windowMs": self._window_ms}

    def _parent_remember_ms(self) -> int:
        return self._remember_ms + self._window_ms

    def _batches(self, rdds: list[RDD]) -> RDD:
        """The parent's RDDs of some batches as one RDD reduced by key into this stream's
        partitions. The parent is reduceByKey(func, n) of the input (reduceByKeyAndWindow builds
        it so), so a single batch's RDD already is: reducing it again would only pass every
        record through Python once more."""
        if len(rdds) == 1 and rdds[0].partitioner == Partitioner(self._partitions, portable_hash):
            return rdds[0]
        return self._sc.union(rdds).reduceByKey(self._func, self._partitions)

    def _add(self, _time: datetime, old: RDD | None, entering: list[RDD]) -> RDD:
        func, n = self._func, self._partitions
        batches = self._batches(entering)
        result = old.union(batches).reduceByKey(func, n) if old is not None else batches
        return result.filter(self._filter) if self._filter else result

    def _subtract(self, _time: datetime, old: RDD, leaving_rdds: list[RDD]) -> RDD:
        inv_func, n = self._inv_func, self._partitions
        leaving = self._batches(leaving_rdds)
        joined = old.leftOuterJoin(leaving, n)
        return joined.mapValues(lambda ab: inv_func(ab[0], ab[1]) if ab[1] is not None else ab[0])

    def compute(self, time_ms: int) -> RDD | None:
        parent = self._parents[0]
        step = parent._slide_ms
        begin = time_ms - self._window_ms
        previous_end = self._previous_time(time_ms)
        previous = self.getOrCompute(previous_end)
        when = datetime_of(time_ms)
        # Spark's rule: for a short window, reducing it whole beats adding and subtracting. The
        # previous window may end more than a slide back (coalesced times): the same formula
        # then adds and subtracts several batches at once, as long as the two windows overlap.
        incremental = self._window_ms >= 5 * self._slide_ms and previous_end > begin
        if previous is not None and incremental:
            leaving = parent._slice_ms(previous_end - self._window_ms + step, begin)
            current = self._subtract(when, previous, leaving) if leaving else previous
            entering = parent._slice_ms(previous_end + step, time_ms)
            return self._add(when, current, entering) if entering else current
        window = parent._slice_ms(begin + step, time_ms)
        return self._add(when, None, window) if window else None
