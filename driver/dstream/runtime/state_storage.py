"""How the engine keeps its state RDDs in memory: replicated on two executors on a cluster.

A stateful stream's RDDs (updateStateByKey and track state, an incremental window and the
per-batch reductions it subtracts) are cached, and later batches are computed from the cache.
With one copy, the loss of an executor loses its half of every cached batch: an incremental
window then recomputes each batch leaving it from the source, doubling the work of every batch
for one window length (measured in docs/fault-tolerance.md, "Executor loss under load"). With
a second copy on another executor, the surviving copy is read instead. The cost: each cached
block is sent to a second executor as it is stored (memory and network twice over).

`spark.dstream.state.replication` (1 or 2) sets it; unset, it is 2 on a cluster master
(`local-cluster`, standalone, Kubernetes) and 1 on `local[...]`, where the driver is the only
executor and a second copy has nowhere to go. It is read when the graph is built: a graph
restored from a checkpoint keeps the choice it was built with.
"""

from __future__ import annotations

from pyspark import SparkContext, StorageLevel

REPLICATION_KEY = "spark.dstream.state.replication"
_LEVELS = {"1": StorageLevel.MEMORY_ONLY, "2": StorageLevel.MEMORY_ONLY_2}


def state_storage_level(sc: SparkContext) -> StorageLevel:
    """The storage level of state RDDs under `sc`'s settings and master (see the module)."""
    return storage_level(sc.master, sc.getConf().get(REPLICATION_KEY))


def storage_level(master: str, replication: str | None) -> StorageLevel:
    """MEMORY_ONLY or MEMORY_ONLY_2: `replication` if set, else by the master."""
    if replication is None:
        return _LEVELS["1" if master == "local" or master.startswith("local[") else "2"]
    if replication.strip() not in _LEVELS:
        raise ValueError(
            f"{REPLICATION_KEY}: {replication!r} is not 1 or 2 (the copies of each state RDD)"
        )
    return _LEVELS[replication.strip()]
