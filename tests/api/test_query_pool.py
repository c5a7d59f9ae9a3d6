"""A heavy interactive query must not starve the stream it reads (`dstream/runtime/scheduling/pools.py`).

A real driver (`dstream run`, local[2], FAIR scheduling as it always runs) greps a rate source;
its query stream `matches` is not cached, so counting its retained batches recomputes every one
of them from the source: a query many times the work of one batch. The batches that run while
it does must still finish within two intervals each.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from running_driver import running_driver

pytestmark = [pytest.mark.slow, pytest.mark.solo]

BATCH_S = 1.0
RETAINED = 45  # batches the query recomputes (the grep app retains 60 s)


def span(batch: dict) -> tuple[float, float]:
    """When a batch ran (wall clock, seconds)."""
    start = datetime.fromisoformat(batch["time"]).timestamp() + batch["schedulingDelaySeconds"]
    return start, start + batch["processingSeconds"]


def test_a_heavy_query_leaves_batch_processing_within_two_intervals(tmp_path):
    spec = {
        "batchInterval": f"{BATCH_S:.0f}s",
        "app": {"builtin": "grep", "args": {"pattern": "a"}},
        "source": {"type": "rate", "rate": {"recordsPerSecond": 150_000, "partitions": 2}},
        "sink": {"type": "console", "console": {"num": 1}},
        "backpressure": {"enabled": True, "initialRate": 150_000},
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

    took = answered - asked
    during = [b for b in batches if span(b)[1] > asked and span(b)[0] < answered]
    timeline = "\n".join(
        f"  {b['time']} processing {b['processingSeconds']:.2f} s "
        f"delay {b['schedulingDelaySeconds']:.2f} s records {b['records']}"
        for b in sorted(batches, key=lambda b: b["time"])[-len(during) - 3 :]
    )
    assert took >= 3 * BATCH_S, f"the query took only {took:.1f} s: not heavy enough to tell"
    assert during, "no batch ran during the query"
    slow = [b for b in during if b["processingSeconds"] > 2 * BATCH_S]
    assert not slow, f"query {took:.1f} s; batches during it:\n{timeline}"
