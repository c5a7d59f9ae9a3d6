"""Whether a job's checkpoint is on storage its driver and executors share, and if not, what
the job gives up: the StreamingJob's `CheckpointShared` condition, and a Warning event when it
turns false.

Shared means: the checkpoint path lies on a writable persistentVolumeClaim of `spec.volumes`,
which the operator mounts in the driver pods and Spark in every executor. A claim serves pods
on several nodes only if it is ReadWriteMany, which the message says rather than checks (the
operator reads no claims). A hostPath volume is a directory of each node, shared only by the
pods on one node; any other path is in each pod's own filesystem.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from dstream.spec import StreamingJob, Volume

# What a job whose checkpoint its pods do not share cannot do; the message's second half.
_GIVES_UP = (
    "a driver replaced after its pod is lost{where} starts from nothing (state, windows and "
    "the batch log are gone: input is not replayed and output is not exactly once across the "
    "loss), a standby driver cannot follow the leader's checkpoint, and executors{executors} "
    "write their state checkpoints out of the driver's reach"
)
_USE = "; put it on a ReadWriteMany persistentVolumeClaim in spec.volumes"


@dataclass(frozen=True)
class CheckpointStorage:
    """The `CheckpointShared` condition of a job: true or not, why, and what it means."""

    shared: bool
    reason: str  # SharedVolume | NodeLocalVolume | ReadOnlyVolume | PodLocal | NoCheckpoint
    message: str


def checkpoint_storage(job: StreamingJob) -> CheckpointStorage:
    """Judge where the job's checkpoint lives (see the module docstring)."""
    checkpoint = job.spec.checkpoint
    if checkpoint is None:
        gives_up = _GIVES_UP.format(where="", executors="")
        return CheckpointStorage(False, "NoCheckpoint", f"no checkpoint: {gives_up}{_USE}")
    path = checkpoint.path
    volume = _volume_holding(job.spec.volumes, path)
    if volume is None:
        gives_up = _GIVES_UP.format(where="", executors="")
        message = f"checkpoint {path} is on no volume of spec.volumes, inside each pod: "
        return CheckpointStorage(False, "PodLocal", message + gives_up + _USE)
    if volume.host_path is not None:
        gives_up = _GIVES_UP.format(where=" on another node", executors=" on other nodes")
        message = (
            f"checkpoint {path} is on hostPath volume {volume.name}, a directory of each node, "
            f"shared only by pods on the same node: {gives_up}{_USE} (or run on one node)"
        )
        return CheckpointStorage(False, "NodeLocalVolume", message)
    claim = volume.persistent_volume_claim
    assert claim is not None
    if claim.read_only:
        message = f"checkpoint {path} is on volume {volume.name}, mounted read-only: unwritable"
        return CheckpointStorage(False, "ReadOnlyVolume", message + _USE)
    message = (
        f"checkpoint {path} is on volume {volume.name} (claim {claim.claim_name}), mounted by "
        "the driver and every executor; pods on several nodes need the claim ReadWriteMany"
    )
    return CheckpointStorage(True, "SharedVolume", message)


def _volume_holding(volumes: list[Volume], path: str) -> Volume | None:
    """The volume mounted at the path or above it, the innermost mount if mounts nest."""
    path = posixpath.normpath(path)
    holding = [
        v
        for v in volumes
        if path == (mount := posixpath.normpath(v.mount_path))
        or path.startswith(mount.rstrip("/") + "/")
    ]
    return max(holding, key=lambda v: len(posixpath.normpath(v.mount_path)), default=None)
