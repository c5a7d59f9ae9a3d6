"""The Grafana dashboard, checked for real: a driver serves /metrics on loopback, a real Prometheus
scrapes it every second, and every query of every panel must return data for the job."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conditions import eventually
from debian_packages import require_binary
from running_driver import running_driver, stop_process_group
from servers import free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "helm/dstream/dashboards/dstream.json"
JOB = "dashjob"
# What Grafana would substitute; the ranges only need to span a few 1 s scrapes.
GRAFANA_VARIABLES = {"$job": JOB, "$__rate_interval": "15s", "$__range": "5m"}
QUERY_TIMEOUT_S = 150


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel."""
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def substituted(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def test_dashboard_structure():
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (
        variables["job"]["query"]["query"] == "label_values(dstream_batches_completed_total, job)"
    )
    assert variables["datasource"]["type"] == "datasource"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in board["panels"] if p["type"] != "row"]
    assert all(p.get("targets") for p in graphs)
    for title, expr in queries(board):
        assert 'job=~"$job"' in expr, f"{title}: not filtered by the job variable: {expr}"
        assert not re.search(r"\$(?!job\b|__rate_interval\b|__range\b)\w+", expr), expr
    covered = " ".join(expr for _title, expr in queries(board))
    for family in [
        "dstream_input_records_total",
        "dstream_batch_processing_seconds_bucket",
        "dstream_last_batch_scheduling_delay_seconds",
        "dstream_rate_limit_records_per_second",
        "dstream_pid_error",
        "dstream_pid_historical_error",
        "dstream_pid_derivative_error",
        "dstream_backlog_records",
        "dstream_state_keys",
        "dstream_failed_batches_total",
        "dstream_recoveries_total",
    ]:
        assert family in covered, f"no panel shows {family}"


@pytest.fixture
def prometheus_binary() -> str:
    return require_binary("prometheus", "prometheus")


def prometheus_config(target_port: int) -> str:
    """Scrape every second; honor_labels keeps the driver's own `job` label (as a PodMonitor
    with honorLabels: true does) instead of renaming it exported_job."""
    return (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: dstream-drivers\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n"
    )


def start_prometheus(binary: str, tmp_path: Path, target_port: int) -> tuple[Any, str]:
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config(target_port))
    port = free_port()
    with (tmp_path / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, f"http://127.0.0.1:{port}"


def is_ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def instant_query(url: str, expr: str) -> list[Any]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body.get('error')}"
    return body["data"]["result"]


def empty_queries(url: str, pending: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(title, expr) for title, expr in pending if not instant_query(url, expr)]


@pytest.mark.slow
def test_every_panel_query_returns_data_from_a_real_prometheus(tmp_path, prometheus_binary):
    spec = {
        "batchInterval": "1s",
        "app": {"builtin": "wordcount", "args": {"window": "5s", "slide": "1s"}},
        "source": {"type": "rate", "rate": {"recordsPerSecond": 2000, "partitions": 2}},
        "sink": {"type": "console", "console": {"num": 1}},
        "checkpoint": {"path": str(tmp_path / "checkpoint")},
        "backpressure": {"enabled": True, "initialRate": 1000},
        "sparkConf": {"dstream.metrics.stateKeysIntervalSeconds": "1"},
    }
    with running_driver(tmp_path, JOB, spec) as driver:
        driver.wait_for("readiness", lambda: driver.get("/readyz").status_code == 200, 240)
        prometheus, url = start_prometheus(prometheus_binary, tmp_path, driver.port)
        pending = [(title, substituted(expr)) for title, expr in queries(dashboard())]

        def every_panel_has_data() -> bool:
            nonlocal pending
            assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()
            if is_ready(url):
                pending = empty_queries(url, pending)
            return not pending

        try:
            eventually(
                every_panel_has_data,
                QUERY_TIMEOUT_S,
                interval=2,
                message=lambda: (
                    "data in every panel; without:\n" + "\n".join(f"  {t}: {e}" for t, e in pending)
                ),
            )
            jobs = httpx.get(
                f"{url}/api/v1/label/job/values",
                params={"match[]": "dstream_batches_completed_total"},
                timeout=10,
            ).json()["data"]
        finally:
            stop_process_group(prometheus)
    assert JOB in jobs
