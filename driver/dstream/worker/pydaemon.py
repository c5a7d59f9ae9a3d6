"""Spark's Python worker daemon, minus two fixed costs PySpark's own daemon adds to every task.

The JVM sends a task to its Python worker in two writes over loopback TCP: the command, then
the partition's data. Its socket keeps Nagle's algorithm on, so the data waits until the worker
acknowledges the command, and the worker's kernel delays that acknowledgement by 40 ms. Every
Python task of every Spark job paid this (a trivial two-task job took ~100 ms instead of ~25),
which at one-second batches of several stages is much of the interval.

Spark starts this module in place of `pyspark.daemon` (`spark.python.daemon.module`, which the
engine sets; the daemon's own worker-module option accepts only pyspark's modules). It runs
PySpark's daemon and worker unchanged, except that before each read from the JVM a worker asks
the kernel to acknowledge at once (TCP_QUICKACK, which the kernel clears again on its own), and
Nagle's algorithm is off on the worker's side too.

The daemon also runs a full garbage collection in the worker after every task. That walks every
object the worker holds, nearly all of them modules and caches inherited from the daemon or
imported by earlier tasks, and writes to each of them, which copies the daemon's memory pages
into the forked worker: tens of milliseconds per task for a worker's ~96,000 objects, more than
a small streaming task's own work. So the daemon freezes its objects before it forks workers (the
use `gc.freeze` documents), and a worker freezes what it holds after a task that imported
modules: later collections walk only what the tasks since have made. Frozen objects are still
freed when their last reference goes; only cycles among them would outlive their use, and they
are made a bounded number of times, by imports.

Last, the daemon imports pyspark from the installed package rather than from Spark's zips. Spark
puts `python/lib/pyspark.zip` and py4j's zip first on every worker's path, and a zip holds no
bytecode, so each daemon start compiled pyspark's modules again: 0.69 s against 0.17 s (quiet),
on the path of every new executor's first Python task (a restarted driver's replay, a lost
executor's replacement).
"""

from __future__ import annotations

import gc
import importlib.machinery
import io
import os
import socket
import sys
from typing import BinaryIO

QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only

# What a SparkConf needs for Spark to start this daemon (dstream run sets it by default).
SPARK_CONF = {"spark.python.daemon.module": "dstream.worker.pydaemon"}

_modules_when_frozen = 0


class QuickAckReader(io.RawIOBase):
    """Reads through `stream` (the worker's buffered socket file), re-arming immediate
    acknowledgements before each read that may wait for the JVM."""

    def __init__(self, stream: BinaryIO, sock: socket.socket):
        self._stream = stream
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        self._sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
        data = self._stream.read1(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _tcp_socket(stream: BinaryIO) -> socket.socket | None:
    """The socket under `stream`, if it is TCP (the daemon's connection to the JVM)."""
    try:
        sock = socket.socket(fileno=os.dup(stream.fileno()))
    except OSError:
        return None
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.close()
        return None
    return sock


def freeze_long_lived() -> None:
    """Keep the objects alive now (modules, caches) out of every later garbage collection."""
    global _modules_when_frozen
    gc.collect()
    gc.freeze()
    _modules_when_frozen = len(sys.modules)


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """`path` with Spark's zips (pyspark's and py4j's) moved to its end when Spark runs from the
    installed pyspark that the rest of `path` imports (pip's: `SPARK_HOME` is that package, the
    zips are its own files, so the code is the same); otherwise unchanged. Moved, not dropped:
    a py4j that is not installed still comes from its zip."""
    spark_zip = next((entry for entry in path if os.path.basename(entry) == "pyspark.zip"), None)
    if spark_zip is None:
        return path
    lib = os.path.dirname(spark_zip)
    zips = [entry for entry in path if entry.endswith(".zip") and os.path.dirname(entry) == lib]
    rest = [entry for entry in path if entry not in zips]
    installed = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    places = (installed.submodule_search_locations or []) if installed else []
    same = os.path.realpath(lib)
    if not any(os.path.realpath(os.path.join(p, "python", "lib")) == same for p in places):
        return path
    return rest + zips


def main(infile: BinaryIO, outfile: BinaryIO) -> None:
    """One task, as `pyspark.worker.main`, on a socket without delayed acknowledgements; what
    the task imported is frozen after it."""
    from pyspark import worker  # the daemon imported it before forking this worker

    sock = _tcp_socket(infile) if QUICKACK is not None else None
    try:
        if sock is None:
            worker.main(infile, outfile)
        else:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            worker.main(io.BufferedReader(QuickAckReader(infile, sock), 65536), outfile)
    finally:
        if sock is not None:
            sock.close()
    if len(sys.modules) != _modules_when_frozen:
        freeze_long_lived()


if __name__ == "__main__":
    sys.path[:] = prefer_installed_pyspark(sys.path)
    from pyspark import daemon, worker  # noqa: F401 (loaded once, shared by forked workers)

    daemon.worker_main = main
    freeze_long_lived()
    daemon.manager()
