#
# Spark's examples/src/main/python/streaming/stateful_network_wordcount.py (Apache License 2.0),
# ported to dstream: the import changes, and since dstream has no socket receiver (sockets cannot
# be replayed after a failure), the lines come from a directory (textFileStream) instead.
#
"""
Counts words in UTF8 encoded, '\n' delimited text in new files of a directory, with a running
total per word kept by updateStateByKey.
Usage: stateful_wordcount.py <directory>
"""

import sys

from pyspark import SparkContext
from dstream import StreamingContext  # was: from pyspark.streaming import StreamingContext

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("Usage: stateful_wordcount.py <directory>", file=sys.stderr)
        sys.exit(-1)
    sc = SparkContext(appName="PythonStreamingStatefulNetworkWordCount")
    ssc = StreamingContext(sc, 1)
    ssc.checkpoint("checkpoint")

    # RDD with initial state (key, value) pairs
    initialStateRDD = sc.parallelize([("hello", 1), ("world", 1)])

    def updateFunc(new_values, last_sum):
        return sum(new_values) + (last_sum or 0)

    lines = ssc.textFileStream(sys.argv[1])
    running_counts = (
        lines.flatMap(lambda line: line.split(" "))
        .map(lambda word: (word, 1))
        .updateStateByKey(updateFunc, initialRDD=initialStateRDD)
    )

    running_counts.pprint()

    ssc.start()
    ssc.awaitTermination()
