"""Real Redis and NATS servers from Debian's packages, on free loopback ports, for the tests.

A missing binary fails the test (never skips it) naming the package to install; `make test`
installs every package listed in `.ci/debian-packages`. Data lives under the test's temporary
directory and survives `restart()`, which is how the tests restart a broker mid-run.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
from pathlib import Path

from conditions import eventually
from debian_packages import require_binary

# The tests' servers listen from FIRST_PORT up to Kubernetes' NodePort range (30000) or the
# kernel's ephemeral range, whichever starts first: clear of both, and of the ports that
# Kubernetes' own components take (10248-10259), which `make e2e` runs on this host.
FIRST_PORT = 20000
NODE_PORTS_START = 30000


def ephemeral_ports_start() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range, from this pytest-xdist worker's
    own share of the tests' ports. A server stopped to be restarted gets its port back: the
    kernel never gives a port from here to an outgoing connection or to another test's bind to
    port 0, and two workers never pick the same one."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = (min(ephemeral_ports_start(), NODE_PORTS_START) - FIRST_PORT) // workers
    first = FIRST_PORT + worker * share
    for port in random.sample(range(first, first + share), min(100, max(share, 0))):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(
        f"no free loopback port in {first}-{first + share - 1} (the tests' ports end where the"
        " kernel's ephemeral range, /proc/sys/net/ipv4/ip_local_port_range, begins:"
        f" {ephemeral_ports_start()})"
    )


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
        eventually(
            self.ready,
            timeout_s,
            message=lambda: (
                f"{self.command()[0]} serving on {self.port}; exit code"
                f" {self.process and self.process.poll()}, {self.log_tail()}"
            ),
        )

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log, for an error that says why it did not come up."""
        tail = (self.directory / "server.log").read_text(errors="replace").splitlines()[-lines:]
        return "its log ends:\n" + "\n".join(tail) if tail else "its log is empty"

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
