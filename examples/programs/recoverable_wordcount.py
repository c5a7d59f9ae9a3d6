"""A recoverable program: running word counts of the text files that arrive in a directory,
kept in a SQLite file, restartable from its checkpoint with StreamingContext.getOrCreate.

The first run finds no checkpoint and calls `create_context` to build everything, SparkContext
included. A restart finds the checkpoint and restores that context from it, functions and all,
without calling `create_context`; it re-runs the batches that had not finished and goes on with
the totals where they were. SIGTERM (or Ctrl-C) stops it at once: the batches that did not
finish run again at the next start, and since each batch replaces the totals it writes, the
store ends up as if the program had never stopped.

    python examples/programs/recoverable_wordcount.py <input-dir> <checkpoint-dir> <database-file>

Write each file under a hidden name (.name) in the input directory and rename it into place.
"""

import signal
import sqlite3
import sys
import threading

from engine import StreamingContext, local_spark_context

# A restart first runs every batch it missed while it was down, one after another on
# pyspark.streaming, while new ones keep coming due: with 1 s batches a 30 s restart is 30 batches
# to catch up on, which a loaded machine that needs more than a second per batch never does.
BATCH_SECONDS = 3
SCHEMA = "CREATE TABLE IF NOT EXISTS totals (word TEXT PRIMARY KEY, n INTEGER)"


def add_counts(new_counts, total):
    return sum(new_counts) + (total or 0)


def save_totals(database, rdd):
    """Every batch replaces the totals it holds: writing them twice changes nothing."""

    def save_partition(totals):
        with sqlite3.connect(database, timeout=30) as db:
            db.executemany("INSERT OR REPLACE INTO totals VALUES (?, ?)", list(totals))

    rdd.foreachPartition(save_partition)


def create_context(input_dir, checkpoint_dir, database):
    print("no checkpoint to recover from: building the streaming program", flush=True)
    sc = local_spark_context("recoverable-wordcount")
    ssc = StreamingContext(sc, BATCH_SECONDS)
    ssc.checkpoint(checkpoint_dir)
    words = ssc.textFileStream(input_dir).flatMap(str.split).map(lambda word: (word, 1))
    totals = words.updateStateByKey(add_counts)
    totals.foreachRDD(lambda rdd: save_totals(database, rdd))
    return ssc


if __name__ == "__main__":
    input_dir, checkpoint_dir, database = sys.argv[1:4]
    with sqlite3.connect(database) as db:
        db.execute(SCHEMA)
    ssc = StreamingContext.getOrCreate(
        checkpoint_dir, lambda: create_context(input_dir, checkpoint_dir, database)
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signal, _frame: stop.set())
    ssc.start()
    print("streaming: SIGTERM or Ctrl-C stops", flush=True)
    try:
        while not stop.is_set():
            ssc.awaitTerminationOrTimeout(0.5)
    except KeyboardInterrupt:
        pass
    ssc.stop(stopSparkContext=True, stopGraceFully=False)
