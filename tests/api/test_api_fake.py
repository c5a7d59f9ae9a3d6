"""The HTTP contract of the driver API, against a deterministic fake job."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from dstream_api.app import app_for
from dstream_api.auth import TOKEN_ENV, TOKEN_FILE_ENV
from fakejob import BATCH_MS, JOB, ZERO_MS, FakeJob
from fastapi.testclient import TestClient

# The operator copies these into the StreamingJob status: renaming one breaks it.
STATUS_FIELDS = {
    "job",
    "state",
    "epoch",
    "batchIntervalSeconds",
    "lastBatch",
    "rateLimit",
    "pendingBatches",
    "backlog",
    "recoveries",
}
LAST_BATCH_FIELDS = {
    "time",
    "processingSeconds",
    "schedulingDelaySeconds",
    "totalDelaySeconds",
    "records",
}


@pytest.fixture(autouse=True)
def no_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)


@pytest.fixture
def job() -> FakeJob:
    return FakeJob(batches=5)


@pytest.fixture
def client(job) -> TestClient:
    return TestClient(app_for(job))


def batch_seconds(n: int) -> float:
    return (ZERO_MS + n * BATCH_MS) / 1000


def test_healthz(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_is_503_until_a_batch_completed():
    waiting = TestClient(app_for(FakeJob(batches=0)))
    response = waiting.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"ready": False, "reason": "no batch has completed yet"}
    assert TestClient(app_for(FakeJob(batches=1))).get("/readyz").status_code == 200


def test_status_has_the_fields_the_operator_reads(client):
    status = client.get("/v1/status").json()
    assert set(status) == STATUS_FIELDS
    assert set(status["lastBatch"]) == LAST_BATCH_FIELDS
    assert status["job"] == JOB
    assert status["state"] == "running"
    assert status["batchIntervalSeconds"] == 1.0
    assert status["rateLimit"] == {"rate": 5000.0}
    assert status["backlog"] == {"rate": 1234}
    assert status["recoveries"]["driver_restart"] == 0
    last = status["lastBatch"]
    assert datetime.fromisoformat(last["time"]) == datetime.fromtimestamp(batch_seconds(5), UTC)
    assert last["records"] == 500
    assert last["schedulingDelaySeconds"] == pytest.approx(0.05)
    assert last["processingSeconds"] == pytest.approx(0.2)
    assert last["totalDelaySeconds"] == pytest.approx(0.25)


def test_status_before_the_first_batch_has_no_last_batch():
    status = TestClient(app_for(FakeJob(batches=0))).get("/v1/status").json()
    assert status["lastBatch"] is None


def test_batches_newest_first_and_limited(client):
    batches = client.get("/v1/batches", params={"limit": 2}).json()["batches"]
    assert [b["records"] for b in batches] == [500, 400]
    first = batches[0]
    assert first["kind"] == "live"
    assert first["recordsBySource"] == {"rate": 500}
    assert first["checkpointSeconds"] == pytest.approx(0.004)
    assert first["error"] is None
    assert (first["latencyP50Seconds"], first["latencyP99Seconds"]) == (0.65, 0.65)
    assert batches[1]["latencyP50Seconds"] == 0.65
    assert len(client.get("/v1/batches").json()["batches"]) == 5


@pytest.mark.parametrize("limit", ["0", "-1", "1001", "many"])
def test_batches_rejects_a_bad_limit_with_the_reason(client, limit):
    response = client.get("/v1/batches", params={"limit": limit})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "limit"]


def test_streams_lists_retained_batches(client):
    streams = {s["name"]: s for s in client.get("/v1/streams").json()["streams"]}
    assert streams["counts"]["retainedBatches"] == 5
    assert datetime.fromisoformat(streams["counts"]["newest"]).timestamp() == batch_seconds(5)


def test_slice_top_k_sums_values_over_the_range(client):
    result = client.get(
        "/v1/streams/counts/slice",
        params={"from": batch_seconds(2), "to": batch_seconds(3), "top": 2},
    ).json()
    assert result["top"] == [{"key": "b", "value": 10.0}, {"key": "a", "value": 5.0}]
    assert len(result["batchTimes"]) == 2
    assert result["count"] is None and result["sample"] is None


def test_slice_accepts_iso_times(client):
    start = datetime.fromtimestamp(batch_seconds(4), UTC).isoformat()
    result = client.get("/v1/streams/counts/slice", params={"from": start, "top": 1}).json()
    assert result["top"] == [{"key": "b", "value": 18.0}]


def test_slice_latest_uses_only_the_newest_batch(client):
    result = client.get("/v1/streams/counts/slice", params={"combine": "latest", "top": 1}).json()
    assert result["top"] == [{"key": "b", "value": 10.0}]
    assert len(result["batchTimes"]) == 1


def test_slice_without_top_counts_and_samples(client):
    result = client.get("/v1/streams/lines/slice", params={"limit": 2}).json()
    assert result["count"] == 15
    assert result["sample"] == ["line 1.0", "line 1.1"]
    assert result["top"] is None


def test_slice_keys_that_are_not_json_become_lists(client):
    result = client.get("/v1/streams/counts/slice", params={"combine": "latest", "limit": 3}).json()
    assert result["sample"][2] == [["t", 5], 1]


def test_slice_of_an_empty_range_is_empty(client):
    result = client.get("/v1/streams/counts/slice", params={"from": 1, "to": 2, "top": 3}).json()
    assert result["top"] == [] and result["batchTimes"] == []


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "nan"}, "to"),
        ({"from": 20, "to": 10}, "from"),
        ({"top": 0}, "top"),
        ({"combine": "max"}, "combine"),
        ({"limit": 5000}, "limit"),
    ],
)
def test_slice_rejects_bad_parameters_with_the_reason(client, params, parameter):
    response = client.get("/v1/streams/counts/slice", params=params)
    assert response.status_code == 422
    error = response.json()["detail"][0]
    assert error["loc"][:2] == ["query", parameter]
    assert error["msg"]


def test_slice_top_needs_numeric_pairs(client):
    response = client.get("/v1/streams/lines/slice", params={"top": 3})
    assert response.status_code == 422
    assert "(key, number)" in response.json()["detail"][0]["msg"]


def test_slice_of_an_unknown_stream_is_404(client):
    response = client.get("/v1/streams/nope/slice")
    assert response.status_code == 404
    assert response.json() == {"detail": "no stream named 'nope'"}


def test_slice_that_spark_cannot_run_is_503(client):
    response = client.get("/v1/streams/broken/slice")
    assert response.status_code == 503
    assert "SparkContext was shut down" in response.json()["detail"]


def test_stop_without_a_configured_token_is_open(client, job):
    response = client.post("/v1/stop")
    assert response.status_code == 202
    assert response.json() == {"stopping": True, "state": "stopping"}
    assert job.stop_requested
    assert client.get("/readyz").status_code == 200  # the fake's readiness ignores stop


def test_stop_needs_the_token_from_the_environment(client, job, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    missing = client.post("/v1/stop")
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = client.post("/v1/stop", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert not job.stop_requested
    right = client.post("/v1/stop", headers={"Authorization": "Bearer s3cret"})
    assert right.status_code == 202
    assert job.stop_requested


def test_stop_reads_a_mounted_secret_file_on_each_request(client, job, monkeypatch, tmp_path):
    secret = tmp_path / "token"
    secret.write_text("first\n")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(secret))
    assert client.post("/v1/stop", headers={"Authorization": "Bearer first"}).status_code == 202
    secret.write_text("rotated\n")
    assert client.post("/v1/stop", headers={"Authorization": "Bearer first"}).status_code == 401
    assert client.post("/v1/stop", headers={"Authorization": "Bearer rotated"}).status_code == 202


def test_stop_refuses_when_the_secret_file_is_unreadable(client, job, monkeypatch, tmp_path):
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    response = client.post("/v1/stop", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 503
    assert TOKEN_FILE_ENV in response.json()["detail"]
    assert not job.stop_requested


def test_stop_is_post_only(client):
    assert client.get("/v1/stop").status_code == 405


def test_metrics_in_text_and_openmetrics_formats(client):
    text = client.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    assert f'dstream_batches_completed_total{{job="{JOB}"}} 5.0' in text.text
    openmetrics = client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.endswith("# EOF\n")


def test_openapi_documents_every_endpoint_and_error(client):
    document = client.get("/openapi.json").json()
    paths = document["paths"]
    assert set(paths) == {
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/status",
        "/v1/batches",
        "/v1/streams",
        "/v1/streams/{name}/slice",
        "/v1/stop",
    }
    assert set(paths["/v1/streams/{name}/slice"]["get"]["responses"]) == {
        "200",
        "404",
        "422",
        "503",
    }
    assert set(paths["/v1/stop"]["post"]["responses"]) == {"202", "401", "503"}
    assert paths["/v1/stop"]["post"]["security"] == [{"HTTPBearer": []}]
    status_schema = document["components"]["schemas"]["Status"]
    assert set(status_schema["properties"]) == STATUS_FIELDS
