"""A driver's recovery timeline: when each phase of getting back on schedule was reached.

Every phase is logged once per process, as one line that a supervisor or a test can read
against the moment of the fault (the wall clock is shared; the fault itself is known only
outside the driver):

    recovery timeline: phase=<name> at=<unix seconds> since_start=<seconds>s

The phases, in the order a restarted driver reaches them (a standby reaches the first four
before the fault, so its figures start at `lead_taken`):
    process_started       the driver's process was created (from the kernel's start time)
    jvm_up                the Spark JVM answers
    sparkcontext_up       the SparkContext is created
    executors_registered  every executor the master asks for has registered
    lead_taken            the checkpoint's lease is ours (the fault detected, for a standby)
    state_restored        the checkpoint is read back: sources repositioned, state loaded
    replayed              the batches recorded but not committed have run again
    on_schedule           a batch started less than one interval after its time
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

PHASES = (
    "process_started",
    "jvm_up",
    "sparkcontext_up",
    "executors_registered",
    "lead_taken",
    "state_restored",
    "replayed",
    "on_schedule",
)
_marked: set[str] = set()


def process_start_time() -> float:
    """When this process was created (unix seconds): its start in clock ticks after boot, from
    /proc, against the uptime (both to 10 ms; the boot time /proc gives is in whole seconds).
    Now, where there is no /proc."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as uptime:
            up = float(uptime.read().split()[0])
    except (OSError, IndexError, ValueError):
        return time.time()
    return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))


_STARTED = process_start_time()


def mark(phase: str, at: float | None = None) -> None:
    """Log that `phase` was reached (now, or `at`); only its first time in this process counts."""
    if phase in _marked:
        return
    _marked.add(phase)
    when = time.time() if at is None else at
    log.info("recovery timeline: phase=%s at=%.3f since_start=%.2fs", phase, when, when - _STARTED)


def mark_process_started() -> None:
    mark("process_started", _STARTED)


def expected_executors(master: str, instances: str | None) -> int:
    """How many executors the master starts: local-cluster's count, none in local mode (the
    driver runs the tasks), else spark.executor.instances (Spark's default: 2)."""
    cluster = re.match(r"local-cluster\[(\d+)", master)
    if cluster:
        return int(cluster.group(1))
    if master.startswith("local"):
        return 0
    return int(instances or 2)


def watch_executors(sc: SparkContext, poll_s: float = 0.1) -> None:
    """Mark `executors_registered` once as many executors as expected have registered,
    watching from a daemon thread (a SparkContext stopped first ends it unmarked)."""
    conf = sc._conf
    expected = expected_executors(
        conf.get("spark.master", "local"), conf.get("spark.executor.instances")
    )

    def watch() -> None:
        tracker = sc._jsc.sc().statusTracker()
        try:
            while len(tracker.getExecutorInfos()) - 1 < expected:  # the driver is listed too
                time.sleep(poll_s)
        except Exception:  # the SparkContext stopped
            return
        mark("executors_registered")

    threading.Thread(target=watch, name="dstream-executors-watch", daemon=True).start()
