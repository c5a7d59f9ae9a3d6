"""Peak resident memory of a worker's process tree, split into driver and executor processes.

The driver is the worker's Python process plus its Spark JVM (in local mode that JVM also hosts
the executor's task threads); executors are Spark's Python workers (pyspark.daemon and its forks)
and, in local-cluster mode, the executor JVMs (CoarseGrainedExecutorBackend).
"""

from __future__ import annotations

import threading
from collections import defaultdict

import psutil

MB = 1024 * 1024


def role(process: psutil.Process) -> str:
    """'executor' for Python workers and executor JVMs, else 'driver'."""
    try:
        cmdline = " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "driver"
    if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
        return "executor"
    if "CoarseGrainedExecutorBackend" in cmdline:
        return "executor"
    return "driver"


class MemorySampler:
    """Samples RSS by role every `period` s; peaks are kept per label (e.g. workload/phase)."""

    def __init__(self, pid: int, period: float = 0.5):
        self._root = psutil.Process(pid)
        self._period = period
        self.label = "startup"
        self.peaks: dict[str, dict[str, float]] = defaultdict(lambda: {"driver": 0, "executor": 0})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> dict[str, float]:
        totals = {"driver": 0.0, "executor": 0.0}
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return totals
        for process in processes:
            try:
                totals[role(process)] += process.memory_info().rss / MB
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return totals

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            totals = self.sample()
            for label in (self.label, "all"):
                peak = self.peaks[label]
                for key, value in totals.items():
                    peak[key] = max(peak[key], value)
