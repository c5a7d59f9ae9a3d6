"""Queue stream: a test's favourite source. Each batch takes the next RDD from a list, here
temperature readings, and prints the average per sensor for that batch.

    python examples/programs/queue_stream.py
    STREAMING_ENGINE=pyspark python examples/programs/queue_stream.py
"""

from engine import StreamingContext, local_spark_context, run_batches

READINGS = [
    [("kitchen", 21.0), ("cellar", 12.5), ("kitchen", 22.0)],
    [("attic", 30.0), ("cellar", 13.5)],
    [("kitchen", 20.0), ("attic", 28.0), ("attic", 29.0), ("cellar", 12.0)],
    [("cellar", 11.0)],
]
BATCHES = len(READINGS)

if __name__ == "__main__":
    sc = local_spark_context("queue-stream")
    ssc = StreamingContext(sc, 0.5)
    readings = ssc.queueStream([sc.parallelize(batch, 2) for batch in READINGS])
    sums = readings.mapValues(lambda t: (t, 1)).reduceByKey(lambda a, b: (a[0] + b[0], a[1] + b[1]))
    sums.mapValues(lambda s: round(s[0] / s[1], 2)).pprint()
    run_batches(ssc, BATCHES)
