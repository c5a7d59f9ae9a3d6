"""Where the job keeps its checkpoint and output, and how the suite reads them back.

The driver and the executors mount one volume at /data (checkpoint and files sink must be shared).
Either a hostPath that this machine also sees (the offline cluster's node is this machine; kind.sh
mounts the same host directory into its node), read directly, or a PersistentVolumeClaim of a
storage class, read through a helper pod with `kubectl exec ... tar`.
"""

from __future__ import annotations

import io
import re
import shutil
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from e2e.chaos.cluster import Cluster, pod_ready, wait_for

MOUNT = "/data"
CHECKPOINT = f"{MOUNT}/checkpoint"
OUTPUT = f"{MOUNT}/out"
VOLUME = "data"
_BATCH_DIR = re.compile(r"^batch-(\d+)$")


@dataclass(frozen=True)
class LogEntry:
    data: bytes
    mtime: float  # seconds since the epoch, as the file system recorded the write


class Storage(Protocol):
    def volume(self) -> dict[str, Any]:
        """The StreamingJob's `spec.volumes` entry, mounted at MOUNT."""
        ...

    def prepare(self) -> None:
        """Empty and writable by the image's user (uid 185)."""
        ...

    def log_entries(self) -> dict[str, LogEntry]:
        """The files of the checkpoint's batch log by name."""
        ...

    def batch_outputs(self) -> dict[int, list[str]]:
        """Every visible batch directory of the files sink: batch time (ms) -> its lines."""
        ...

    def release(self) -> None:
        """Remove what `prepare` created in the cluster."""
        ...


@dataclass
class HostPathStorage:
    """A fresh `run-<epoch>` directory under the given root per run: the pods write as uid 185,
    so a user without root may be unable to empty an earlier run's directory (it is removed when
    possible)."""

    node_root: str  # the hostPath directory on the node
    local_root: Path  # the same directory as this process sees it
    run: str = field(default_factory=lambda: f"run-{int(time.time())}")
    checkpoint: str = "checkpoint"  # the checkpoint's directory in the volume

    @property
    def local_path(self) -> Path:
        return self.local_root / self.run

    @property
    def node_path(self) -> str:
        return f"{self.node_root.rstrip('/')}/{self.run}"

    def volume(self) -> dict[str, Any]:
        return {"name": VOLUME, "mountPath": MOUNT, "hostPath": {"path": self.node_path}}

    def prepare(self) -> None:
        self.local_root.mkdir(parents=True, exist_ok=True)
        for earlier in self.local_root.glob("run-*"):
            shutil.rmtree(earlier, ignore_errors=True)
        self.local_path.mkdir()
        self.local_path.chmod(0o777)

    def log_entries(self) -> dict[str, LogEntry]:
        log = self.local_path / self.checkpoint / "log"
        entries = {}
        for path in log.glob("*.json") if log.is_dir() else ():
            try:
                entries[path.name] = LogEntry(path.read_bytes(), path.stat().st_mtime)
            except FileNotFoundError:
                continue  # pruned meanwhile
        return entries

    def batch_outputs(self) -> dict[int, list[str]]:
        out = self.local_path / "out"
        batches = {}
        for directory in out.iterdir() if out.is_dir() else ():
            match = _BATCH_DIR.match(directory.name)
            if match:
                lines = [ln for p in sorted(directory.glob("part-*")) for ln in _lines(p)]
                batches[int(match.group(1))] = lines
        return batches

    def release(self) -> None:
        """The directory stays for inspection; `prepare` empties it next time."""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@dataclass
class ClaimStorage:
    cluster: Cluster
    namespace: str
    storage_class: str
    image: str
    size: str = "1Gi"
    access_mode: str = "ReadWriteMany"
    claim: str = "dstream-e2e-data"
    reader: str = "dstream-e2e-reader"

    def volume(self) -> dict[str, Any]:
        return {
            "name": VOLUME,
            "mountPath": MOUNT,
            "persistentVolumeClaim": {"claimName": self.claim},
        }

    def prepare(self) -> None:
        self.cluster.apply([self._claim(), self._reader_pod()])
        wait_for(
            f"pod {self.reader} (mounting claim {self.claim}) ready",
            lambda: any(pod_ready(p) for p in self._reader_pods()),
            300,
            every_s=2,
        )
        self._exec("sh", "-c", f"rm -rf {MOUNT}/* && chmod 0777 {MOUNT}")

    def _reader_pods(self) -> list[Any]:
        return self.cluster.pods(self.namespace, f"app={self.reader}")

    def _claim(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": self.claim, "namespace": self.namespace},
            "spec": {
                "storageClassName": self.storage_class,
                "accessModes": [self.access_mode],
                "resources": {"requests": {"storage": self.size}},
            },
        }

    def _reader_pod(self) -> dict[str, Any]:
        """Root, so that it can make the volume writable for the image's user."""
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.reader,
                "namespace": self.namespace,
                "labels": {"app": self.reader},
            },
            "spec": {
                "securityContext": {"runAsUser": 0},
                "containers": [
                    {
                        "name": "reader",
                        "image": self.image,
                        "command": ["sleep", "infinity"],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}],
                    }
                ],
                "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": self.claim}}],
            },
        }

    def _exec(self, *command: str) -> bytes:
        return self.cluster.run_kubectl(
            "exec", "--namespace", self.namespace, self.reader, "--", *command
        )

    def _tar(self, relative: str) -> tarfile.TarFile:
        """A pax archive (sub-second mtimes) of MOUNT/relative, or an empty one."""
        data = self._exec(
            "sh",
            "-c",
            f"cd {MOUNT} && if [ -e {relative} ]; then tar --format=posix -cf - {relative}; fi",
        )
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:") if data else _empty_tar()

    def log_entries(self) -> dict[str, LogEntry]:
        entries = {}
        with self._tar("checkpoint/log") as archive:
            for member in archive.getmembers():
                name = member.name.rsplit("/", 1)[-1]
                extracted = archive.extractfile(member) if member.isfile() else None
                if extracted and name.endswith(".json"):
                    entries[name] = LogEntry(extracted.read(), float(member.mtime))
        return entries

    def batch_outputs(self) -> dict[int, list[str]]:
        batches: dict[int, list[str]] = {}
        with self._tar("out") as archive:
            for member in sorted(archive.getmembers(), key=lambda m: m.name):
                parts = member.name.split("/")
                match = _BATCH_DIR.match(parts[1]) if len(parts) > 1 else None
                if not match:
                    continue
                lines = batches.setdefault(int(match.group(1)), [])
                extracted = archive.extractfile(member) if member.isfile() else None
                if extracted and parts[-1].startswith("part-"):
                    lines += extracted.read().decode().splitlines()
        return batches

    def release(self) -> None:
        self.cluster.delete([self._reader_pod(), self._claim()])


def _empty_tar() -> tarfile.TarFile:
    buffer = io.BytesIO()
    tarfile.open(fileobj=buffer, mode="w:").close()
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r:")
