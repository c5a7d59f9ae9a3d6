"""The dstream command on good and bad manifests, run as a real process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from servers import free_port

ROOT = Path(__file__).parents[2]


def dstream(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run(
        [sys.executable, "-m", "dstream", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def job_file(tmp_path: Path, **spec_changes) -> Path:
    document = yaml.safe_load((ROOT / "examples" / "wordcount.yaml").read_text())
    document["spec"].update(spec_changes)
    document["spec"]["checkpoint"] = {"path": str(tmp_path / "checkpoint")}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_validate_accepts_every_example():
    for manifest in sorted((ROOT / "examples").glob("*.yaml")):
        done = dstream("validate", str(manifest))
        assert done.returncode == 0, done.stderr
        assert "valid StreamingJob" in done.stdout


def test_bad_manifest_exits_2_naming_the_field_without_traceback(tmp_path):
    path = job_file(tmp_path, batchInterval="fast")
    for command in ("validate", "run"):
        done = dstream(command, str(path))
        assert done.returncode == 2
        assert "spec.batchInterval: String should match pattern" in done.stderr
        assert "Traceback" not in done.stderr


def test_missing_manifest_exits_2(tmp_path):
    done = dstream("validate", str(tmp_path / "nope.yaml"))
    assert done.returncode == 2 and "cannot read" in done.stderr


@pytest.mark.slow
def test_run_shows_batches_and_stops_gracefully_on_sigterm(tmp_path):
    path = job_file(tmp_path, source={"type": "rate", "rate": {"recordsPerSecond": 2000}})
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dstream", "run", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    lines = []
    deadline = time.monotonic() + 180
    try:
        for line in process.stdout:
            lines.append(line)
            if sum(1 for seen in lines if seen.startswith("batch ")) >= 2:
                break
            assert time.monotonic() < deadline, "no batches within 180 s"
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    output = "".join(lines) + rest
    assert process.returncode == 0, output[-3000:]
    assert "SIGTERM received, finishing the current batch" in output
    assert "records | processing" in output and "rate limit" in output
    commits = list((tmp_path / "checkpoint" / "log").glob("commit-*.json"))
    assert commits, "a graceful stop leaves committed batches"


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "example.org"])
def test_run_refuses_an_api_beyond_loopback_without_a_token(tmp_path, host):
    """Refused before Spark starts, naming both ways out."""
    done = dstream("run", str(job_file(tmp_path)), "--host", host, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"refusing to serve the API on {host} without a token" in done.stderr
    assert "DSTREAM_API_TOKEN" in done.stderr and "--host at 127.0.0.1" in done.stderr
    assert not (tmp_path / "checkpoint").exists()


def test_run_refuses_a_token_file_it_cannot_read(tmp_path, monkeypatch):
    monkeypatch.setenv("DSTREAM_API_TOKEN_FILE", str(tmp_path / "missing-token"))
    done = dstream("run", str(job_file(tmp_path)), "--host", "0.0.0.0", timeout=60)
    assert done.returncode == 2
    assert "refusing to serve the API on 0.0.0.0: cannot read DSTREAM_API_TOKEN_FILE" in done.stderr


def _refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=5)
    except httpx.ConnectError:
        return True
    return False


@pytest.mark.slow
def test_run_serves_loopback_only_and_a_clean_stop_warns_about_nothing(tmp_path):
    """The defaults: the API on 127.0.0.1 only (127.0.0.2 is loopback too, but a socket bound to
    127.0.0.1 does not answer there). A run that ends at its --duration prints no WARN or ERROR
    line, ours or Spark's, once it has started (Spark's start-up notes come before)."""
    path = job_file(tmp_path, source={"type": "rate", "rate": {"recordsPerSecond": 1000}})
    port = free_port()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dstream", "run", str(path), "--port", str(port)]
        + ["--duration", "6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    serving = f"serving http://127.0.0.1:{port}"
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if serving in line:
                break
        assert lines and serving in lines[-1], "".join(lines)[-3000:]
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
        assert _refused(f"http://127.0.0.2:{port}/healthz")
        rest, _ = process.communicate(timeout=180)
    finally:
        process.kill()
    output = "".join(lines) + rest
    assert process.returncode == 0, output[-3000:]
    assert "dstream: job wordcount stopped" in rest
    complaints = [
        line for line in rest.splitlines() if re.search(r"\b(WARN|WARNING|ERROR)\b", line)
    ]
    assert not complaints, output[-5000:]
    assert "Traceback" not in output
