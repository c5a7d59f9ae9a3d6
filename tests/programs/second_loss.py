"""Two executor losses in a row on `local-cluster[2,1,1024]`, with state kept in two copies:
does a block stored between the losses by the first loss's survivor have its second copy on
the replacement? Prints one JSON line: the partitions of that RDD the survivor stored, and how
many of them were computed again after the survivor's own loss (each partition records the
executor JVM that computed it, so a cached partition reads back its first executor's).

`engine` runs with the engine's Spark settings for state (dstream.runtime.state.memory);
`spark` with Spark's own peer cache of 60 s. tests/fault/test_fault_state_storage.py runs it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil
from dstream.runtime.state.memory import (
    PEERS_TTL_KEY,
    REPLICATION_KEY,
    SPARK_CONF,
    state_storage_level,
)
from pyspark import SparkConf, SparkContext

PARTITIONS = 8
WAIT_S = 180


def executor_jvm() -> int:
    """The pid of the executor JVM whose task calls it (its Python worker's first java
    ancestor)."""
    return next(p.pid for p in psutil.Process().parents() if p.name() == "java")


def executor_jvms() -> list[int]:
    """This driver's executor JVMs, oldest first (a child that ends while it is read, such as
    a Python worker, is passed over)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in child.cmdline():
                found.append((child.create_time(), child.pid))
        except psutil.NoSuchProcess:
            continue
    return [pid for _, pid in sorted(found)]


def registered(sc: SparkContext) -> int:
    """The executors registered with the driver (its own block manager not counted)."""
    return sc._jsc.sc().getExecutorMemoryStatus().size() - 1


def wait_for_executors(sc: SparkContext, count: int) -> None:
    """Until `count` executors are registered with the driver."""
    deadline = time.monotonic() + WAIT_S
    while registered(sc) != count:
        assert time.monotonic() < deadline, f"not {count} executors within {WAIT_S} s"
        time.sleep(0.05)


def lose(sc: SparkContext, pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_for_executors(sc, 1)


def main(settings: str) -> dict[str, object]:
    peers_ttl_ms = int(SPARK_CONF[PEERS_TTL_KEY]) if settings == "engine" else 60_000
    conf = (
        SparkConf()
        .setMaster("local-cluster[2,1,1024]")
        .setAppName(f"second-loss-{settings}")
        .setAll([("spark.ui.enabled", "false"), ("spark.ui.showConsoleProgress", "false")])
        .set(REPLICATION_KEY, "2")
        .set(PEERS_TTL_KEY, str(peers_ttl_ms))
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("OFF")
    level = state_storage_level(sc)
    wait_for_executors(sc, 2)
    sc.parallelize(range(PARTITIONS), PARTITIONS).persist(level).count()  # peers fetched
    first, survivor = executor_jvms()
    lose(sc, first)
    sc.parallelize(range(2), 2).persist(level).count()  # the survivor finds no peer
    expires = time.monotonic() + peers_ttl_ms / 1000
    stored_alone = registered(sc) == 1
    wait_for_executors(sc, 2)
    if settings == "engine":
        time.sleep(max(0.0, expires - time.monotonic()))  # the peer cache's own expiry
    between = sc.parallelize(range(PARTITIONS), PARTITIONS).map(lambda i: (i, executor_jvm()))
    before = dict(between.persist(level).collect())
    on_survivor = sorted(i for i, pid in before.items() if pid == survivor)
    lose(sc, survivor)
    after = dict(between.collect())
    sc.stop()
    return {
        "stored_alone": stored_alone,
        "on_survivor": on_survivor,
        "recomputed": sorted(i for i in on_survivor if after[i] != survivor),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
