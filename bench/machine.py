"""What the results were measured on: cores, memory, CPU, versions and the load around the run."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

import psutil


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def wait_for_quiet(limit: float, max_wait_s: float) -> tuple[float, float, float]:
    """Wait (at most max_wait_s) for a 1-minute load average below `limit`; return the load."""
    deadline = time.monotonic() + max_wait_s
    while load_average()[0] >= limit and time.monotonic() < deadline:
        time.sleep(10)
    return load_average()


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
