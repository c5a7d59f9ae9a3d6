"""A heavy interactive query must not starve the stream it reads (`dstream/runtime/scheduling/pools.py`).

A real driver (`dstream run`, local[2], FAIR scheduling as it always runs) greps a rate source;
its query stream `matches` is not cached, so counting its retained batches recomputes every one
of them from the source: a query many times the work of one batch, on at most half the task
slots. Batches must go on starting and completing while it runs: a query that held every slot
(FIFO, or all the slots) would let none through. How long those batches take beside such a
query is measured by `python -m bench.throughput query-pool`, on a quiet machine, not here.
"""

from __future__ import annotations

import time

import pytest
from running_driver import running_driver

from bench.throughput.query_pool import span

pytestmark = pytest.mark.slow

BATCH_S = 1.0
RETAINED = 30  # batches the query recomputes (the grep app retains 60 s)
RATE = 100_000


def test_batches_go_on_completing_while_a_heavy_query_runs(tmp_path):
    spec = {
        "batchInterval": f"{BATCH_S:.0f}s",
        "app": {"builtin": "grep", "args": {"pattern": "a"}},
        "source": {"type": "rate", "rate": {"recordsPerSecond": RATE, "partitions": 2}},
        "sink": {"type": "console", "console": {"num": 1}},
        "backpressure": {"enabled": True, "initialRate": RATE},
    }
    with running_driver(tmp_path, "querypool", spec) as driver:
        driver.wait_for_batches(RETAINED, timeout_s=300)
        asked = time.time()
        result = driver.get("/v1/streams/matches/slice", params={"limit": 1})
        answered = time.time()
        assert result.status_code == 200, result.text
        assert len(result.json()["batchTimes"]) >= RETAINED - 5
        driver.wait_for(
            "a batch after the query",
            lambda: (
                span(driver.get("/v1/batches", params={"limit": 1}).json()["batches"][0])[0]
                > answered
            ),
            60,
        )
        batches = driver.get("/v1/batches", params={"limit": 1000}).json()["batches"]

    inside = [b for b in batches if asked < span(b)[0] and span(b)[1] < answered]
    timeline = "\n".join(
        f"  {b['time']} processing {b['processingSeconds']:.2f} s "
        f"delay {b['schedulingDelaySeconds']:.2f} s records {b['records']}"
        for b in sorted(batches, key=lambda b: b["time"])[-10:]
    )
    assert inside, (
        f"no batch started and completed in the {answered - asked:.1f} s query:\n{timeline}"
    )
