"""foreachRDD writing each batch to an external store, a SQLite file. Each partition opens its
own connection where it runs (a connection cannot be shipped to the workers), and rows are keyed
by batch time and replaced, so a batch that runs again after a failure overwrites its rows
instead of adding to them. At the end the program prints what the store holds.

    python examples/programs/foreachrdd_sqlite.py [database-file]
"""

import sqlite3
import sys
import tempfile
from pathlib import Path

from engine import StreamingContext, local_spark_context, run_batches

EVENTS = [
    ["login", "click", "click", "logout"],
    ["click", "purchase"],
    ["login", "click"],
]
BATCHES = len(EVENTS)
SCHEMA = "CREATE TABLE IF NOT EXISTS counts (batch_ms INTEGER, event TEXT, n INTEGER, PRIMARY KEY (batch_ms, event))"


def save_batch(database, time, rdd):
    """Runs on the driver for each batch; the writes run in the tasks, one connection each."""
    batch_ms = int(time.timestamp() * 1000)

    def save_partition(counts):
        with sqlite3.connect(database, timeout=30) as db:
            db.executemany(
                "INSERT OR REPLACE INTO counts VALUES (?, ?, ?)",
                [(batch_ms, event, n) for event, n in counts],
            )

    rdd.foreachPartition(save_partition)


def show(database):
    """The store's rows, batches numbered in time order."""
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT batch_ms, event, n FROM counts ORDER BY batch_ms, event"
        ).fetchall()
    numbers = {batch_ms: i for i, batch_ms in enumerate(sorted({r[0] for r in rows}), start=1)}
    for batch_ms, event, n in rows:
        print(f"batch {numbers[batch_ms]}: {event} {n}")


if __name__ == "__main__":
    database = sys.argv[1] if len(sys.argv) > 1 else str(Path(tempfile.mkdtemp()) / "events.db")
    with sqlite3.connect(database) as db:
        db.execute(SCHEMA)
    sc = local_spark_context("foreachrdd-sqlite")
    ssc = StreamingContext(sc, 0.5)
    events = ssc.queueStream([sc.parallelize(batch) for batch in EVENTS])
    counts = events.map(lambda event: (event, 1)).reduceByKey(lambda a, b: a + b)
    counts.foreachRDD(lambda time, rdd: save_batch(database, time, rdd))
    run_batches(ssc, BATCHES)
    show(database)
