"""The API served by a real driver (`dstream run`, local[2], a small rate job) on every interface,
as in a pod: allowed because it has a token."""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest
from running_driver import running_driver

pytestmark = pytest.mark.slow

TOKEN = "driver-test-token"
METRICS = [
    "dstream_batches_completed_total",
    "dstream_batch_processing_seconds_bucket",
    "dstream_last_batch_processing_seconds",
    "dstream_last_batch_scheduling_delay_seconds",
    "dstream_last_batch_total_delay_seconds",
    "dstream_input_records_total",
    "dstream_rate_limit_records_per_second",
    "dstream_backlog_records",
    "dstream_pending_batches",
    "dstream_checkpoint_seconds_count",
    "dstream_recoveries_total",
    "dstream_failed_batches_total",
    "dstream_end_to_end_latency_seconds_bucket",
]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("api-driver")
    spec = {
        "batchInterval": "1s",
        "app": {"builtin": "wordcount"},
        "source": {"type": "rate", "rate": {"recordsPerSecond": 2000, "partitions": 2}},
        "sink": {"type": "console", "console": {"num": 1}},
        "checkpoint": {"path": str(tmp_path / "checkpoint")},
        "backpressure": {"enabled": True, "initialRate": 1000},
    }
    with running_driver(
        tmp_path, "apitest", spec, env={"DSTREAM_API_TOKEN": TOKEN}, args=("--host", "0.0.0.0")
    ) as running:
        running.wait_for_batches(4)
        yield running


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_cli_prints_the_url_it_serves(driver):
    assert f"serving http://0.0.0.0:{driver.port}" in driver.output()


def test_with_a_token_it_listens_beyond_127_0_0_1(driver):
    """127.0.0.2 is loopback too, but only a socket bound to all interfaces answers there."""
    response = httpx.get(f"http://127.0.0.2:{driver.port}/healthz", timeout=30)
    assert response.status_code == 200


def test_probes(driver):
    assert driver.get("/healthz").json() == {"status": "ok"}
    assert driver.get("/readyz").json()["ready"] is True


def test_status_reports_the_running_job(driver):
    status = driver.get("/v1/status").json()
    assert status["job"] == "apitest"
    assert status["state"] == "running"
    assert status["epoch"] == 1  # the first driver of its checkpoint
    assert status["batchIntervalSeconds"] == 1.0
    assert status["lastBatch"]["records"] > 0
    assert status["lastBatch"]["processingSeconds"] > 0
    assert status["rateLimit"]["rate"] > 0
    assert isinstance(status["backlog"]["rate"], int)
    assert isinstance(status["pendingBatches"], int)
    assert status["recoveries"] == {
        "driver_restart": 0,
        "replayed_batches": 0,
        "restored_state": 0,
        "torn_files": 0,
    }


def test_batches_are_newest_first_with_checkpoint_timing(driver):
    batches = driver.get("/v1/batches", params={"limit": 3}).json()["batches"]
    assert len(batches) == 3
    times = [epoch(b["time"]) for b in batches]
    assert times == sorted(times, reverse=True)
    assert all(b["checkpointSeconds"] > 0 and b["error"] is None for b in batches)
    # a rate source's records are all available by the batch time, so each waited at least
    # from there to the commit
    assert all(
        b["totalDelaySeconds"] <= b["latencyP50Seconds"] <= b["latencyP99Seconds"] for b in batches
    )


def test_streams_lists_the_registered_counts(driver):
    streams = {s["name"]: s for s in driver.get("/v1/streams").json()["streams"]}
    assert streams["counts"]["retainedBatches"] >= 1


def test_slice_top_k_over_the_retained_batches(driver):
    newest = epoch(driver.get("/v1/streams").json()["streams"][0]["newest"])
    latest = driver.get(
        "/v1/streams/counts/slice", params={"from": newest, "to": newest, "top": 3}
    ).json()
    assert [epoch(t) for t in latest["batchTimes"]] == [newest]
    values = [entry["value"] for entry in latest["top"]]
    assert len(values) == 3 and values == sorted(values, reverse=True)
    summed = driver.get("/v1/streams/counts/slice", params={"to": newest, "top": 1}).json()
    assert summed["top"][0]["value"] >= values[0]


def test_slice_without_top_samples_records(driver):
    result = driver.get("/v1/streams/counts/slice", params={"combine": "latest", "limit": 2}).json()
    assert result["count"] > 0
    assert all(isinstance(word, str) and count > 0 for word, count in result["sample"])


def test_slice_errors(driver):
    assert driver.get("/v1/streams/nope/slice").status_code == 404
    assert driver.get("/v1/streams/counts/slice", params={"from": "soon"}).status_code == 422


def test_metrics_exposes_every_family_with_the_job_label(driver):
    text = driver.get("/metrics").text
    for name in METRICS:
        assert f'{name}{{job="apitest"' in text, name


def test_stop_needs_the_token_then_stops_gracefully(driver):
    assert driver.post("/v1/stop").status_code == 401
    response = driver.post("/v1/stop", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 202
    assert driver.wait() == 0
    assert "job apitest stopped" in driver.output()
