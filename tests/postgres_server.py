"""A real PostgreSQL server for tests: Debian's binaries, a temporary cluster, a free loopback port.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user that the
Debian package creates. The superuser `postgres` connects without a password; the role
`secretive` (password `SECRET_PASSWORD`) must authenticate with SCRAM, which is how the tests
show that the password from the environment reaches the server.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from debian_packages import INSTALLER, LIST, listed
from servers import free_port

PACKAGE = "postgresql"
SECRET_ROLE = "secretive"
SECRET_PASSWORD = "s3cret-pw"
START_TIMEOUT_S = 60

HBA = f"""\
host all {SECRET_ROLE} 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 trust
"""


def server_bin() -> Path:
    """The newest installed server's bin directory, or a failed test naming the package."""
    assert PACKAGE in listed(), f"{PACKAGE} is not in {LIST.name}: add it, so make test installs it"
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_major)
    if not found:
        pytest.fail(
            f"PostgreSQL's server (/usr/lib/postgresql/*/bin/pg_ctl) is not installed: run "
            f"`bash {INSTALLER}` as root (`make test` does), or `apt-get install {PACKAGE}`",
            pytrace=False,
        )
    return Path(found[-1]).parent


def _major(pg_ctl: str) -> int:
    return int(Path(pg_ctl).parts[-3])


@dataclass
class PostgresServer:
    bin: Path
    data: Path
    port: int
    user: str | None  # whom to run as, when we are root

    def dsn(self, user: str = "postgres", database: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def command(self, *args: str | Path) -> list[str]:
        argv = [str(a) for a in args]
        return ["runuser", "-u", self.user, "--", *argv] if self.user else argv

    def run(self, *args: str | Path) -> None:
        done = subprocess.run(self.command(*args), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, args))} failed:\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        """Start and wait (pg_ctl -w) until the server accepts connections."""
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port}"
            f" -c unix_socket_directories={self.data} -c fsync=off"
        )
        self.run(
            self.bin / "pg_ctl",
            "start",
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "-D",
            self.data,
            "-l",
            self.data / "server.log",
            "-o",
            options,
        )

    def stop(self) -> None:
        self.run(self.bin / "pg_ctl", "stop", "-w", "-m", "fast", "-D", self.data)


def run_as() -> str | None:
    """As root: the Debian package's `postgres` user (the server will not run as root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail(
            f"running as root but there is no 'postgres' user: `apt-get install {PACKAGE}`",
            pytrace=False,
        )
    return "postgres"


def running_postgres() -> Iterator[PostgresServer]:
    """A fresh cluster in a temporary directory, started; stopped and removed afterwards."""
    user = run_as()
    base = Path(tempfile.mkdtemp(prefix="dstream-pg-"))
    data = base / "data"
    if user:
        shutil.chown(base, user)
    server = PostgresServer(server_bin(), data, free_port(), user)
    server.run(server.bin / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
    (data / "pg_hba.conf").write_text(HBA)
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(base, ignore_errors=True)
