"""What the benchmark programs share: where results and logs go, the input's seed and record
shape, and how a measured process is started in its own process group and stopped with it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LOGS = ROOT / "bench" / "logs"

# Every system reads the same lines: dstream.worker.textgen's pool of RECORD_BYTES-byte lines
# for SEED, spread over PARTITIONS input partitions.
SEED = 7
RECORD_BYTES = 100
PARTITIONS = 2


def start_process(command: list[str], log_name: str, stdin: bool = False) -> subprocess.Popen[str]:
    """`command` from the repository's root in a process group of its own (its JVM and Python
    workers join it), stdout piped for its JSON events, stderr to bench/logs/<log_name>."""
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / log_name, "w") as log:
        return subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )


def kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL the process's whole group (driver, JVM, Python workers) and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
