"""The Debian packages behind the test suite's real components (.ci/debian-packages).

`make test` installs them before pytest starts; a test whose component is still missing fails
saying what to install, so a suite that "passed" has run every test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

LIST = Path(__file__).resolve().parents[1] / ".ci" / "debian-packages"
INSTALLER = ".ci/install-debian-packages"


def listed() -> set[str]:
    """The package names in the list, without comments and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in LIST.read_text().splitlines())
    return {line for line in lines if line}


def require_binary(binary: str, package: str) -> str:
    """The path of `binary`, or a failed test naming the package that provides it."""
    assert package in listed(), f"{package} is not in {LIST.name}: add it, so make test installs it"
    path = shutil.which(binary)
    if path is None:
        pytest.fail(
            f"`{binary}` is not installed: run `bash {INSTALLER}` as root (`make test` does), "
            f"or `apt-get install {package}`",
            pytrace=False,
        )
    return path
