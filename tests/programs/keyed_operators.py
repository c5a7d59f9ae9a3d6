"""A pyspark.streaming program ported by its import: the keyed and windowed operators whose
tasks run dstream's own code in the Python workers. It prints, as one JSON line, every batch's
output of each operator. tests/streaming/test_workers_without_dstream.py runs it with workers on an
interpreter that has PySpark (through Spark's pyspark.zip) but not dstream.

Usage: keyed_operators.py CHECKPOINT_DIR
"""

from __future__ import annotations

import json
import sys
import time

from dstream import StreamingContext, StreamingListener
from pyspark import SparkConf, SparkContext

BATCHES = [["a", "b", "a"], ["b", "c"], ["a", "c", "c"], ["d"]]
BATCH_S, WINDOW_S = 0.5, 1.0


class Completed(StreamingListener):
    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def onBatchCompleted(self, batchCompleted: object) -> None:
        self.batches += 1


def gather_into(batches: list[list]):
    return lambda rdd: batches.append(sorted(rdd.collect()))


def main(checkpoint: str) -> None:
    conf = SparkConf().setMaster("local[2]").setAppName("keyed-operators")
    sc = SparkContext.getOrCreate(conf.set("spark.ui.enabled", "false"))
    sc.setLogLevel("ERROR")
    ssc = StreamingContext(sc, BATCH_S)
    ssc.checkpoint(checkpoint)
    words = ssc.queueStream([sc.parallelize(batch, 2) for batch in BATCHES])
    pairs = words.map(lambda w: (w, 1))
    add, sub = (lambda a, b: a + b), (lambda a, b: a - b)
    operators = {
        "reduceByKey": pairs.reduceByKey(add),
        "countByValue": words.countByValue(),
        "combineByKey": pairs.combineByKey(lambda v: [v], lambda c, v: c + [v], add),
        "countByWindow": words.countByWindow(WINDOW_S, BATCH_S),
        "countByValueAndWindow": words.countByValueAndWindow(WINDOW_S, BATCH_S),
        "groupByKeyAndWindow": pairs.groupByKeyAndWindow(WINDOW_S, BATCH_S).mapValues(list),
        "reduceByKeyAndWindow": pairs.reduceByKeyAndWindow(add, None, WINDOW_S, BATCH_S),
        "reduceByKeyAndWindow-inverse": pairs.reduceByKeyAndWindow(add, sub, WINDOW_S, BATCH_S),
    }
    outputs: dict[str, list[list]] = {}
    for name, stream in operators.items():
        stream.foreachRDD(gather_into(outputs.setdefault(name, [])))
    completed = Completed()
    ssc.addStreamingListener(completed)
    ssc.start()
    deadline = time.monotonic() + 300
    while completed.batches < len(BATCHES) and time.monotonic() < deadline:
        ssc.awaitTerminationOrTimeout(0.1)
    ssc.stop(stopSparkContext=True)
    print(json.dumps(outputs))


if __name__ == "__main__":
    main(sys.argv[1])
