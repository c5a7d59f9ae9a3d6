"""What the results were measured on, and the load gate: who else used the CPU during a trial.

The machine may be shared. Its 1-minute load average counts the benchmark's own work too, so
the gate measures other processes directly: the CPU time the whole machine spent busy (from
/proc/stat, via psutil) minus the CPU time of the benchmark's own process tree (including the
children it reaped: Spark's Python workers come and go). A trial during which others used more
than `limit_cores` in some `block_s`-second stretch is redone; the loads are reported either way.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import psutil

from bench.common import ROOT

UNCOUNTED = (":!bench/results", ":!*.md")  # what git_commit does not count as a change


@dataclass
class LoadSample:
    at_s: float  # seconds since the monitor started
    load1: float
    others_cores: float  # CPU used by processes outside the benchmark, in cores


def busy_reason(samples: list[LoadSample], limit_cores: float, block_s: float) -> str | None:
    """Why the machine counts as busy during these samples (None: it was not): the mean CPU of
    other processes over some stretch of `block_s` seconds (the whole trial, if shorter)
    exceeded `limit_cores`."""
    for i, first in enumerate(samples):
        if i and samples[-1].at_s - first.at_s < block_s:
            break  # the rest is inside a stretch already looked at
        stretch = [s.others_cores for s in samples[i:] if s.at_s - first.at_s < block_s]
        mean = statistics.mean(stretch)
        if mean > limit_cores:
            return (
                f"other processes used {mean:.2f} cores for {block_s:.0f} s (limit {limit_cores})"
            )
    return None


def summarize_load(samples: list[LoadSample]) -> dict[str, float]:
    if not samples:
        return {}
    return {
        "load1_min": min(s.load1 for s in samples),
        "load1_max": max(s.load1 for s in samples),
        "others_cores_mean": round(statistics.mean(s.others_cores for s in samples), 3),
        "others_cores_max": round(max(s.others_cores for s in samples), 3),
    }


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _tree_times(root: psutil.Process) -> dict[tuple[int, float], float]:
    """CPU seconds of each live process of the benchmark's tree, keyed by (pid, create time)."""
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for process in processes:
        try:
            t = process.cpu_times()
            found[(process.pid, process.create_time())] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _tree_delta(
    before: dict[tuple[int, float], float], now: dict[tuple[int, float], float]
) -> float:
    """CPU the tree used between two samples, per process, so that a process ending between them
    (a Python worker, a JVM) does not make the tree's total drop and others' CPU jump."""
    return sum(seconds - before.get(key, 0.0) for key, seconds in now.items())


class LoadMonitor:
    """Samples the 1-minute load and other processes' CPU every `period` s while running."""

    def __init__(self, period: float = 1.0, root_pid: int | None = None):
        self._root = psutil.Process(root_pid or os.getpid())
        self._period = period
        self.samples: list[LoadSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-monitor", daemon=True)

    def __enter__(self) -> LoadMonitor:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        began = last_t = time.monotonic()
        last_busy, last_tree = _busy_seconds(), _tree_times(self._root)
        while not self._stop.wait(self._period):
            now, busy, tree = time.monotonic(), _busy_seconds(), _tree_times(self._root)
            used = _tree_delta(last_tree, tree)
            others = max(0.0, (busy - last_busy) - used) / max(1e-3, now - last_t)
            self.samples.append(LoadSample(round(now - began, 2), os.getloadavg()[0], others))
            last_t, last_busy, last_tree = now, busy, tree


def others_now(seconds: float = 5.0) -> float:
    """Other processes' mean CPU (cores) over the next `seconds`."""
    with LoadMonitor(period=seconds / 5) as monitor:
        time.sleep(seconds)
    return statistics.mean(s.others_cores for s in monitor.samples) if monitor.samples else 0.0


def _java_version() -> str:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = done.stderr.splitlines()
    return lines[0] if lines else "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    """The commit the benchmark runs from, "+changes" when its code differs from it (results
    and Markdown aside: a run may add to the day's results while the docs are edited)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    changes = git("status", "--porcelain", "--untracked-files=no", "--", ".", *UNCOUNTED)
    return commit + ("+changes" if changes else "")


def describe_machine() -> dict[str, object]:
    import pyspark

    return {
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu": _cpu_model(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "pyspark": pyspark.__version__,
        "java": _java_version(),
    }
