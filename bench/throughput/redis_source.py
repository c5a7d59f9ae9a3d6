"""WordCount throughput with a Redis Streams source against the rate source, in one script.

Both sources hold the same lines (`dstream.worker.textgen`, 2 partitions: the Redis stream is filled
with the rate source's records first), each batch is planned through the source's own `plan`
and counted with the built-in WordCount's per-partition counting and `reduceByKey`, on one
local[2] SparkContext. The ratio redis / rate is what reading from a broker costs against
generating the lines in the task. Needs `redis-server` (Debian package redis-server).

    python -m bench.throughput redis-source --records 200000 --trials 3
"""

from __future__ import annotations

import argparse
import operator
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import redis
from dstream import StreamingContext
from dstream.connectors.redis import RedisInputDStream
from dstream.runtime.scheduling.clock import ManualClock
from dstream.sources import InputDStream, RateInputDStream
from dstream.worker import pydaemon, tasks, textgen
from pyspark import SparkConf, SparkContext

from bench.common import PARTITIONS, RECORD_BYTES, SEED


def start_redis(directory: str) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: apt-get install redis-server")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            return server, url
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def fill(url: str, records: int) -> None:
    """The rate source's records, partition by partition, as entries {line: ...} of `lines`."""
    client = redis.Redis.from_url(url)
    per_partition = records // PARTITIONS
    for partition in range(PARTITIONS):
        for start in range(0, per_partition, 10_000):
            end = min(per_partition, start + 10_000)
            pipe = client.pipeline(transaction=False)
            for line in textgen.lines(SEED, RECORD_BYTES, partition, start, end):
                pipe.xadd("lines", {"line": line})
            pipe.execute()


def wordcount(source: InputDStream, records: int) -> tuple[float, dict[str, int]]:
    """Plan one batch of every record and count its words: the seconds it took, and the counts
    (checked against the other source's before either time counts)."""
    started = time.perf_counter()
    planned = source.plan(1000, None)
    assert source.records_in(planned) == records
    counts = source.compute(1000).mapPartitions(tasks.count_words).reduceByKey(operator.add)
    found = dict(counts.collect())
    return time.perf_counter() - started, found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    records = args.records - args.records % PARTITIONS
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = (
        SparkConf()
        .setAll(list(pydaemon.SPARK_CONF.items()))
        .setMaster("local[2]")
        .setAppName("bench-redis-source")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.default.parallelism", str(PARTITIONS))
    )
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as directory:
        server, url = start_redis(directory)
        try:
            fill(url, records)
            seconds: dict[str, list[float]] = {"rate": [], "redis": []}
            for _ in range(args.trials + 1):  # the first round warms up the Python workers
                ssc = StreamingContext(sc, 1, clock=ManualClock())
                rate = RateInputDStream(ssc, records, PARTITIONS, SEED, RECORD_BYTES)
                rate_s, expected = wordcount(rate, records)
                source = RedisInputDStream(ssc, url, ["lines"], field="line")
                redis_s, found = wordcount(source, records)
                if found != expected:
                    raise SystemExit("the Redis-sourced counts differ from the rate source's")
                seconds["rate"].append(rate_s)
                seconds["redis"].append(redis_s)
        finally:
            server.terminate()
            server.wait()
    sc.stop()
    throughput = {k: records / statistics.median(v[1:]) for k, v in seconds.items()}
    for name, value in throughput.items():
        print(f"{name:>6}: {value:>10,.0f} records/s (median of {args.trials})")
    print(f"redis / rate: {throughput['redis'] / throughput['rate']:.2f}")
    return 0
