"""A real driver for tests: `dstream run JOB.yaml` in its own process group (the Python driver,
its Spark JVM and the Python workers), so that a test can SIGKILL all of it at once, like a lost
pod, or only the Python process, and never leaves a JVM behind. Its output lines are kept with
the time they arrived; given a port, it serves its HTTP API there. Every driver a test starts
runs with the one test Spark configuration, SPARK_TEST_CONF (its short-lived JVMs with the quick
JIT compiler only).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from conditions import eventually
from servers import free_port

# The test apps' modules (faultapp), importable by every driver and its Python workers.
TEST_APPS_DIR = Path(__file__).resolve().parent / "fault"
# The JVMs of test drivers (and of their local-cluster executors) live seconds to a minute and
# are killed and started again and again: the optimizing JIT compiler's work at start never pays
# back, so they run the quick one only, which takes a third off a run's CPU (local-cluster: 46 s
# to 30 s for two short runs). Recovery times the tests print are of such JVMs.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
QUICK_JIT_CONF = {
    "spark.driver.extraJavaOptions": QUICK_JIT,
    "spark.executor.extraJavaOptions": QUICK_JIT,
}
# The one test Spark configuration: quiet, private and port-free, for the tests' own
# SparkContext (conftest.py) and every driver a test starts.
SPARK_TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}
STOP_TIMEOUT_S = 90


def manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A StreamingJob document; its Spark runs 2 tasks at a time unless the spec says otherwise."""
    spec = {**spec, "sparkConf": {"spark.default.parallelism": "2", **spec.get("sparkConf", {})}}
    return {
        "apiVersion": "dstream.dev/v1alpha1",
        "kind": "StreamingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def python_path() -> str:
    """The test apps' directory and the test process's PYTHONPATH, every entry absolute: the
    executors' Python workers run in Spark's work directories, where a relative entry would
    miss the tree under test and fall back to whatever `dstream` is installed."""
    entries = [str(TEST_APPS_DIR), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return os.pathsep.join(os.path.abspath(entry) for entry in entries if entry)


def run_until_exit(path: Path, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """`dstream run` of a job that ends by itself (one that cannot start), its output kept."""
    return subprocess.run(
        [sys.executable, "-m", "dstream", "run", str(path), "--port", "0", "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "DSTREAM_SPARK_LOG_LEVEL": "ERROR"},
    )


def program_output(program: Path, *args: str, timeout_s: float = 540) -> Any:
    """A test program run as a user would run it, in a process of its own (a SparkContext of
    its own settings) without the test modules on its path, its JVMs on the quick JIT only: the
    JSON of its last output line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(program), *args],
        env={**env, "SPARK_LOCAL_IP": "127.0.0.1", "JAVA_TOOL_OPTIONS": QUICK_JIT},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Line:
    at: float  # time.monotonic() when the line was read
    text: str


class Driver:
    """One `dstream run` process group; its output lines are kept with the time they arrived.
    `launcher` goes before the command (e.g. `unshare --pid --fork`, as a pod runs it)."""

    def __init__(
        self,
        manifest: Path,
        *args: str,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        port: int = 0,
        cwd: Path | None = None,
        launcher: Sequence[str] = (),
    ):
        self.manifest = manifest
        self.args = list(args)
        self.launcher = list(launcher)
        self.env = env or {}
        self.log = log
        self.port = port
        self.cwd = cwd
        self.lines: list[Line] = []
        self.started_at = 0.0
        self._changed = threading.Condition()
        self._reader: threading.Thread | None = None
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> Driver:
        settings = {**SPARK_TEST_CONF, **QUICK_JIT_CONF}
        conf = [arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]
        command = [*self.launcher, sys.executable, "-m", "dstream", "run", str(self.manifest)]
        command += ["--port", str(self.port)]
        env = {
            **os.environ,
            "PYTHONPATH": python_path(),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "DSTREAM_SPARK_LOG_LEVEL": "ERROR",
            **self.env,
        }
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            command + conf + self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=self.cwd,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        sink = open(self.log, "a") if self.log else None  # noqa: SIM115 - closed below
        try:
            for text in self.process.stdout:
                if sink:
                    sink.write(text)
                    sink.flush()
                with self._changed:
                    self.lines.append(Line(time.monotonic(), text.rstrip("\n")))
                    self._changed.notify_all()
        finally:
            if sink:
                sink.close()
            with self._changed:
                self._changed.notify_all()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        """Everything the driver printed so far (all of it once it has exited)."""
        if self._reader is not None and not self.alive():
            self._reader.join(10)
        with self._changed:
            return "\n".join(line.text for line in self.lines)

    def wait_for_line(
        self, predicate: Callable[[str], bool], timeout_s: float, after: int = 0
    ) -> Line:
        """The first line (from index `after`) that satisfies predicate; TimeoutError if none."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for line in self.lines[after:]:
                    if predicate(line.text):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.alive():
                    tail = "\n".join(line.text for line in self.lines[-30:])
                    state = "timed out" if self.alive() else f"exited {self.process.returncode}"
                    raise TimeoutError(f"no matching line ({state}); last output:\n{tail}")
                self._changed.wait(min(remaining, 0.5))

    def batch_lines(self) -> list[Line]:
        return [line for line in self.lines if line.text.startswith("batch ")]

    # -- the HTTP API (when started with a port) --------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **kwargs)

    def wait_for(self, what: str, condition: Any, timeout_s: float) -> Any:
        """`eventually` with the driver's log in its error, which comes at once if the driver
        exits first; an API that does not answer yet counts as not yet."""

        def while_alive() -> Any:
            if not self.alive():
                assert self.process is not None
                raise AssertionError(
                    f"driver exited ({self.process.returncode}) before {what}:\n"
                    + self.output()[-5000:]
                )
            return condition()

        return eventually(
            while_alive,
            timeout_s,
            interval=0.5,
            message=lambda: f"{what}:\n" + self.output()[-5000:],
            ignoring=httpx.TransportError,
        )

    def wait_for_batches(self, count: int, timeout_s: float = 180) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            batches = self.get("/v1/batches", params={"limit": 1000}).json()["batches"]
            return batches if len(batches) >= count else None

        return self.wait_for(f"{count} batches", enough, timeout_s)

    # -- stopping -----------------------------------------------------------------------------

    def kill(self, whole_group: bool = True) -> None:
        """SIGKILL the process group (a lost pod), or only the Python driver (its JVM then exits
        when its stdin closes); either way return once nothing of the group is left."""
        if whole_group:
            _killpg(self.pid, signal.SIGKILL)
        elif self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.reap()

    def terminate(self, timeout_s: float, whole_group: bool = False) -> int:
        """SIGTERM (graceful stop) to the driver, or to its whole group as Kubernetes signals
        every process of a pod, and wait for the exit code."""
        assert self.process is not None
        if whole_group:
            _killpg(self.pid, signal.SIGTERM)
        else:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout_s)
        self.reap()
        return code

    def stop(self) -> None:
        """A graceful stop if it is still running, then SIGKILL whatever is left of its group."""
        if self.alive():
            try:
                self.terminate(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        self.reap()

    def reap(self, timeout_s: float = 30) -> None:
        """Wait for the driver and every process of its group to be gone; SIGKILL stragglers."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        while _group_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _killpg(self.pid, signal.SIGKILL)
        self.process.wait()

    def wait(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        assert self.process is not None
        code = self.process.wait(timeout_s)
        self.reap()
        return code


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. A zombie does not count: spark-class's
    subshell is a child of the driver's JVM, which never collects it, and once the JVM is
    killed it waits for PID 1 to, which some containers' never does (a kill then looked like
    30 s of waiting for the group, counted in every restart the soak measured)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _parent, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):  # the process ended meanwhile
            continue
        if int(group) == pgid and state != "Z":
            return True
    return False


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a server stops gracefully), then SIGKILL whatever is left of its group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    _killpg(process.pid, signal.SIGKILL)  # the group is the process's own
    process.wait()


@contextmanager
def running_driver(
    tmp_path: Path,
    name: str,
    spec: dict[str, Any],
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> Iterator[Driver]:
    """Start `dstream run` on the manifest built from `spec` (more CLI `args` if given), its API
    on a free loopback port; stop it whatever happens."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest(name, spec)))
    driver = Driver(
        path, *args, env=env, log=tmp_path / f"{name}.log", port=free_port(), cwd=tmp_path
    )
    driver.start()
    try:
        yield driver
    finally:
        driver.stop()
