"""The one list of Debian packages (.ci/debian-packages) and its installer, which `make test` and
`.ci/run` call before the tests: it installs what is missing, and says what to do when it cannot."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from debian_packages import LIST, listed, require_binary

INSTALLER = LIST.with_name("install-debian-packages")
NOBODY = 65534


def test_the_list_names_the_packages_behind_the_suites_components():
    assert {"prometheus", "etcd-server", "debootstrap", "buildah", "containerd"} <= listed()
    assert all(" " not in name and "#" not in name for name in listed())


def test_a_missing_binary_fails_the_test_naming_the_package():
    with pytest.raises(pytest.fail.Exception) as failure:
        require_binary("dstream-no-such-binary", "prometheus")
    assert "apt-get install prometheus" in str(failure.value)
    assert ".ci/install-debian-packages" in str(failure.value)


def test_installer_does_nothing_when_everything_is_installed():
    """`make test` runs it first; by the time this test runs every package is there."""
    result = subprocess.run(["bash", str(INSTALLER)], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr


def test_installer_without_root_names_the_packages_to_install(tmp_path: Path):
    """Run as nobody (no root, no sudo) when the suite runs as root, else as the user running
    it. The installer comes in on stdin and the list on a file descriptor: nobody may not
    enter pytest's temporary directory, nor a checkout in a private directory (/root)."""
    as_nobody = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    packages = tmp_path / "packages"
    packages.write_text("# a comment\nprometheus\ndstream-no-such-package  # not in Debian\n")
    with packages.open() as listing:
        result = subprocess.run(
            [
                *(as_nobody if os.geteuid() == 0 else ()),
                *("bash", "-s", f"/dev/fd/{listing.fileno()}"),
            ],
            input=INSTALLER.read_text(),
            pass_fds=(listing.fileno(),),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert "missing dstream-no-such-package, and installing needs root" in result.stderr
    assert "apt-get install --no-install-recommends dstream-no-such-package" in result.stderr
