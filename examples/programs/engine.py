"""The engine the example programs run on, chosen by one environment variable.

`STREAMING_ENGINE=pyspark` runs them on Spark's own (deprecated) pyspark.streaming; anything else,
or nothing, on dstream. A program of your own needs none of this: it imports StreamingContext
from `dstream` instead of `pyspark.streaming`, and that is the whole port.
"""

from __future__ import annotations

import os
import sys
import time

from pyspark import SparkConf, SparkContext

if os.environ.get("STREAMING_ENGINE") == "pyspark":
    from pyspark.streaming import StreamingContext, StreamingListener
else:
    from dstream import StreamingContext, StreamingListener

__all__ = ["StreamingContext", "local_spark_context", "run_batches"]

# Spark starts its Python workers with PYSPARK_PYTHON, else whichever `python3` is first on PATH,
# which need not have pyspark (or dstream) installed: this interpreter certainly has them.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def local_spark_context(app_name: str) -> SparkContext:
    """A SparkContext on two local cores, unless spark-submit said otherwise."""
    conf = SparkConf().setAppName(app_name).setIfMissing("spark.master", "local[2]")
    sc = SparkContext.getOrCreate(conf.set("spark.ui.showConsoleProgress", "false"))
    sc.setLogLevel("ERROR")
    return sc


class _BatchCounter(StreamingListener):
    def __init__(self) -> None:
        super().__init__()
        self.completed = 0

    def onBatchCompleted(self, batchCompleted: object) -> None:
        self.completed += 1


def run_batches(ssc: StreamingContext, batches: int, timeout_s: float = 600) -> None:
    """Start, stop once `batches` batches have completed (a batch's error is raised), and stop
    the SparkContext too: how a finite example ends, whatever the machine's speed."""
    counter = _BatchCounter()
    ssc.addStreamingListener(counter)
    ssc.start()
    deadline = time.monotonic() + timeout_s
    while counter.completed < batches:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{counter.completed} of {batches} batches in {timeout_s} s")
        ssc.awaitTerminationOrTimeout(0.1)
    ssc.stop(stopSparkContext=True, stopGraceFully=False)
