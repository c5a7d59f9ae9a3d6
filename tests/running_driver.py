"""A real driver: `dstream run JOB.yaml` in its own process (and process group), serving its API
on a free loopback port; always stopped by its PID, the Spark JVM with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

# Quiet, private and port-free Spark for drivers started by tests.
TEST_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.default.parallelism": "2",
}
STOP_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    spec = {**spec, "sparkConf": {**TEST_SPARK_CONF, **spec.get("sparkConf", {})}}
    return {
        "apiVersion": "dstream.dev/v1alpha1",
        "kind": "StreamingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def run_until_exit(path: Path, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """`dstream run` of a job that ends by itself (one that cannot start), its output kept."""
    return subprocess.run(
        [sys.executable, "-m", "dstream", "run", str(path), "--port", "0", "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "DSTREAM_SPARK_LOG_LEVEL": "ERROR"},
    )


@dataclass
class Driver:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **kwargs)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, what: str, condition: Any, timeout_s: float) -> Any:
        """Poll `condition()` until it returns something truthy; fail with the driver's log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"driver exited ({self.process.returncode}) before {what}:\n"
                    + self.output()[-5000:]
                )
            try:
                result = condition()
            except httpx.TransportError:
                result = None
            if result:
                return result
            time.sleep(0.5)
        raise AssertionError(
            f"timed out after {timeout_s} s waiting for {what}:\n" + self.output()[-5000:]
        )

    def wait_for_batches(self, count: int, timeout_s: float = 180) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            batches = self.get("/v1/batches", params={"limit": 1000}).json()["batches"]
            return batches if len(batches) >= count else None

        return self.wait_for(f"{count} batches", enough, timeout_s)

    def wait_for_exit(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        return self.process.wait(timeout_s)


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the driver stops gracefully), then SIGKILL whatever is left of its group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the group is the driver's own: its JVM, workers
    except ProcessLookupError:
        pass
    process.wait()


@contextmanager
def running_driver(
    tmp_path: Path,
    name: str,
    spec: dict[str, Any],
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> Iterator[Driver]:
    """Start `dstream run` on the manifest built from `spec` (more CLI `args` if given); stop it
    whatever happens."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest(name, spec)))
    port = free_port()
    log = tmp_path / f"{name}.log"
    environment = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        **(env or {}),
    }
    command = [sys.executable, "-m", "dstream.cli", "run", str(path), "--port", str(port), *args]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=environment,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield Driver(process, port, log)
    finally:
        stop_process_group(process)
