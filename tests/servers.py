"""Real Redis and NATS servers from Debian's packages, on free loopback ports, for the tests.

A missing binary fails the test (never skips it) naming the package to install; `make test`
installs every package listed in `.ci/debian-packages`. Data lives under the test's temporary
directory and survives `restart()`, which is how the tests restart a broker mid-run.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from debian_packages import require_binary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s} s")
        time.sleep(0.05)


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Server:
    """A server process on a fixed port that can be stopped and started again."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        return accepts_connections(self.port)

    def start(self, timeout_s: float = 20) -> None:
        log = open(self.directory / "server.log", "ab")  # noqa: SIM115 (the process keeps it)
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=log)
        wait_for(
            self.ready, timeout_s, f"{self.command()[0]} did not accept connections on {self.port}"
        )

    def stop(self) -> None:
        """Graceful stop (SIGTERM), as a broker restart by an operator does."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(20)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


class RedisServer(Server):
    """redis-server with an append-only file fsynced on every write, so a restart keeps data."""

    def command(self) -> list[str]:
        return [
            require_binary("redis-server", "redis-server"),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class NatsServer(Server):
    """nats-server with JetStream storing under the test's directory; `login` adds nats-server's
    own flags for a user and password (`--user`, `--pass`) or a token (`--auth`)."""

    def __init__(self, directory: Path, login: tuple[str, ...] = ()):
        super().__init__(directory)
        self.login = login

    def command(self) -> list[str]:
        return [
            require_binary("nats-server", "nats-server"),
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-sd",
            str(self.directory / "jetstream"),
            *self.login,
        ]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"
