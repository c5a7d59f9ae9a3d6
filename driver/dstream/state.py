"""Stateful streams: updateStateByKey, the paper's track(init, update, timeout), and Scala
Spark's mapWithState.

updateStateByKey's and track's state is an RDD derived from the previous state RDD and the new
batch. The state RDD keeps one hash partitioner across batches, so only the batch is shuffled to
the keys' partitions while the state stays in place; every checkpoint interval it is written to
reliable storage to cut lineage. mapWithState's state lives in a state store instead
(runtime/state), one per partition, versioned per batch and checkpointed by what changed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from pyspark import RDD

from dstream.dstream import DStream, _positional_arity
from dstream.runtime.state.mapping import (
    DATA,
    INITIAL,
    MapWithStateStep,
    SnapshotReader,
    State,
)
from dstream.runtime.state.memory import state_storage_level
from dstream.runtime.state.partition import STORE_KEY, StoreSettings
from dstream.runtime.state.store import Version
from dstream.runtime.timeutil import datetime_of, duration_to_ms

log = logging.getLogger(__name__)
__all__ = ["MapWithStateDStream", "State", "StateDStream", "StateSpec", "TrackedDStream"]


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


class StateSpec:
    """What mapWithState does, built as in Scala Spark:
    `StateSpec.function(f).timeout(30).numPartitions(4).initialState(rdd)`.

    `f(key, value, state)` (or `f(time, key, value, state)`, time a datetime) is called once
    per record of each batch, and once more, with value None and `state.isTimingOut()` true,
    for a key idle for longer than the timeout (seconds); its return value is the record
    mapWithState emits. `initialState` is an RDD (or a list) of (key, state) pairs that the
    first batch starts from."""

    def __init__(self, mappingFunction: Callable[..., Any]):
        if not callable(mappingFunction):
            raise TypeError("StateSpec.function needs a callable mapping function")
        self._function = mappingFunction
        self._timeout: float | None = None
        self._partitions: int | None = None
        self._initial: RDD | list[Any] | None = None

    @classmethod
    def function(cls, mappingFunction: Callable[..., Any]) -> StateSpec:
        return cls(mappingFunction)

    def timeout(self, idleDuration: float) -> StateSpec:
        duration_to_ms(idleDuration)  # refuses what is not a positive duration
        self._timeout = idleDuration
        return self

    def numPartitions(self, numPartitions: int) -> StateSpec:
        if numPartitions < 1:
            raise ValueError(f"numPartitions must be at least 1, not {numPartitions}")
        self._partitions = numPartitions
        return self

    def initialState(self, rdd: RDD | Iterable[Any]) -> StateSpec:
        self._initial = rdd if isinstance(rdd, RDD) else list(rdd)
        return self


class MapWithStateDStream(DStream):
    """mapWithState: each batch's records mapped through the function with their key's state,
    which lives in the state store (runtime/state; memory or RocksDB per
    `spark.dstream.state.store`) and is checkpointed by what changed, every batch: the function
    runs only for keys with data or timing out, so a batch costs what it touches. Its RDD of a
    batch holds what the calls returned; `stateSnapshots()` gives every live key's state."""

    _UNPICKLED = (*DStream._UNPICKLED, "_settings")

    def __init__(self, parent: DStream, spec: StateSpec):
        self._function = spec._function
        self._with_time = _positional_arity(spec._function) == 4
        self._timeout_ms = duration_to_ms(spec._timeout) if spec._timeout is not None else None
        self._partitions = spec._partitions or parent._sc.defaultParallelism
        initial = spec._initial
        self._initial = parent._sc.parallelize(initial) if isinstance(initial, list) else initial
        super().__init__(parent._ssc, [parent])
        self._settings = StoreSettings.from_conf(self._sc._conf.get)
        self._kind = self._settings.kind
        self.checkpoint_data.require_versions()
        self.persist(state_storage_level(self._sc))

    def _attach(self, ssc: Any) -> None:
        """A restored stream keeps its store's kind (its checkpoint holds that kind's
        snapshots); memory, snapshot interval and local directory come from this run."""
        super()._attach(ssc)
        settings = StoreSettings.from_conf(self._sc._conf.get)
        if settings.kind != self._kind:
            log.warning(
                "%s: the checkpoint keeps this stream's state in a %s store; %s=%s is ignored "
                "(start fresh to change it)",
                self._origin,
                self._kind,
                STORE_KEY,
                settings.kind,
            )
        self._settings = replace(settings, kind=self._kind)

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "store": self._kind, "partitions": self._partitions}

    def _initialize(self) -> None:
        if self._ssc._graph.checkpoint_path is None:
            raise ValueError(
                f"mapWithState ({self._origin}) keeps its state in the checkpoint directory: "
                "set it with StreamingContext.checkpoint(directory) before start()"
            )
        super()._initialize()

    def checkpoint(self, interval: float) -> DStream:
        """Accepted, as Scala Spark programs checkpoint mapWithState's stream; its state is
        written every batch by what changed, so there is nothing more to write."""
        if duration_to_ms(interval) % self._slide_ms != 0:
            raise ValueError(
                f"checkpoint interval must be a multiple of the slide ({self._slide_ms} ms)"
            )
        return self

    def stateSnapshots(self) -> DStream:
        """The (key, state) pairs of every live key after each batch."""
        return StateSnapshotDStream(self)

    @property
    def _root(self) -> str:
        """The stream's directory in the checkpoint: stores/<stream index>."""
        checkpoint = self._ssc._graph.checkpoint_path
        assert checkpoint is not None, "checked at start"
        return str(checkpoint.resolve() / "stores" / str(self._index))

    def compute(self, time_ms: int) -> RDD | None:
        if self._ssc._graph.shadowing:
            raise RuntimeError(
                f"a standby does not shadow {self._origin}: its state store is loaded at takeover"
            )
        parent = _version(self.checkpoint_data.latest_version())
        if parent is not None and time_ms <= parent.time_ms:
            raise ValueError(
                f"{self._origin}: the records it mapped at {datetime_of(time_ms)} are not kept "
                f"once its state has moved on to {datetime_of(parent.time_ms)} (a window over "
                "mapWithState's records does not outlive a restart)"
            )
        initial = parent is None and self._initial is not None
        step = MapWithStateStep(
            self._function,
            self._with_time,
            self._timeout_ms,
            self._settings,
            self._root,
            self._partitions,
            Version(time_ms, uuid.uuid4().hex),
            parent,
            self.checkpoint_data.snapshot_due(self._settings.snapshot_interval),
            initial,
        )
        stepped = self._input(time_ms, initial).mapPartitionsWithIndex(step)
        setattr(stepped, _STEP, step)
        self.checkpoint_data.versioning(stepped, time_ms, step)
        return stepped

    def _input(self, time_ms: int, initial: bool) -> RDD:
        """The batch's records hash-partitioned as the state is; the first batch's tagged,
        with the initial state's."""
        n = self._partitions
        batch = self._parents[0].getOrCompute(time_ms)
        if not initial:
            return batch.partitionBy(n) if batch is not None else self._sc.parallelize([], n)
        tagged = [self._initial.map(lambda kv: (kv[0], (INITIAL, kv[1])))]
        if batch is not None:
            tagged.append(batch.map(lambda kv: (kv[0], (DATA, kv[1]))))
        return self._sc.union(tagged).partitionBy(n)


class StateSnapshotDStream(DStream):
    """mapWithState's stateSnapshots(): every live key's (key, state) after each batch, read
    from the store's version of that batch in the tasks that ran its step."""

    def __init__(self, parent: MapWithStateDStream):
        super().__init__(parent._ssc, [parent])

    def compute(self, time_ms: int) -> RDD | None:
        stepped = self._parents[0].getOrCompute(time_ms)
        if stepped is None:
            return None
        step: MapWithStateStep = getattr(stepped, _STEP)
        reader = SnapshotReader(step.settings, step.root, step.version)
        return stepped.mapPartitionsWithIndex(reader)


# The attribute of a mapWithState RDD holding its batch's step.
_STEP = "_dstream_step"


def _version(listing: dict[str, Any] | None) -> Version | None:
    return None if listing is None else Version(listing["time"], listing["token"])
