"""Stateful streams: updateStateByKey and the paper's track(init, update, timeout).

State is an RDD derived from the previous state RDD and the new batch. The state RDD keeps one
hash partitioner across batches, so only the batch is shuffled to the keys' partitions while the
state stays in place; every checkpoint interval it is written to reliable storage to cut lineage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark import RDD

from dstream.dstream import DStream
from dstream.runtime.state.memory import state_storage_level
from dstream.runtime.timeutil import duration_to_ms


class StateDStream(DStream):
    """updateStateByKey, with pyspark.streaming's semantics (update runs for every key, every batch)."""

    def __init__(
        self,
        parent: DStream,
        update: Callable[[list[Any], Any], Any],
        num_partitions: int | None,
        initial: RDD | None,
    ):
        self._update = update
        self._partitions = num_partitions or parent._sc.defaultParallelism
        self._initial = initial
        super().__init__(parent._ssc, [parent])
        self.checkpoint_data.require(self._partitions)
        self.persist(state_storage_level(self._sc))

    def compute(self, time_ms: int) -> RDD | None:
        previous = self.getOrCompute(self._previous_time(time_ms))
        batch = self._parents[0].getOrCompute(time_ms)
        if batch is None:
            return previous
        return self._step(previous if previous is not None else self._initial, batch)

    def _step(self, state: RDD | None, batch: RDD) -> RDD:
        update, n = self._update, self._partitions
        if state is None:
            grouped = batch.groupByKey(n).mapValues(lambda vs: (list(vs), None))
        else:
            grouped = state.cogroup(batch.partitionBy(n), n).mapValues(
                lambda sv: (list(sv[1]), next(iter(sv[0]), None))
            )
        return grouped.mapValues(lambda vs: update(vs[0], vs[1])).filter(
            lambda kv: kv[1] is not None
        )


class TrackedDStream(DStream):
    """track(): values are (state, time of the key's last event in ms) so timeouts are exact."""

    def __init__(
        self,
        parent: DStream,
        init: Callable[[Any, Any], Any],
        update: Callable[[Any, Any, Any], Any],
        timeout: float | None,
        num_partitions: int | None,
    ):
        self._init = init
        self._update = update
        self._timeout_ms = duration_to_ms(timeout) if timeout is not None else None
        self._partitions = num_partitions or parent._sc.defaultParallelism
        super().__init__(parent._ssc, [parent])
        self.checkpoint_data.require(self._partitions)
        self.persist(state_storage_level(self._sc))

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "timeoutMs": self._timeout_ms}

    def compute(self, time_ms: int) -> RDD | None:
        previous = self.getOrCompute(self._previous_time(time_ms))
        batch = self._parents[0].getOrCompute(time_ms)
        if previous is None and batch is None:
            return None
        n = self._partitions
        previous = previous if previous is not None else self._sc.emptyRDD()
        batch = batch if batch is not None else self._sc.emptyRDD()
        step = _track_step(self._init, self._update, self._timeout_ms, time_ms)
        grouped = previous.cogroup(batch.partitionBy(n), n)
        stepped = grouped.map(lambda kv: (kv[0], step(kv[0], kv[1])), preservesPartitioning=True)
        return stepped.filter(lambda kv: kv[1] is not None)


def _track_step(
    init: Callable[[Any, Any], Any],
    update: Callable[[Any, Any, Any], Any],
    timeout_ms: int | None,
    time_ms: int,
) -> Callable[[Any, tuple[Any, Any]], tuple[Any, int] | None]:
    """The per-key transition of one batch, as a picklable closure over the batch time."""

    def step(key: Any, states_events: tuple[Any, Any]) -> tuple[Any, int] | None:
        states, events = states_events
        current = next(iter(states), None)
        events = list(events)
        if not events:
            if current is None or (timeout_ms is not None and time_ms - current[1] >= timeout_ms):
                return None
            return current
        state = current[0] if current is not None else None
        for event in events:
            state = init(key, event) if state is None else update(key, state, event)
        return None if state is None else (state, time_ms)

    return step
