"""The machine's load while a worker runs: what else competed for the cores.

Every `period` s: the 1-minute load average, the cores busy machine-wide, and the cores the
worker's own process tree used; the difference is what other processes took (on a shared
machine, the part of a result that is not the system under test).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil


def busy_seconds() -> float:
    """CPU seconds spent not idle, summed over all cores, since boot."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def tree_seconds(root: psutil.Process) -> float:
    """CPU seconds of a process and its live descendants (those that ended are not counted)."""
    total = 0.0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for process in processes:
        try:
            cpu = process.cpu_times()
            total += cpu.user + cpu.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


class LoadSampler:
    def __init__(self, pid: int, period: float = 2.0):
        self._root = psutil.Process(pid)
        self._period = period
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        then, busy, own = time.monotonic(), busy_seconds(), tree_seconds(self._root)
        while not self._stop.wait(self._period):
            now, busy_now, own_now = time.monotonic(), busy_seconds(), tree_seconds(self._root)
            elapsed = now - then
            # A Python worker that exited takes its seconds with it: never below zero.
            own_cores = max(0.0, own_now - own) / elapsed
            busy_cores = (busy_now - busy) / elapsed
            self.samples.append(
                {
                    "time_s": time.time(),
                    "load1": os.getloadavg()[0],
                    "busy_cores": round(busy_cores, 2),
                    "own_cores": round(own_cores, 2),
                    "other_cores": round(max(0.0, busy_cores - own_cores), 2),
                }
            )
            then, busy, own = now, busy_now, own_now
