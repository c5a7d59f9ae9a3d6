"""DStream: a stream as a sequence of RDDs, one per batch time, with pyspark.streaming's API.

Every DStream computes its RDD for a batch time from its parents' RDDs for that time
(`getOrCompute`), so the graph is evaluated backwards from its outputs, and nothing here ever
touches a record: records are only handled inside Spark tasks. Method names and results follow
`pyspark.streaming.DStream` so that programs port by changing their import.
"""

from __future__ import annotations

import functools
import inspect
import math
import operator
import sys
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from itertools import chain
from typing import TYPE_CHECKING, Any

from pyspark import RDD, StorageLevel
from pyspark.rdd import portable_hash
from pyspark.resultiterable import ResultIterable

from dstream.runtime.checkpoint.stream_data import CheckpointData
from dstream.runtime.leadership.fencing import Fence, FencedWriter
from dstream.runtime.scheduling.graph import attached, detached
from dstream.runtime.timeutil import datetime_of, duration_to_ms, time_to_ms
from dstream.worker import combine

if TYPE_CHECKING:
    from dstream.context import StreamingContext

RDDFunc = Callable[[datetime, RDD], RDD | None]


def _with_time(func: Callable[..., Any], arity_without_time: int) -> Callable[..., Any]:
    """pyspark.streaming accepts f(rdd...) or f(time, rdd...); normalise to the latter."""
    if _positional_arity(func) == arity_without_time:
        return lambda _time, *rdds: func(*rdds)
    return func


def _positional_arity(func: Callable[..., Any]) -> int:
    """Positional parameters of any callable (pyspark looks at __code__, which objects lack)."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameters = inspect.signature(func).parameters.values()
    return sum(1 for p in parameters if p.kind in positional)


# Per-run handles of a stream: not pickled with the graph, re-created by _attach on restore.
_DRIVER_HANDLES = ("_ssc", "_sc", "_generated", "_lock")


def _creation_site() -> str:
    """'map at job.py:12': the outermost DStream/StreamingContext method of the calls that are
    creating a stream, and the caller's line, so that errors about a stream name the program's
    operation (Spark's DStream.creationSite plays this part)."""
    from dstream.context import StreamingContext

    frame = sys._getframe(2)
    operation = "?"
    while frame is not None and isinstance(frame.f_locals.get("self"), DStream | StreamingContext):
        if not frame.f_code.co_name.startswith("_"):
            operation = frame.f_code.co_name
        frame = frame.f_back
    if frame is None:
        return operation
    return f"{operation} at {frame.f_code.co_filename.rpartition('/')[2]}:{frame.f_lineno}"


class DStream:
    """A discretized stream. Subclasses implement `compute(time_ms)`."""

    _UNPICKLED: tuple[str, ...] = _DRIVER_HANDLES

    def __init__(self, ssc: StreamingContext, parents: list[DStream], slide_ms: int | None = None):
        self._ssc = ssc
        self._sc = ssc.sparkContext
        self._parents = parents
        self._slide_ms = slide_ms if slide_ms is not None else parents[0]._slide_ms
        self._generated: dict[int, RDD] = {}
        self._lock = threading.RLock()
        self._storage_level: StorageLevel | None = None
        self._checkpoint_ms: int | None = None
        self.checkpoint_data = CheckpointData()
        self._remember_ms = 0
        self.is_cached = False
        self.is_checkpointed = False
        self._queryable = False  # registered for queries: its own RDDs must exist
        self._origin = _creation_site()
        self._index = ssc._graph.add_stream(self)

    # -- checkpointing the graph ----------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """What the checkpoint keeps of this stream, pickled with the graph as pyspark.streaming
        pickles its functions: no SparkContext, RDD cache or lock (_attach re-creates them);
        an RDD the stream holds (an initialRDD) is written into the checkpoint by the
        executors (DStreamGraph.store_rdd)."""
        store = self._ssc._graph.store_rdd
        return {k: detached(v, store) for k, v in self.__dict__.items() if k not in self._UNPICKLED}

    def _attach(self, ssc: StreamingContext) -> None:
        """Bind a stream restored from a checkpoint to this run's contexts."""
        sc = ssc.sparkContext
        for key, value in list(self.__dict__.items()):
            self.__dict__[key] = attached(value, sc)
        self._ssc = ssc
        self._sc = sc
        self._generated = {}
        self._lock = threading.RLock()

    # -- graph plumbing -------------------------------------------------------------------

    @property
    def _slideDuration(self) -> float:
        """The slide in seconds, as pyspark.streaming names it."""
        return self._slide_ms / 1000

    def context(self) -> StreamingContext:
        return self._ssc

    # -- read-only views for metrics and the HTTP API --------------------------------------

    @property
    def index(self) -> int:
        """The stream's position in its graph (stable across restarts of the same program)."""
        return self._index

    @property
    def slide_ms(self) -> int:
        return self._slide_ms

    @property
    def remember_ms(self) -> int:
        """How long the stream keeps its RDDs after their batch (settled by start())."""
        return self._remember_ms

    def retained(self, from_ms: float = -math.inf, to_ms: float = math.inf) -> dict[int, RDD]:
        """The RDDs the stream holds now for batch times in [from_ms, to_ms], by time: a
        snapshot taken under the stream's lock, so a batch finishing meanwhile cannot change
        it. Nothing is computed."""
        with self._lock:
            return {t: rdd for t, rdd in self._generated.items() if from_ms <= t <= to_ms}

    def compute(self, time_ms: int) -> RDD | None:
        raise NotImplementedError

    def signature(self) -> dict[str, Any]:
        """What a checkpoint must agree on for this stream to be restored from it."""
        return {
            "kind": type(self).__name__,
            "parents": [p._index for p in self._parents],
            "slideMs": self._slide_ms,
            "checkpointMs": self._checkpoint_ms,
        }

    def _previous_time(self, time_ms: int) -> int:
        """The slide step before time_ms at which this stream last stepped. Coalesced batch
        times are skipped: stepping through each would cost a stage per skipped time in one
        ever deeper lineage, and they carry no input."""
        previous = time_ms - self._slide_ms
        while previous in self._ssc._graph.coalesced:
            previous -= self._slide_ms
        return previous

    def _is_time_valid(self, time_ms: int) -> bool:
        zero = self._ssc._graph.zero_ms
        return time_ms > zero and (time_ms - zero) % self._slide_ms == 0

    def getOrCompute(self, time_ms: int) -> RDD | None:
        """The RDD of this stream at `time_ms`, computed once and cached for its remember span."""
        with self._lock:
            if time_ms in self._generated:
                return self._generated[time_ms]
            if not self._is_time_valid(time_ms):
                return None
            rdd = self.compute(time_ms)
            if rdd is not None:
                rdd = self._prepare(rdd, time_ms)
                self._generated[time_ms] = rdd
            return rdd

    def _prepare(self, rdd: RDD, time_ms: int) -> RDD:
        """The RDD the stream keeps for `time_ms`: persisted, and written as a durable batch
        or marked for a state checkpoint when one is due. A durable batch is not persisted:
        the window that adds it reads it once, in the output job whose tasks write it, and
        reads its parts back in every later batch (`_read_back`). Caching it cost a JVM RDD
        of its own, a cache write and read of its records, and an unpersist, each batch."""
        graph = self._ssc._graph
        if self.checkpoint_data.durable_batches and graph.writes_checkpoints:
            return graph.write_durably(self, rdd, time_ms)
        if (
            self._checkpoint_ms
            and not graph.shadowing
            and (time_ms - graph.zero_ms) % self._checkpoint_ms == 0
        ):
            graph.mark_for_checkpoint(self, rdd, time_ms)
        if self._storage_level is not None and not rdd.is_cached:
            rdd.persist(self._storage_level)
        return rdd

    def _restore(self, time_ms: int, rdd: RDD) -> None:
        """Seed the cache with a recovered RDD (a state checkpoint) so lineage starts there."""
        with self._lock:
            if self._storage_level is not None:
                rdd.persist(self._storage_level)
            self._generated[time_ms] = rdd

    def _read_back(self, time_ms: int, reread: Callable[[RDD], RDD]) -> None:
        """The batch of `time_ms` is durable now: keep `reread(rdd)`, which reads its parts,
        in place of the cached RDD, and drop that from the cache. As a Spark RDD whose
        checkpoint is written reads its files rather than its lineage, a window that later
        subtracts the batch (or recomputes a lost block of its own through it) then reads
        the parts: after an executor loss, what it cached is not recomputed from the source.
        Steady state reads one batch's parts per batch instead of holding a window of
        batches in memory."""
        with self._lock:
            cached = self._generated.get(time_ms)
            if cached is None:
                return
            self._generated[time_ms] = reread(cached)
            if cached.is_cached:
                cached.unpersist(blocking=False)

    def _initialize(self) -> None:
        """Settle checkpoint interval and remember span before the first batch (as Spark does)."""
        if self.checkpoint_data.required and self._checkpoint_ms is None:
            self._checkpoint_ms = self._slide_ms * -(-10_000 // self._slide_ms)
        minimum = 2 * self._checkpoint_ms if self._checkpoint_ms else self._slide_ms
        self._remember(minimum)

    def _parent_remember_ms(self) -> int:
        return self._remember_ms

    def _remember(self, duration_ms: int) -> None:
        if duration_ms > self._remember_ms:
            self._remember_ms = duration_ms
        for parent in self._parents:
            parent._remember(self._parent_remember_ms())

    def _clear_metadata(self, time_ms: int) -> None:
        """Forget (and unpersist) RDDs older than the remember span."""
        with self._lock:
            old = [t for t in self._generated if t <= time_ms - self._remember_ms]
            for t in old:
                rdd = self._generated.pop(t)
                if rdd.is_cached and not self._ssc._graph.keeps_checkpoint(rdd):
                    rdd.unpersist(blocking=False)

    def _forget(self) -> None:
        """Forget (and unpersist) every RDD the stream holds."""
        with self._lock:
            for rdd in self._generated.values():
                if rdd.is_cached:
                    rdd.unpersist(blocking=False)
            self._generated.clear()

    def _slice_times(self, begin_ms: int, end_ms: int) -> list[int]:
        zero, slide = self._ssc._graph.zero_ms, self._slide_ms

        def align(t: int) -> int:
            return t if (t - zero) % slide == 0 else t - (t - zero) % slide

        return list(range(align(begin_ms), align(end_ms) + 1, slide))

    def _slice_ms(self, begin_ms: int, end_ms: int) -> list[RDD]:
        rdds = (self.getOrCompute(t) for t in self._slice_times(begin_ms, end_ms))
        return [rdd for rdd in rdds if rdd is not None]

    def _validate_window_param(self, window: float, slide: float | None) -> None:
        for label, value in (("windowDuration", window), ("slideDuration", slide)):
            if value is not None and duration_to_ms(value) % self._slide_ms != 0:
                raise ValueError(
                    f"{label} must be multiple of the parent dstream's slide (batch) duration "
                    f"({self._slide_ms} ms)"
                )

    # -- transformations (pyspark.streaming.DStream) ---------------------------------------

    def transform(self, func: Callable[..., RDD]) -> DStream:
        """A stream of func(rdd) or func(time, rdd) applied to each RDD."""
        return TransformedDStream(self, _with_time(func, 1))

    def transformWith(
        self, func: Callable[..., RDD], other: DStream, keepSerializer: bool = False
    ) -> DStream:
        """A stream of func(rdd_a, rdd_b) (or with time first) over two streams.

        `keepSerializer` is accepted for pyspark.streaming's signature and ignored: there it
        decides how func's result is serialized on its way back into a JVM DStream, while
        dstream's streams stay Python RDDs that are never re-serialized."""
        return Transformed2DStream(self, other, _with_time(func, 2))

    def mapPartitionsWithIndex(
        self, f: Callable[[int, Iterable[Any]], Iterable[Any]], preservesPartitioning: bool = False
    ) -> DStream:
        return self.transform(lambda rdd: rdd.mapPartitionsWithIndex(f, preservesPartitioning))

    def mapPartitions(
        self, f: Callable[[Iterable[Any]], Iterable[Any]], preservesPartitioning: bool = False
    ) -> DStream:
        return self.mapPartitionsWithIndex(lambda _i, it: f(it), preservesPartitioning)

    def map(self, f: Callable[[Any], Any], preservesPartitioning: bool = False) -> DStream:
        """f per record, in a generator: a StopIteration that f raises then fails the task
        (PEP 479) instead of quietly ending the partition, as PySpark's wrapper of f ensures at
        the cost of a call per record. flatMap and filter likewise."""
        return self.mapPartitions(lambda it: (f(x) for x in it), preservesPartitioning)

    def flatMap(
        self, f: Callable[[Any], Iterable[Any]], preservesPartitioning: bool = False
    ) -> DStream:
        return self.mapPartitions(
            lambda it: chain.from_iterable(f(x) for x in it), preservesPartitioning
        )

    def filter(self, f: Callable[[Any], bool]) -> DStream:
        return self.mapPartitions(lambda it: (x for x in it if f(x)), True)

    def mapValues(self, f: Callable[[Any], Any]) -> DStream:
        return self.map(lambda kv: (kv[0], f(kv[1])), preservesPartitioning=True)

    def flatMapValues(self, f: Callable[[Any], Iterable[Any]]) -> DStream:
        return self.flatMap(lambda kv: ((kv[0], x) for x in f(kv[1])), preservesPartitioning=True)

    def glom(self) -> DStream:
        return self.mapPartitions(lambda it: [list(it)])

    def count(self) -> DStream:
        return self.mapPartitions(lambda it: [sum(1 for _ in it)]).reduce(operator.add)

    def reduce(self, func: Callable[[Any, Any], Any]) -> DStream:
        """Per batch, a one-element RDD (empty for an empty batch). Partitions are reduced in
        their tasks and the partial results on the driver, as RDD.reduce does: the one-partition
        shuffle that pyspark.streaming uses here would cost every batch another stage."""
        return self.transform(lambda rdd: _reduced(rdd, func))

    def countByValue(self) -> DStream:
        return self.map(lambda x: (x, 1)).reduceByKey(operator.add)

    def reduceByKey(self, func: Callable[[Any, Any], Any], numPartitions: int | None = None):
        return self.combineByKey(lambda x: x, func, func, numPartitions)

    def combineByKey(
        self,
        createCombiner: Callable[[Any], Any],
        mergeValue: Callable[[Any, Any], Any],
        mergeCombiners: Callable[[Any, Any], Any],
        numPartitions: int | None = None,
    ) -> DStream:
        n = numPartitions or self._sc.defaultParallelism
        return self.transform(
            lambda rdd: combine.combineByKey(rdd, createCombiner, mergeValue, mergeCombiners, n)
        )

    def groupByKey(self, numPartitions: int | None = None) -> DStream:
        n = numPartitions or self._sc.defaultParallelism
        return self.transform(lambda rdd: rdd.groupByKey(n))

    def partitionBy(
        self, numPartitions: int, partitionFunc: Callable[[Any], int] = portable_hash
    ) -> DStream:
        return self.transform(lambda rdd: rdd.partitionBy(numPartitions, partitionFunc))

    def repartition(self, numPartitions: int) -> DStream:
        return self.transform(lambda rdd: rdd.repartition(numPartitions))

    def union(self, other: DStream) -> DStream:
        if self._slide_ms != other._slide_ms:
            raise ValueError("the two DStream should have same slide duration")
        return self.transformWith(lambda a, b: a.union(b), other, True)

    def cogroup(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = numPartitions or self._sc.defaultParallelism
        return self.transformWith(lambda a, b: a.cogroup(b, n), other)

    def join(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = numPartitions or self._sc.defaultParallelism
        return self.transformWith(lambda a, b: a.join(b, n), other)

    def leftOuterJoin(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = numPartitions or self._sc.defaultParallelism
        return self.transformWith(lambda a, b: a.leftOuterJoin(b, n), other)

    def rightOuterJoin(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = numPartitions or self._sc.defaultParallelism
        return self.transformWith(lambda a, b: a.rightOuterJoin(b, n), other)

    def fullOuterJoin(self, other: DStream, numPartitions: int | None = None) -> DStream:
        n = numPartitions or self._sc.defaultParallelism
        return self.transformWith(lambda a, b: a.fullOuterJoin(b, n), other)

    # -- persistence and checkpointing ----------------------------------------------------

    def cache(self) -> DStream:
        return self.persist(StorageLevel.MEMORY_ONLY)

    def persist(self, storageLevel: StorageLevel) -> DStream:
        self.is_cached = True
        self._storage_level = storageLevel
        return self

    def checkpoint(self, interval: float) -> DStream:
        """Checkpoint this stream's RDDs every `interval` seconds, cutting their lineage."""
        self.is_checkpointed = True
        self._checkpoint_ms = duration_to_ms(interval)
        if self._checkpoint_ms % self._slide_ms != 0:
            raise ValueError(
                f"checkpoint interval must be a multiple of the slide ({self._slide_ms} ms)"
            )
        if self._storage_level is None:
            self._storage_level = StorageLevel.MEMORY_ONLY
        return self

    # -- output operations ----------------------------------------------------------------

    def foreachRDD(self, func: Callable[..., None]) -> None:
        """Register an output: func(rdd) or func(time, rdd) for every batch, time a datetime."""
        self._ssc._graph.add_output(OutputDStream(self, _with_time(func, 1)))

    def pprint(self, num: int = 10) -> None:
        def take_and_print(time: datetime, rdd: RDD) -> None:
            taken = rdd.take(num + 1)
            print("-------------------------------------------")
            print(f"Time: {time}")
            print("-------------------------------------------")
            for record in taken[:num]:
                print(record)
            if len(taken) > num:
                print("...")
            print("", flush=True)

        self.foreachRDD(take_and_print)

    def saveAsTextFiles(self, prefix: str, suffix: str | None = None) -> None:
        """Each batch to `prefix-<ms>[.suffix]`, replaced atomically when a batch is re-run."""
        from dstream.runtime.checkpoint.output import save_text_atomically, text_file_name

        def save(time: datetime, rdd: RDD) -> None:
            save_text_atomically(rdd, text_file_name(prefix, suffix, time))

        self.foreachRDD(save)

    # -- time ranges ----------------------------------------------------------------------

    def slice(self, begin: datetime | float, end: datetime | float) -> list[RDD]:
        """The RDDs of batch times between begin and end, both included."""
        return self._slice_ms(time_to_ms(begin), time_to_ms(end))

    # -- windows and state (implemented in dstream.windows / dstream.state) ---------------

    def window(self, windowDuration: float, slideDuration: float | None = None) -> DStream:
        from dstream.windows import WindowedDStream

        self._validate_window_param(windowDuration, slideDuration)
        return WindowedDStream(self, windowDuration, slideDuration)

    def reduceByWindow(
        self,
        reduceFunc: Callable[[Any, Any], Any],
        invReduceFunc: Callable[[Any, Any], Any] | None,
        windowDuration: float,
        slideDuration: float,
    ) -> DStream:
        keyed = self.map(lambda x: (1, x))
        reduced = keyed.reduceByKeyAndWindow(
            reduceFunc, invReduceFunc, windowDuration, slideDuration, 1
        )
        return reduced.map(lambda kv: kv[1])

    def countByWindow(self, windowDuration: float, slideDuration: float) -> DStream:
        return self.map(lambda _x: 1).reduceByWindow(
            operator.add, operator.sub, windowDuration, slideDuration
        )

    def countByValueAndWindow(
        self, windowDuration: float, slideDuration: float, numPartitions: int | None = None
    ) -> DStream:
        keyed = self.map(lambda x: (x, 1))
        counted = keyed.reduceByKeyAndWindow(
            operator.add, operator.sub, windowDuration, slideDuration, numPartitions
        )
        return counted.filter(lambda kv: kv[1] > 0)

    def groupByKeyAndWindow(
        self, windowDuration: float, slideDuration: float, numPartitions: int | None = None
    ) -> DStream:
        lists = self.mapValues(lambda x: [x])
        grouped = lists.reduceByKeyAndWindow(
            lambda a, b: a + b,
            lambda a, b: a[len(b) :],
            windowDuration,
            slideDuration,
            numPartitions,
        )
        return grouped.mapValues(ResultIterable)

    def reduceByKeyAndWindow(
        self,
        func: Callable[[Any, Any], Any],
        invFunc: Callable[[Any, Any], Any] | None,
        windowDuration: float,
        slideDuration: float | None = None,
        numPartitions: int | None = None,
        filterFunc: Callable[[Any], bool] | None = None,
    ) -> DStream:
        """Windowed reduceByKey; incremental (old + entering - leaving) when invFunc is given."""
        from dstream.windows import ReducedWindowedDStream

        self._validate_window_param(windowDuration, slideDuration)
        n = numPartitions or self._sc.defaultParallelism
        reduced = self.reduceByKey(func, n)
        if invFunc is None:
            return reduced.window(windowDuration, slideDuration).reduceByKey(func, n)
        return ReducedWindowedDStream(
            reduced, func, invFunc, windowDuration, slideDuration, n, filterFunc
        )

    def updateStateByKey(
        self,
        updateFunc: Callable[[list[Any], Any], Any],
        numPartitions: int | None = None,
        initialRDD: RDD | Iterable[Any] | None = None,
    ) -> DStream:
        """Per-key state: updateFunc(new_values, old_state) -> new state, None drops the key."""
        from dstream.state import StateDStream

        if initialRDD is not None and not isinstance(initialRDD, RDD):
            initialRDD = self._sc.parallelize(list(initialRDD))
        return StateDStream(self, updateFunc, numPartitions, initialRDD)

    def mapWithState(self, spec: Any) -> Any:
        """Scala Spark's mapWithState over a (key, value) stream, with a `StateSpec`
        (`from dstream import StateSpec`): one record per call of its function, which runs only
        for keys with data in the batch or timing out; `.stateSnapshots()` of the result gives
        every live key's state. Its state lives in the state store (docs/state.md), which needs
        the checkpoint directory set."""
        from dstream.state import MapWithStateDStream

        return MapWithStateDStream(self, spec)

    def track(
        self,
        init: Callable[[Any, Any], Any],
        update: Callable[[Any, Any, Any], Any],
        timeout: float | None = None,
        numPartitions: int | None = None,
    ) -> DStream:
        """The D-Stream paper's state tracking over a (key, event) stream.

        A key's state starts as init(key, event) at its first event; each later event gives
        update(key, state, event); returning None ends the key, and so does `timeout` seconds
        without events. The result is the (key, state) stream of live keys.
        """
        from dstream.state import TrackedDStream

        tracked = TrackedDStream(self, init, update, timeout, numPartitions)
        return tracked.mapValues(lambda state_and_last_event: state_and_last_event[0])


def _reduced(rdd: RDD, func: Callable[[Any, Any], Any]) -> RDD:
    """The RDD holding func-reduced `rdd` (a job runs now, in the batch that computes it)."""

    def reduce_partition(items: Iterable[Any]) -> list[Any]:
        iterator = iter(items)
        for first in iterator:
            return [functools.reduce(func, iterator, first)]
        return []

    partials = rdd.mapPartitions(reduce_partition).collect()
    return rdd.context.parallelize([functools.reduce(func, partials)] if partials else [], 1)


class TransformedDStream(DStream):
    """func(time, rdd) over one parent; consecutive plain transforms fold into one node."""

    def __init__(self, parent: DStream, func: RDDFunc):
        if (
            type(parent) is TransformedDStream
            and not parent.is_cached
            and not parent.is_checkpointed
            and not parent._queryable
        ):
            inner = parent.func
            self.func: RDDFunc = lambda t, rdd: _apply(func, t, inner(t, rdd))
            folded = parent._origin
            parent = parent._parents[0]
        else:
            self.func = func
            folded = None
        super().__init__(parent._ssc, [parent])
        if folded is not None:
            self._origin = f"{folded}, then {self._origin}"

    def compute(self, time_ms: int) -> RDD | None:
        rdd = self._parents[0].getOrCompute(time_ms)
        if rdd is None:
            return None
        return self.func(datetime_of(time_ms), rdd)


def _apply(func: RDDFunc, time: datetime, rdd: RDD | None) -> RDD | None:
    return None if rdd is None else func(time, rdd)


class Transformed2DStream(DStream):
    """func(time, rdd_a, rdd_b) over two parents with the same slide."""

    def __init__(self, first: DStream, second: DStream, func: Callable[..., RDD | None]):
        if first._slide_ms != second._slide_ms:
            raise ValueError("the two DStream should have same slide duration")
        self.func = func
        super().__init__(first._ssc, [first, second])

    def compute(self, time_ms: int) -> RDD | None:
        a, b = (p.getOrCompute(time_ms) for p in self._parents)
        return self.func(datetime_of(time_ms), a, b)


class MultiTransformedDStream(DStream):
    """StreamingContext.transform: func(list_of_rdds) over any number of parents."""

    def __init__(self, parents: list[DStream], func: Callable[[list[RDD]], RDD]):
        self.func = func
        super().__init__(parents[0]._ssc, parents)

    def compute(self, time_ms: int) -> RDD | None:
        rdds = [p.getOrCompute(time_ms) for p in self._parents]
        if any(rdd is None for rdd in rdds):
            return None
        return self.func(rdds)


class UnionDStream(DStream):
    """StreamingContext.union: the union of every parent's RDD at each time."""

    def __init__(self, parents: list[DStream]):
        if len({p._slide_ms for p in parents}) != 1:
            raise ValueError("All DStreams should have same slide duration")
        super().__init__(parents[0]._ssc, parents)

    def compute(self, time_ms: int) -> RDD | None:
        rdds = [rdd for p in self._parents if (rdd := p.getOrCompute(time_ms)) is not None]
        return self._sc.union(rdds) if rdds else None


class OutputDStream(DStream):
    """An output operation: runs func(time, rdd) as the batch's job."""

    def __init__(self, parent: DStream, func: Callable[[datetime, RDD], None]):
        self.func = func
        super().__init__(parent._ssc, [parent])

    def compute(self, time_ms: int) -> RDD | None:
        return self._parents[0].getOrCompute(time_ms)

    def run(self, time_ms: int, fence: Fence | None = None) -> None:
        """Run the output on the batch's RDD; a FencedWriter also gets the driver's fence."""
        rdd = self.getOrCompute(time_ms)
        if rdd is None:
            return
        if isinstance(self.func, FencedWriter):
            self.func.write_batch(datetime_of(time_ms), rdd, fence)
        else:
            self.func(datetime_of(time_ms), rdd)
