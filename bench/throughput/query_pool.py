"""A heavy interactive query beside the stream it reads: how long the stream's batches take
while the query runs (dstream/runtime/scheduling/pools.py, job_view.query_partitions).

A real driver (`dstream run`, local[2], FAIR scheduling as it always runs) greps a rate source
in 1 s batches. Once RETAINED batches are retained, the REST API counts the query stream
`matches`, which is not cached, so the query recomputes every one of them from the source: many
times the work of one batch, on at most half the task slots. Prints the query's time and every
batch that ran during it; the pools' aim is met if each of those took at most two intervals
(exit status 1 if one took longer). On a quiet machine: the test suite checks only that batches
go on completing during such a query (tests/api/test_query_pool.py), not how long they take.

    python -m bench.throughput query-pool [--rate 150000] [--retained 45]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

BATCH_S = 1.0
LIMIT_INTERVALS = 2
START_TIMEOUT_S = 300


def job(rate: int) -> dict[str, Any]:
    """The StreamingJob: the built-in grep (its query stream `matches`, retained 60 s) on a
    rate source, with backpressure starting at the offered rate."""
    return {
        "apiVersion": "dstream.dev/v1alpha1",
        "kind": "StreamingJob",
        "metadata": {"name": "querypool"},
        "spec": {
            "batchInterval": f"{BATCH_S:.0f}s",
            "app": {"builtin": "grep", "args": {"pattern": "a"}},
            "source": {"type": "rate", "rate": {"recordsPerSecond": rate, "partitions": 2}},
            "sink": {"type": "console", "console": {"num": 1}},
            "backpressure": {"enabled": True, "initialRate": rate},
            "sparkConf": {"spark.default.parallelism": "2", "spark.ui.enabled": "false"},
        },
    }


def span(batch: dict[str, Any]) -> tuple[float, float]:
    """When a batch of /v1/batches ran (wall clock, seconds)."""
    start = datetime.fromisoformat(batch["time"]).timestamp() + batch["schedulingDelaySeconds"]
    return start, start + batch["processingSeconds"]


def ran_during(batches: list[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    """The batches whose processing overlapped [start, end], in time order."""
    during = [b for b in batches if span(b)[1] > start and span(b)[0] < end]
    return sorted(during, key=lambda b: b["time"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(what: str, condition: Any, timeout_s: float) -> Any:
    """The first true value of `condition()`; an API not up yet counts as false."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if value := condition():
                return value
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"no {what} within {timeout_s:.0f} s")


def measure(url: str, retained: int) -> tuple[float, list[dict[str, Any]]]:
    """The query's seconds and the batches that ran during it."""

    def batches() -> list[dict[str, Any]]:
        found = httpx.get(f"{url}/v1/batches", params={"limit": 1000}, timeout=60)
        return found.json()["batches"]

    wait_for(f"{retained} batches", lambda: len(batches()) >= retained, START_TIMEOUT_S)
    asked = time.time()
    result = httpx.get(f"{url}/v1/streams/matches/slice", params={"limit": 1}, timeout=600)
    answered = time.time()
    result.raise_for_status()
    wait_for("a batch after the query", lambda: span(batches()[0])[0] > answered, 60)
    return answered - asked, ran_during(batches(), asked, answered)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=150_000, help="lines per second")
    parser.add_argument("--retained", type=int, default=45, help="batches the query recomputes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="query-pool-") as root:
        manifest = Path(root) / "job.yaml"
        manifest.write_text(yaml.safe_dump(job(args.rate)))
        port = free_port()
        with open(Path(root) / "driver.log", "w") as log:
            driver = subprocess.Popen(
                [sys.executable, "-m", "dstream", "run", str(manifest), "--port", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
                start_new_session=True,
            )
        try:
            took, during = measure(f"http://127.0.0.1:{port}", args.retained)
        finally:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    print(f"query over {args.retained} batches of {args.rate:,} lines/s: {took:.1f} s")
    for batch in during:
        print(
            f"  {batch['time']}  processing {batch['processingSeconds']:.2f} s  "
            f"delay {batch['schedulingDelaySeconds']:.2f} s  records {batch['records']:,}"
        )
    problem = verdict(took, during)
    print(
        problem
        or f"{len(during)} batches during the query, each within {LIMIT_INTERVALS} intervals"
    )
    return 1 if problem else 0


def verdict(took: float, during: list[dict[str, Any]]) -> str | None:
    """What keeps the run from meeting the aim, or None: a query too light to tell (under
    three intervals), no batch during it, or one that took more than LIMIT_INTERVALS."""
    if took < 3 * BATCH_S:
        return f"the query took only {took:.1f} s: not heavy enough to tell"
    if not during:
        return "no batch ran during the query"
    slowest = max(b["processingSeconds"] for b in during)
    if slowest > LIMIT_INTERVALS * BATCH_S:
        return f"a batch during the query took {slowest:.2f} s: over {LIMIT_INTERVALS} intervals"
    return None
