"""A recovery run of one system, in its own process: prints every completed batch as it happens.

`--kill-executor-after N` (with a local-cluster master) SIGKILLs one executor JVM after N
batches, as a lost node; the lost cached state is recomputed (DStreams: from lineage and the last
state checkpoint; Structured Streaming: from the state store's files). For a driver restart, the
parent SIGKILLs this whole process group and starts it again on the same checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import psutil
from pyspark import SparkContext

from bench.common import DAEMONS, PARTITIONS, emit, spark_conf
from bench.throughput.systems import SYSTEM_CLASSES, Batch, StructuredSystem


def kill_one_executor() -> int | None:
    """SIGKILL one executor JVM of this driver (local-cluster mode); its pid, if there was one."""
    for child in psutil.Process().children(recursive=True):
        try:
            if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                os.kill(child.pid, signal.SIGKILL)
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=sorted(SYSTEM_CLASSES), required=True)
    parser.add_argument("--workload", default="wordcount")
    parser.add_argument("--variant", required=True)
    parser.add_argument("--daemon", choices=DAEMONS, required=True)
    parser.add_argument("--rate", type=int, required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--batches", type=int, required=True, help="stop after this many")
    parser.add_argument("--kill-executor-after", type=int, default=None)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--log-level", default="ERROR")
    parser.add_argument("--batch-ms", type=int, default=1000, help="the batch interval")
    args = parser.parse_args(argv)
    conf = spark_conf(args.master, args.partitions, args.daemon)
    conf.setAll([tuple(setting.split("=", 1)) for setting in args.conf])
    sc = SparkContext(conf=conf)
    sc.setLogLevel(args.log_level)
    try:
        system = SYSTEM_CLASSES[args.system](sc, args.partitions)
        system.batch_ms = args.batch_ms
        system.on_batch = lambda batch: emit(event="batch", **Batch.to_json(batch))
        if isinstance(system, StructuredSystem):
            stop = system.start(
                args.workload, args.variant, args.rate, args.checkpoint, wall_clock=True
            )
        else:
            stop = system.start(args.workload, args.variant, args.rate, args.checkpoint)
        emit(event="started", ms=int(time.time() * 1000))
        deadline = time.monotonic() + 3 * args.batches * args.batch_ms / 1000 + 60
        try:
            if args.kill_executor_after is not None:
                system.wait_for(args.kill_executor_after, deadline)
                emit(event="killed", ms=int(time.time() * 1000), pid=kill_one_executor())
            system.wait_for(args.batches, deadline)
        finally:
            stop()
    finally:
        sc.stop()
    return 0
