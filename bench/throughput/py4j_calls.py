"""The driver's py4j round trips, counted per batch and per call site (`profile --py4j`).

Every call from Python into the JVM (a method, a constructor, a class looked up by name, a
Java object's proxy released) is one `GatewayClient.send_command`: a message over the gateway's
socket and a wait for the answer. At 500 ms batches they are most of what the driver does
besides waiting for jobs, so the counter wraps that one method for the run: per batch it takes
the count at each completed batch, per call site it names the innermost frame of the
engine or the benchmark (`dstream/...`, `bench/...`) that led to the call, and the first
PySpark function it called. Counting walks the stack on every call, which slows the driver:
time batches in a run without it.
"""

from __future__ import annotations

import statistics
import sys
import threading
from collections import Counter
from types import FrameType
from typing import Any

from py4j.java_gateway import GatewayClient

# Where a frame's code lives decides whose call it is.
OURS = ("/dstream/", "/bench/")
PYSPARK = "/pyspark/"
# py4j's command names (py4j.protocol): the first line of every command
KINDS = {"c": "call", "i": "constructor", "r": "reflection", "g": "release", "a": "array"}


def call_site(frame: FrameType | None) -> str:
    """'dstream/runtime/scheduling/graph.py:write_durably > RDD.id': the innermost frame of ours and the
    PySpark function it called (the frame just inside it), or the thread's outermost frame."""
    inner: FrameType | None = None
    while frame is not None:
        path = frame.f_code.co_filename
        if any(part in path for part in OURS) and not path.endswith("py4j_calls.py"):
            ours = f"{_short(path)}:{frame.f_code.co_name}"
            if inner is not None and PYSPARK in inner.f_code.co_filename:
                return f"{ours} > {inner.f_code.co_qualname}"
            return ours
        inner = frame
        frame = frame.f_back
    return f"(no frame of ours) {inner.f_code.co_qualname if inner else '?'}"


def _short(path: str) -> str:
    for part in OURS:
        if part in path:
            return part.strip("/") + "/" + path.split(part, 1)[1]
    return path


class Py4JCalls:
    """While installed (a context manager), counts every py4j command the driver sends."""

    def __init__(self) -> None:
        self.total = 0
        self.sites: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.threads: Counter[str] = Counter()
        self.at_batch: list[tuple[int, Counter[str]]] = []  # (total, sites) at each batch end
        self._lock = threading.Lock()
        self._original: Any = None

    def __enter__(self) -> Py4JCalls:
        original = self._original = GatewayClient.send_command
        counter = self

        def send_command(client: GatewayClient, command: str, *args: Any, **kwargs: Any) -> Any:
            counter.count(command, sys._getframe(1))
            return original(client, command, *args, **kwargs)

        GatewayClient.send_command = send_command  # type: ignore[method-assign]
        return self

    def __exit__(self, *_exc: object) -> None:
        GatewayClient.send_command = self._original  # type: ignore[method-assign]

    def count(self, command: str, frame: FrameType) -> None:
        site = call_site(frame)
        with self._lock:
            self.total += 1
            self.sites[site] += 1
            self.kinds[KINDS.get(command[:1], command[:1])] += 1
            self.threads[threading.current_thread().name] += 1

    def batch_completed(self, _batch: Any) -> None:
        """A batch's end (System.on_batch): the counts so far, to split them per batch."""
        with self._lock:
            self.at_batch.append((self.total, Counter(self.sites)))

    def report(self, skip: int, top: int = 25) -> None:
        """Per batch after the first `skip` (the window filling): the median count, then each
        call site's mean per batch over those batches."""
        if len(self.at_batch) < skip + 2:
            print("py4j: too few batches counted")
            return
        totals = [total for total, _sites in self.at_batch[skip:]]
        per_batch = [b - a for a, b in zip(totals, totals[1:], strict=False)]
        first, last = self.at_batch[skip][1], self.at_batch[-1][1]
        batches = len(per_batch)
        print(
            f"py4j round trips per batch, median of the last {batches}: "
            f"{statistics.median(per_batch):g} (min {min(per_batch)}, max {max(per_batch)}); "
            f"whole run by kind {dict(self.kinds)}, by thread {dict(self.threads)}"
        )
        for site, n in (last - first).most_common(top):
            print(f"  {n / batches:7.2f}  {site}")
