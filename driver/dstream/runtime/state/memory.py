"""How the engine keeps its state RDDs in memory: one copy, or two on a cluster when asked.

A stateful stream's RDDs (updateStateByKey and track state, an incremental window and, when
no checkpoint writes them durably, the per-batch reductions it subtracts) are cached, and later
batches are computed from the cache.
With one copy, the loss of an executor loses its share of every cached batch: an incremental
window then recomputes each lost batch it subtracts from the source, for up to one window
length. With `spark.dstream.state.replication=2` every cached block has a second copy on
another executor, which is read instead. The cost: each block is sent to a second executor as
its task stores it, and the task waits for that. Measured on `local-cluster` (docs/
fault-tolerance.md, "Executor loss under load"), the second copy removed the lost blocks but
made every batch about twice as slow on a loaded machine, so one copy is the default.

A second copy needs a peer to hold it, and Spark's executors cache their list of peers for
60 s (`spark.storage.cachedPeersTtl`). A survivor of an executor's loss that stored a block
before the replacement registered has refreshed that list to hold no peer, and kept storing
its blocks in one copy for up to a minute after the replacement was up: a second loss in that
minute then lost state that had no other copy, and the batch after it recomputed the state
from its last checkpoint. The engine sets the cache to one second (SPARK_CONF), which costs an
executor one call to the driver a second while it stores blocks (docs/fault-tolerance.md,
"Executor loss under load"; the runs: bench/results/2026-12-02-recovery.md, "The second copy after
a loss").

It is read when the graph is built: a graph restored from a checkpoint keeps the choice it was
built with. Under `local[...]` the driver is the only executor and a second copy has nowhere
to go.
"""

from __future__ import annotations

import warnings

from pyspark import SparkContext, StorageLevel

REPLICATION_KEY = "spark.dstream.state.replication"
PEERS_TTL_KEY = "spark.storage.cachedPeersTtl"
SPARK_CONF = {PEERS_TTL_KEY: "1000"}  # milliseconds
_LEVELS = {"1": StorageLevel.MEMORY_ONLY, "2": StorageLevel.MEMORY_ONLY_2}


def state_storage_level(sc: SparkContext) -> StorageLevel:
    """The storage level of state RDDs under `sc`'s settings (see the module). A context built
    by the user's own program, not `dstream run`, may lack the engine's peer cache setting:
    then two copies are asked for in vain after a loss, which it warns of."""
    level = storage_level(sc._conf.get(REPLICATION_KEY))
    if level.replication > 1 and sc._conf.get(PEERS_TTL_KEY) is None:
        warnings.warn(
            f"{REPLICATION_KEY}=2 without {PEERS_TTL_KEY}: for a minute after an executor's "
            f"loss its survivors keep one copy of their state; set {PEERS_TTL_KEY}="
            f"{SPARK_CONF[PEERS_TTL_KEY]} in the SparkConf",
            stacklevel=2,
        )
    return level


def storage_level(replication: str | None) -> StorageLevel:
    """MEMORY_ONLY (unset or "1") or MEMORY_ONLY_2 ("2"); anything else is refused."""
    value = "1" if replication is None else replication.strip()
    if value not in _LEVELS:
        raise ValueError(
            f"{REPLICATION_KEY}: {replication!r} is not 1 or 2 (the copies of each state RDD)"
        )
    return _LEVELS[value]
