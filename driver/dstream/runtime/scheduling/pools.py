"""Spark scheduler pools: batches first, interactive work second.

A REST slice query, or the sampler that counts state keys for /metrics, runs Spark jobs on the
same executors as the stream. Under Spark's default FIFO scheduling a query submitted before a
batch's job takes every free task slot until its stages are done, so one heavy query can hold a
batch for many intervals. Under FAIR scheduling with these pools, a batch's tasks get the next
free slots (its pool is weighted 4:1 and always has a minimum share of one slot), and a query
only uses what the stream leaves.

`dstream run` and the Kubernetes driver turn FAIR scheduling on (SPARK_CONF). A program that
creates its own SparkContext can add SPARK_CONF to its conf; without it the pool properties are
ignored and Spark schedules FIFO, as pyspark.streaming does. FAIR scheduling does not preempt
a running task, so the API also runs a query in at most half the task slots
(dstream.service.job_view.query_partitions): the stream always finds a free one.
"""

from __future__ import annotations

from importlib import resources

from pyspark import SparkContext

BATCHES = "dstream-batches"
QUERIES = "dstream-queries"

SPARK_CONF = {
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": str(
        resources.files("dstream.runtime.scheduling") / "pools.xml"
    ),
}


def use_pool(sc: SparkContext, pool: str) -> None:
    """Run this thread's later Spark jobs in `pool` (a thread-local Spark property)."""
    sc.setLocalProperty("spark.scheduler.pool", pool)
