"""The Dockerfile lints clean and its entrypoint starts Spark executors as Spark expects."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "operator" / "image" / "entrypoint.sh"
HADOLINT = Path(sys.executable).parent / "hadolint"


def test_dockerfile_has_no_lint_errors():
    result = subprocess.run(
        [str(HADOLINT), "--failure-threshold", "error", "Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_copies_every_package_root_and_runs_non_root():
    text = (ROOT / "Dockerfile").read_text()
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"][
        "find"
    ]["where"]
    for root in roots:
        assert f"COPY {root} /src/{root}" in text
    assert "\nUSER 185\n" in text
    assert "openjdk-17-jre-headless" in text and "python3-venv" in text
    assert text.index("COPY pyproject.toml") < text.index("COPY driver")  # deps layer first
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def fake_java(tmp_path: Path) -> Path:
    """A JAVA_HOME whose java prints its arguments, one per line."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return tmp_path / "jdk"


def test_entrypoint_starts_the_kubernetes_executor_backend(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "JAVA_HOME": str(fake_java(tmp_path)),
        "SPARK_HOME": "/opt/spark",
        "SPARK_EXECUTOR_MEMORY": "1g",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@wc-driver.jobs.svc:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "2",
        "SPARK_APPLICATION_ID": "spark-app-1",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.7",
        "SPARK_RESOURCE_PROFILE_ID": "0",
        "SPARK_EXECUTOR_POD_NAME": "wc-exec-3",
        "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078",
        "SPARK_JAVA_OPT_1": "-Dspark.executor.id=3",
    }
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "executor"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    args = result.stdout.splitlines()
    assert args[:4] == ["-Dspark.driver.port=7078", "-Dspark.executor.id=3", "-Xms1g", "-Xmx1g"]
    assert args[4:6] == ["-cp", f"/opt/spark/jars/*:{tmp_path}"]
    assert args[6] == "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
    flags = dict(zip(args[7::2], args[8::2], strict=True))
    assert flags == {
        "--driver-url": env["SPARK_DRIVER_URL"],
        "--executor-id": "3",
        "--cores": "2",
        "--app-id": "spark-app-1",
        "--hostname": "10.0.0.7",
        "--resourceProfileId": "0",
        "--podName": "wc-exec-3",
    }


def test_entrypoint_passes_other_commands_through(tmp_path):
    env = {"PATH": os.environ["PATH"], "JAVA_HOME": str(fake_java(tmp_path)), "SPARK_HOME": "/s"}
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "echo", "dstream-operator", "--all-namespaces"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == "dstream-operator --all-namespaces\n"
