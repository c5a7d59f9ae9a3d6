"""`python -m bench.state`: a keyed-state job's cost per batch at two state sizes K, with the same
U keys updated per batch: mapWithState on the memory and the RocksDB store, and
updateStateByKey (state RDDs) beside them.

Each (system, K) runs in its own process (its own JVM, local[2], 2 state partitions, dstream's
worker daemon): K keys are loaded through the initial state, then `--batches` batches each
update U keys drawn at random (seed 7) from the K, on a manual clock advanced as soon as a batch
is done. The first batch, which loads the initial state, is reported apart. Per case: the wall
time of a batch, from the clock's advance to the batch's completion (median, max), and for the
stores the changelog bytes one batch writes (all partitions). The parent writes the table to
stdout (markdown) and each case's JSON line to stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, spark_conf

SYSTEMS = ("mapWithState/memory", "mapWithState/rocksdb", "updateStateByKey")
SEED = 7


def running_total(key: str, value: int | None, state: Any) -> int:
    total = (state.getOption() or 0) + (value or 0)
    state.update(total)
    return total


def add(values: list[int], total: int | None) -> int:
    return (total or 0) + sum(values)


def measure(system: str, keys: int, updates: int, batches: int) -> dict[str, Any]:
    """One case in this process: per-batch processing times and changelog bytes."""
    from dstream import StateSpec, StreamingContext
    from dstream.runtime.scheduling.clock import ManualClock
    from pyspark import SparkContext

    conf = spark_conf("local[2]", 2, "dstream.worker.pydaemon")
    if system.startswith("mapWithState/"):
        conf.set("spark.dstream.state.store", system.partition("/")[2])
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    checkpoint = Path(tempfile.mkdtemp(prefix="dstream-bench-state-"))
    ssc = StreamingContext(sc, 1, clock=ManualClock(0))
    ssc.checkpoint(str(checkpoint))
    initial = sc.range(keys, numSlices=2).map(lambda i: (f"user-{i}", 0))
    rng = random.Random(SEED)
    queued = [
        sc.parallelize([(f"user-{i}", 1) for i in rng.sample(range(keys), updates)], 2)
        for _ in range(batches + 1)
    ]
    pairs = ssc.queueStream(queued)
    if system == "updateStateByKey":
        state = pairs.updateStateByKey(add, 2, initial)
    else:
        state = pairs.mapWithState(
            StateSpec.function(running_total).numPartitions(2).initialState(initial)
        )
    state.foreachRDD(lambda rdd: rdd.count())
    ssc.start()
    seconds = []
    for _ in range(batches + 1):
        started = time.perf_counter()
        ssc._clock.advance(1000)
        ssc._scheduler.wait_for_batch(ssc._clock.now_ms(), 1800)
        seconds.append(time.perf_counter() - started)
    times = [info.batch_time_ms for info in ssc._scheduler.history]
    ssc.stop()
    changelogs = [
        sum(p.stat().st_size for p in checkpoint.glob(f"stores/*/*/changelog-{time_ms}"))
        for time_ms in times[1:]
    ]
    return {
        "system": system,
        "keys": keys,
        "updates": updates,
        "first_batch_s": seconds[0],
        "median_s": statistics.median(seconds[1:]),
        "max_s": max(seconds[1:]),
        "changelog_bytes": statistics.median(changelogs) if changelogs and changelogs[0] else None,
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| system | K keys | U per batch | first batch (s) | batch median (s) | batch max (s) | "
        "changelog per batch (bytes) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        changelog = f"{r['changelog_bytes']:,.0f}" if r["changelog_bytes"] else "-"
        lines.append(
            f"| {r['system']} | {r['keys']:,} | {r['updates']:,} | {r['first_batch_s']:.2f} | "
            f"{r['median_s']:.2f} | {r['max_s']:.2f} | {changelog} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.state", description=__doc__)
    parser.add_argument("--keys", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.one:
        [system], [keys] = options.systems, options.keys
        print(json.dumps(measure(system, keys, options.updates, options.batches)), flush=True)
        return 0
    results = []
    for keys in options.keys:
        for system in options.systems:
            started = time.monotonic()
            command = [sys.executable, "-m", "bench.state", "--one", "--systems", system]
            command += ["--keys", str(keys), "--updates", str(options.updates)]
            command += ["--batches", str(options.batches)]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["wall_s"] = round(time.monotonic() - started, 1)
            print(json.dumps(result), file=sys.stderr, flush=True)
            results.append(result)
    print(table(results))
    return 0
