"""A recovery run of one system, in its own process: prints every completed batch as it happens.

`--kill-executor-after N` (with a local-cluster master) SIGKILLs one executor JVM after N
batches, as a lost node; the lost cached state is recomputed (DStreams: from lineage and the last
state checkpoint; Structured Streaming: from the state store's files). With `--kills K`, K
executors in turn. Each kill, the first too, waits until the job is on schedule (ON_SCHEDULE
batches in a row started on time) and, after the one before, at least `--kill-every M` batches
and one batch more each time (M, M + 1, M + 2, ...; at most 4 times that: a job that does not get
back is killed again all the same, and its recovery counts as not seen). The growing gap walks
the kills through every phase of the state checkpoints: a kill right after one has a short
lineage to recompute, one a few batches later recomputes those batches' lost shuffle outputs,
and with a fixed gap that is a multiple of the checkpoint interval (30 and 10 batches) every
kill of a run landed at the same phase. For a driver restart, the
parent SIGKILLs this whole process group and starts it again on the same checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import psutil
from pyspark import SparkContext

from bench.common import DAEMONS, PARTITIONS, emit
from bench.recovery.cpu import role_of
from bench.throughput.systems import SYSTEM_CLASSES, Batch, StructuredSystem, System, system_conf

ON_SCHEDULE = 10  # batches in a row started on time before a kill: the job is in its steady state


def kill_one_executor() -> int | None:
    """SIGKILL one executor JVM of this driver (local-cluster mode); its pid, if there was one."""
    for child in psutil.Process().children(recursive=True):
        try:
            if role_of(child.cmdline()) == "executor JVM":
                os.kill(child.pid, signal.SIGKILL)
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def kill_gap(every: int, kill: int) -> int:
    """Batches at least between kill number `kill` (from 0) and the next: one more each time,
    so that a run's kills fall at every phase of the state checkpoints (see the module)."""
    return every + kill


def kill_executors(
    system: System, first_after: int, kills: int, every: int, deadline: float
) -> int:
    """`kills` executors killed in turn, each reported (see the module docstring); the number
    of batches the run needs after the last kill."""
    since = first_after
    for kill in range(kills):
        system.wait_for(since, deadline)
        gap = kill_gap(every, kill)
        settle_by = time.monotonic() + 3 * max(gap, first_after) * system.batch_ms / 1000
        system.wait_until_on_schedule(since, ON_SCHEDULE, min(deadline, settle_by))
        emit(event="killed", ms=int(time.time() * 1000), pid=kill_one_executor())
        since = system.completed() + gap
    return since


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
    parser.add_argument("--kills", type=int, default=1, help="executors killed in turn")
    parser.add_argument("--kill-every", type=int, default=20, help="batches between kills")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--log-level", default="ERROR")
    parser.add_argument("--batch-ms", type=int, default=1000, help="the batch interval")
    args = parser.parse_args(argv)
    conf = system_conf(args.system, args.master, args.partitions, args.daemon, args.conf)
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
            batches = args.batches
            if args.kill_executor_after is not None:
                needed = kill_executors(
                    system, args.kill_executor_after, args.kills, args.kill_every, deadline
                )
                batches = max(batches, needed)
            system.wait_for(batches, deadline)
        finally:
            stop()
    finally:
        sc.stop()
    return 0
