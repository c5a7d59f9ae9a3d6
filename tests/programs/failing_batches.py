"""Failed batches as pyspark.streaming programs see them: a function raising in `map` or in
`transformWith` must reach `awaitTerminationOrTimeout` within seconds (Spark's tests wait 10)
as an exception carrying the task's own error, under dstream's default failure policy (which retries the batch meanwhile); and with
the settings that reproduce pyspark.streaming exactly (no retry, skip the batch) the failed
batch is dropped and later ones run on. Prints one JSON line of what each scenario saw;
tests/streaming/test_porting.py runs it.
"""

from __future__ import annotations

import json
import time
import traceback

from dstream import StreamingContext
from pyspark import SparkConf, SparkContext

ERROR = "This is a special error"
# Spark's tests wait 10 s. The first job of a cold context can take longer on a loaded 2-core
# machine, and any wait under the 31 s that the default retries take (1 + 2 + 4 + 8 + 16 s)
# still tells a raise at the first failed attempt from one after the retries.
AWAIT_S = 20
PYSPARK_EXACTLY = {
    "spark.dstream.failurePolicy.retries": "0",
    "spark.dstream.failurePolicy.onExhausted": "skip",
}


def spark(settings: dict[str, str]) -> SparkContext:
    conf = SparkConf().setMaster("local[2]").setAppName("failing-batches")
    conf.set("spark.ui.enabled", "false").setAll(list(settings.items()))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("OFF")
    sc.parallelize([0], 1).count()  # the JVM's and a Python worker's start, before any timing
    return sc


def raised_within(ssc: StreamingContext, seconds: float) -> str:
    """The traceback awaitTerminationOrTimeout raised within `seconds`, or '' if none."""
    try:
        ssc.awaitTerminationOrTimeout(seconds)
    except BaseException:
        return traceback.format_exc()
    return ""


def always_fails(*_args: object) -> None:
    raise ValueError(ERROR)


def fails_on_one(i: int) -> int:
    if i == 1:
        raise ValueError(ERROR)
    return i


def failing_map(sc: SparkContext) -> str:
    ssc = StreamingContext(sc, 0.5)
    ssc.queueStream([sc.parallelize([d], 1) for d in range(4)]).map(always_fails).pprint()
    ssc.start()
    try:
        return raised_within(ssc, AWAIT_S)
    finally:
        ssc.stop(stopSparkContext=False)


def failing_transform_with(sc: SparkContext) -> str:
    ssc = StreamingContext(sc, 0.5)
    inputs = [sc.parallelize([d], 1) for d in range(4)]
    first, second = ssc.queueStream(inputs), ssc.queueStream(inputs)
    first.transformWith(always_fails, second, True).pprint()
    ssc.start()
    try:
        return raised_within(ssc, AWAIT_S)
    finally:
        ssc.stop(stopSparkContext=False)


def skipped_batch(sc: SparkContext) -> tuple[list[list[int]], str]:
    """The first three batches' output of a map that fails on the second, and what
    awaitTerminationOrTimeout raised after them."""
    ssc = StreamingContext(sc, 0.5)
    results: list[list[int]] = []
    stream = ssc.queueStream([sc.parallelize([d], 1) for d in range(4)]).map(fails_on_one)
    stream.foreachRDD(lambda rdd: results.append(rdd.collect()))
    ssc.start()
    deadline = time.monotonic() + 60
    while len(results) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        return results[:3], raised_within(ssc, AWAIT_S)
    finally:
        ssc.stop(stopSparkContext=False)


def main() -> None:
    sc = spark({})
    seen = {"map": failing_map(sc), "transformWith": failing_transform_with(sc)}
    sc.stop()
    sc = spark(PYSPARK_EXACTLY)
    seen["skipped"], seen["skippedRaised"] = skipped_batch(sc)
    sc.stop()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
