"""Where the machine's CPU goes while a job recovers from an executor's loss (`python -m
bench.recovery fault --cpu`): every process of the run sampled a few times a second, and each
kill's window, from the kill to the recovery, read as CPU-seconds per role, the replacement
executor's JVM split by its threads' names.

On two cores the backlog a kill leaves drains on the cores the batches do not use, and a new
executor JVM's start takes its share of them: its CPU-seconds bound how soon the delay can be
back. Thread names come from /proc (Linux).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass, field

import psutil

SAMPLE_S = 0.25
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# a thread's name (/proc's comm, cut to 15 characters) -> its group in the replacement's split
THREAD_GROUPS = (
    ("C2 CompilerThre", "C2 compiler"),
    ("C1 CompilerThre", "C1 compiler"),
    ("Executor task l", "tasks"),
    ("java", "main (start-up)"),
)


@dataclass
class Sample:
    """The run's processes at one moment: each one's role and CPU-seconds since it started,
    each executor JVM's per thread group, and the machine's idle CPU-seconds since boot."""

    t: float
    idle_s: float
    cpu_s: dict[int, float] = field(default_factory=dict)
    role: dict[int, str] = field(default_factory=dict)
    parent: dict[int, int] = field(default_factory=dict)
    threads: dict[int, dict[str, float]] = field(default_factory=dict)


def role_of(cmdline: list[str]) -> str:
    line = " ".join(cmdline)
    if "CoarseGrainedExecutorBackend" in line:
        return "executor JVM"
    if "SparkSubmit" in line:
        return "driver JVM"
    if "pydaemon" in line or "pyspark.daemon" in line:
        return "Python workers"
    if "bench.recovery" in line:
        return "driver Python"
    return "the run's other processes"


def thread_group(name: str) -> str:
    return next((group for prefix, group in THREAD_GROUPS if name.startswith(prefix)), "other")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU-seconds of a process's threads, summed per thread group (a thread that ends while
    they are read is left out; the process's own end raises)."""
    groups: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                text = stat.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        group = thread_group(name)
        groups[group] = groups.get(group, 0.0) + ticks / CLOCK_TICKS
    return groups


def sample(root: int) -> Sample:
    """The process tree under `root` (the subject's process), now."""
    now = Sample(time.time(), psutil.cpu_times().idle)
    try:
        processes = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return now
    for process in processes:
        try:
            times, role, parent = process.cpu_times(), role_of(process.cmdline()), process.ppid()
            threads = thread_cpu_s(process.pid) if role == "executor JVM" else None
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue  # it ended while it was read: left out of this sample whole
        now.cpu_s[process.pid] = times.user + times.system
        now.role[process.pid], now.parent[process.pid] = role, parent
        if threads is not None:
            now.threads[process.pid] = threads
    return now


class Sampler:
    """Samples a process tree every SAMPLE_S seconds on a thread, until stopped."""

    def __init__(self, root: int):
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(root,), daemon=True)
        self._thread.start()

    def _run(self, root: int) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append(sample(root))

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        return self.samples


def at(samples: list[Sample], t: float) -> Sample | None:
    """The last sample taken by `t`."""
    taken = [s for s in samples if s.t <= t]
    return taken[-1] if taken else None


def owner(pid: int, moment: Sample) -> int | None:
    """The executor JVM a Python worker runs under (its daemon's parent), if any."""
    for _ in range(4):
        pid = moment.parent.get(pid, -1)
        if moment.role.get(pid) == "executor JVM":
            return pid
    return None


@dataclass
class Spent:
    """One window's CPU-seconds: per role, and the replacement executor JVM's per thread group."""

    window_s: float
    cpu_s: dict[str, float]
    replacement_threads_cpu_s: dict[str, float]


def spent(samples: list[Sample], start: float, end: float, cores: int = 0) -> Spent | None:
    """CPU-seconds per role between `start` and `end` (the kill and the recovery) on `cores`
    (this machine's by default); a process first seen after `start` is the replacement's, and
    counts from its own start."""
    before, after = at(samples, start), at(samples, end)
    if before is None or after is None or after.t <= before.t:
        return None
    window = after.t - before.t
    by_role: dict[str, float] = {}
    for pid, cpu in after.cpu_s.items():
        role = after.role[pid]
        anchor = owner(pid, after) if role == "Python workers" else pid
        if anchor is not None and after.role.get(anchor) == "executor JVM":
            role = ("replacement's " if anchor not in before.cpu_s else "survivor's ") + role
        used = cpu - before.cpu_s.get(pid, 0.0)
        by_role[role] = by_role.get(role, 0.0) + used
    cores = cores or psutil.cpu_count() or 1
    idle = after.idle_s - before.idle_s
    by_role["other processes"] = max(0.0, cores * window - idle - sum(by_role.values()))
    by_role["idle"] = idle
    new = [pid for pid in after.threads if pid not in before.cpu_s]
    threads = after.threads[new[0]] if len(new) == 1 else {}
    return Spent(
        round(window, 1),
        {role: round(v, 1) for role, v in sorted(by_role.items())},
        {group: round(v, 1) for group, v in sorted(threads.items())},
    )


def medians(each: list[Spent]) -> dict[str, dict[str, float]]:
    """Each role's and each replacement thread group's median over the kills read (a kill
    without some role counting 0 for it)."""

    def median_of(parts: list[dict[str, float]]) -> dict[str, float]:
        keys = sorted({key for part in parts for key in part})
        return {key: round(statistics.median(p.get(key, 0.0) for p in parts), 1) for key in keys}

    return {
        "cpu_s": median_of([k.cpu_s for k in each]),
        "replacement_threads_cpu_s": median_of([k.replacement_threads_cpu_s for k in each]),
    }
