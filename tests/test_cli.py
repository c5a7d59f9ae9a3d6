"""The dstream command on good and bad manifests, run as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent


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
