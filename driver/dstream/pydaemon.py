"""Spark's Python worker daemon, minus the 40 ms stall that Nagle's algorithm adds to every task.

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
"""

from __future__ import annotations

import io
import os
import socket
from typing import BinaryIO

QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only

# What a SparkConf needs for Spark to start this daemon (dstream run sets it by default).
SPARK_CONF = {"spark.python.daemon.module": "dstream.pydaemon"}


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


def main(infile: BinaryIO, outfile: BinaryIO) -> None:
    """One task, as `pyspark.worker.main`, on a socket without delayed acknowledgements."""
    from pyspark import worker  # the daemon imported it before forking this worker

    sock = _tcp_socket(infile) if QUICKACK is not None else None
    if sock is None:
        worker.main(infile, outfile)
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        worker.main(io.BufferedReader(QuickAckReader(infile, sock), 65536), outfile)
    finally:
        sock.close()


if __name__ == "__main__":
    from pyspark import daemon, worker  # noqa: F401 (loaded once, shared by forked workers)

    daemon.worker_main = main
    daemon.manager()
