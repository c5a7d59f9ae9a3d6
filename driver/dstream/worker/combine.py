"""combineByKey for dstream's shuffles: the per-key combine before and after the shuffle in a
tight loop, falling back to PySpark's spilling merger only when a worker runs short of memory.

PySpark's `RDD.combineByKey` passes every record through `ExternalMerger.mergeValues`, whose loop
also routes the record to a spill partition and counts it towards the next memory check, and
calls the user's functions through a wrapper that turns a StopIteration into an error. For a
tutorial word count (a (word, 1) pair per word) that made a batch about 1.6 times as long
(bench/results/2026-11-24-bench.md, "What the engine changes of 2026-11-24 bought"). Here the
loop does only what the semantics need (create or merge; a key seen before is looked up once,
and a miss costs an exception only the first time), and memory is checked between chunks of
`CHECK_EVERY` records; past `spark.python.worker.memory` the records so far and the rest go to
`ExternalMerger`, which spills to disk as PySpark would.
The result is the same RDD as PySpark's: same partitioner, same values. A StopIteration from the
user's function still fails the task: it leaves the loop as an exception, not as the end of the
records.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from typing import Any

from pyspark import RDD, SparkContext
from pyspark.rdd import portable_hash
from pyspark.serializers import Serializer
from pyspark.shuffle import Aggregator, ExternalMerger, get_used_memory
from pyspark.util import _parse_memory

CHECK_EVERY = 10_000
WORKER_MEMORY = "spark.python.worker.memory"
_END = object()
_WORKER_MEMORY_MB: weakref.WeakKeyDictionary[SparkContext, int] = weakref.WeakKeyDictionary()


def combineByKey(
    rdd: RDD,
    createCombiner: Callable[[Any], Any],
    mergeValue: Callable[[Any, Any], Any],
    mergeCombiners: Callable[[Any, Any], Any],
    numPartitions: int,
    partitionFunc: Callable[[Any], int] = portable_hash,
) -> RDD:
    """`rdd.combineByKey(...)`: PySpark's semantics and partitioning, with the tight loop."""
    agg = Aggregator(createCombiner, mergeValue, mergeCombiners)
    memory_mb, serializer = worker_memory_mb(rdd.ctx), rdd.ctx.serializer
    values = Combine(createCombiner, mergeValue, agg, True, memory_mb * 0.9, serializer)
    combiners = Combine(_same, mergeCombiners, agg, False, memory_mb, serializer)
    local = rdd.mapPartitions(values, preservesPartitioning=True)
    shuffled = local.partitionBy(numPartitions, partitionFunc)
    return shuffled.mapPartitions(combiners, preservesPartitioning=True)


def worker_memory_mb(sc: SparkContext) -> int:
    """`spark.python.worker.memory` of `sc` in MiB, read once per context rather than through
    py4j for every shuffle of every batch: a running context's settings do not change."""
    try:
        return _WORKER_MEMORY_MB[sc]
    except KeyError:
        limit = _WORKER_MEMORY_MB[sc] = _parse_memory(sc._conf.get(WORKER_MEMORY, "512m"))
        return limit


def reduceByKey(
    rdd: RDD,
    func: Callable[[Any, Any], Any],
    numPartitions: int,
    partitionFunc: Callable[[Any], int] = portable_hash,
) -> RDD:
    """`rdd.reduceByKey(func, numPartitions)` through `combineByKey` above."""
    return combineByKey(rdd, _same, func, func, numPartitions, partitionFunc)


@dataclass(frozen=True)
class Combine:
    """One side of the shuffle: a partition's (key, value) records before it (`values`), or its
    (key, combiner) records after it, combined per key. `agg` holds the same functions for
    ExternalMerger, which takes over past `limit_mb`."""

    create: Callable[[Any], Any]
    merge: Callable[[Any, Any], Any]
    agg: Aggregator
    values: bool
    limit_mb: float
    serializer: Serializer

    def __call__(self, records: Iterable[tuple[Any, Any]]) -> Iterable[tuple[Any, Any]]:
        create, merge = self.create, self.merge
        by_key: dict[Any, Any] = {}

        def absorb(pairs: Iterable[tuple[Any, Any]]) -> None:
            for key, value in pairs:
                try:
                    combined = by_key[key]
                except KeyError:
                    by_key[key] = create(value)
                else:
                    by_key[key] = merge(combined, value)

        records = iter(records)
        while True:
            absorb(islice(records, CHECK_EVERY))
            following = next(records, _END)
            if following is _END:
                return by_key.items()
            if get_used_memory() >= self.limit_mb:
                return self._spilling(by_key, chain([following], records))
            absorb((following,))

    def _spilling(
        self, by_key: dict[Any, Any], rest: Iterator[tuple[Any, Any]]
    ) -> Iterable[tuple[Any, Any]]:
        """The dict's combiners and the rest of the records through ExternalMerger, the dict
        emptied as the merger takes them, so the memory it held can be spilled."""
        merger = ExternalMerger(self.agg, self.limit_mb, self.serializer)
        merger.mergeCombiners(by_key.popitem() for _ in range(len(by_key)))
        if self.values:
            merger.mergeValues(rest)
        else:
            merger.mergeCombiners(rest)
        return merger.items()


def _same(combiner: Any) -> Any:
    return combiner
