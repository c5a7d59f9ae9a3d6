"""Fixtures for the offline-built image: the docker-archive tarball from `e2e/image/build.sh` and
that tarball unpacked into a root filesystem in which commands run the way a container runtime
would start them: the image's entrypoint, environment, working directory and user, in fresh mount
and PID namespaces (tini is PID 1) with their own /proc, the host's /dev and a private /tmp.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import time

import pytest
from debian_packages import require_binary

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_SH = REPO_ROOT / "e2e" / "image" / "build.sh"
# A cold build (debootstrap, apt, pip) took ~3 min here; CI machines may be slower.
BUILD_TIMEOUT_SECONDS = int(os.environ.get("DSTREAM_IMAGE_TEST_BUILD_TIMEOUT", "3600"))
HOSTNAME = "dstream-image-test"
NAMESPACES = ("unshare", "--mount", "--uts", "--pid", "--fork")
# A layer's files, without its whiteout markers (applied separately), owners kept.
UNTAR = ("tar", "--numeric-owner", "--same-owner", "-xpf", "-", "--exclude=.wh.*")


def pytest_collection_modifyitems(config, items):
    """Keep a cold build out of the per-test timeout: it covers the test function only."""
    for item in items:
        if "image_tarball" in getattr(item, "fixturenames", ()):
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(func_only=True))


def _echo(request, line: str) -> None:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        sys.stderr.write(line)
        return
    with capture.global_and_fixture_disabled():
        sys.stderr.write(line)


@pytest.fixture(scope="session")
def image_tarball(request) -> pathlib.Path:
    """Builds the image (or reuses the cached one), echoing build.sh's progress lines live."""
    if os.geteuid() != 0:
        pytest.fail("building the image needs root (debootstrap, buildah storage)", pytrace=False)
    require_binary("debootstrap", "debootstrap")
    require_binary("buildah", "buildah")
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", str(BUILD_SH)],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = "", []
        assert proc.stderr is not None and proc.stdout is not None
        deadline = started + BUILD_TIMEOUT_SECONDS
        for line in proc.stderr:
            stderr.append(line)
            _echo(request, line)
            if time.monotonic() > deadline:
                break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        stdout = proc.stdout.read()
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.terminate()  # build.sh's trap stops its step and removes its temporary files
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            pytest.fail(f"build.sh did not finish within {BUILD_TIMEOUT_SECONDS}s", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"e2e/image/build.sh failed (exit {proc.returncode}):\n{''.join(stderr)}")
    _echo(request, f"image ready in {time.monotonic() - started:.0f}s\n")
    return pathlib.Path(stdout.strip().splitlines()[-1])


@dataclasses.dataclass(frozen=True)
class Image:
    """A docker-archive's first image: its tags, config and the layers unpacked in `rootfs`."""

    tags: list[str]
    config: dict
    rootfs: pathlib.Path

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Runs ENTRYPOINT + args as the image's USER in WORKDIR with the image's Env (plus
        `env`), as a runtime would: in new mount, UTS and PID namespaces, with /proc and /tmp
        fresh and an /etc/hosts that resolves the hostname (Spark looks its own host up)."""
        config = self.config["config"]
        user = config.get("User") or "0"
        if ":" not in user:
            user = f"{user}:{user}"
        variables = dict(item.split("=", 1) for item in config.get("Env", []))
        variables.update(env or {})
        command = [*config.get("Entrypoint", []), *args]
        hosts = self.rootfs.parent / "hosts"
        hosts.write_text(f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost ip6-localhost\n")
        inside = (
            'hostname "$HOSTNAME" && mount --bind "$HOSTS" "$ROOTFS/etc/hosts"'
            ' && mount --rbind /dev "$ROOTFS/dev" && mount -t tmpfs -o mode=1777 tmpfs "$ROOTFS/tmp"'
            ' && exec chroot --userspec="$USERSPEC" "$ROOTFS"'
            ' /usr/bin/env -i --chdir="$WORKDIR" "$@"'
        )
        return subprocess.run(
            [
                *NAMESPACES,
                f"--mount-proc={self.rootfs}/proc",
                *("sh", "-c", inside, "sh"),
                *(f"{key}={value}" for key, value in variables.items()),
                *command,
            ],
            env={
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "ROOTFS": str(self.rootfs),
                "HOSTS": str(hosts),
                "HOSTNAME": HOSTNAME,
                "WORKDIR": config.get("WorkingDir") or "/",
                "USERSPEC": user,
            },
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _whiteouts(layer: tarfile.TarFile) -> tuple[list[str], list[str]]:
    """Paths a layer deletes from the layers below it, and directories it makes opaque."""
    deleted, opaque = [], []
    for name in layer.getnames():
        parent, _, base = name.rstrip("/").rpartition("/")
        if base == ".wh..wh..opq":
            opaque.append(parent)
        elif base.startswith(".wh."):
            deleted.append(f"{parent}/{base[4:]}" if parent else base[4:])
    return deleted, opaque


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def unpack(tarball: pathlib.Path, rootfs: pathlib.Path) -> Image:
    """Applies the layers in order: a layer's whiteouts first, then its files (GNU tar, keeping
    owners and modes)."""
    rootfs.mkdir()
    with tarfile.open(tarball) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))[0]
        config = json.load(archive.extractfile(manifest["Config"]))
        for name in manifest["Layers"]:
            stream = archive.extractfile(name)
            with tarfile.open(fileobj=stream) as layer:
                deleted, opaque = _whiteouts(layer)
            for path in deleted:
                _remove(rootfs / path)
            for path in opaque:
                for child in (rootfs / path).iterdir():
                    _remove(child)
            stream.seek(0)
            untar = subprocess.Popen(
                [*UNTAR, "-C", str(rootfs)],
                stdin=subprocess.PIPE,
            )
            assert untar.stdin is not None
            shutil.copyfileobj(stream, untar.stdin, 1 << 20)
            untar.stdin.close()
            assert untar.wait() == 0, f"tar failed on layer {name}"
    return Image(tags=manifest["RepoTags"], config=config, rootfs=rootfs)


@pytest.fixture(scope="session")
def image(image_tarball, tmp_path_factory):
    parent = tmp_path_factory.mktemp("image")
    yield unpack(image_tarball, parent / "rootfs")
    shutil.rmtree(parent, ignore_errors=True)  # a GB; the namespaces' mounts died with them
