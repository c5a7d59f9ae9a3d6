"""Atomic per-batch output directories, shared by `saveAsTextFiles` and the files sink.

A batch's directory is written whole in a staging directory and renamed into place; a reader
therefore sees a batch's output whole or not at all, and a re-run batch replaces its output and
never appends. User sinks in `foreachRDD` get the same guarantee only if they follow the same
contract: write keyed by the batch time, replacing. The sinks themselves are in `dstream.connectors`.

Where the staging directory is: a rename is atomic only within one mount, and the output
directory is the one a reader lists (Spark's own streaming tests take the newest entry of
`os.listdir` and read it), so nothing but finished batches may appear in it. The staging
directory is therefore beside it, `<parent>/.dstream-staging-<name>`, on the same mount unless
the output directory is itself a mount point (a volume, a Kubernetes subPath); then, or when the
parent is not writable, the only place on its mount is inside it: a hidden `.dstream-staging`,
which Spark's and Hadoop's readers skip. Either is removed once a batch's write leaves it empty;
what a failed or crashed attempt left in it (a task of a failed job may still be writing) goes
with the next write of the same batch.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import uuid
from datetime import datetime
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pyspark import RDD

from dstream.runtime.checkpoint.files import local_path
from dstream.runtime.task_errors import jvm_root_cause
from dstream.runtime.timeutil import time_to_ms

STAGING = ".dstream-staging"
MOUNT_TABLE = Path("/proc/self/mountinfo")


class OutputWriteError(RuntimeError):
    """Spark failed to write a batch's output directory. The message names the directory and
    the root cause (e.g. `java.io.IOException: No space left on device`), which the JVM's
    error, kept as __cause__, buries under stack traces."""


def text_file_name(prefix: str, suffix: str | None, time: datetime) -> str:
    """pyspark.streaming's naming: `prefix-<ms>[.suffix]`."""
    name = f"{prefix}-{time_to_ms(time)}"
    return f"{name}.{suffix}" if suffix else name


def save_text_atomically(rdd: RDD, path: str) -> None:
    """rdd.saveAsTextFile into the staging directory, then rename over `path` (with `_SUCCESS`)."""
    final = local_path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_earlier_attempts(final)
    staging = staging_dir(final.parent)
    tmp = staging / f"tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        rdd.saveAsTextFile(str(tmp))
    except Py4JJavaError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputWriteError(f"writing {final} failed: {jvm_root_cause(error)}") from error
    else:
        replace_directory(tmp, final)
    finally:
        with contextlib.suppress(OSError):  # not empty: another output is being written
            staging.rmdir()


def replace_directory(tmp: Path, final: Path) -> None:
    """Move a fully written directory into place, replacing an earlier attempt's output: the
    earlier one goes aside into `tmp`'s (staging) directory first, and is removed after."""
    if final.exists():
        old = tmp.with_name(f"old-{final.name}-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def staging_dir(listed: Path) -> Path:
    """The staging directory for batches written into `listed` (created): beside it when that
    is on its mount and writable, else inside it (see the module's docstring)."""
    if not is_mount_point(listed):
        beside = listed.parent / f"{STAGING}-{listed.name}"
        with contextlib.suppress(OSError):  # not writable: read-only, or not ours
            beside.mkdir(exist_ok=True)
            return beside
    inside = listed / STAGING
    inside.mkdir(exist_ok=True)
    return inside


def is_mount_point(path: Path) -> bool:
    """Whether a rename between `path` and its parent crosses mounts: another file system
    (os.path.ismount compares devices), or a bind mount of the same one, which only the
    mount table shows (a Kubernetes subPath, `mount --bind`)."""
    if os.path.ismount(path):
        return True
    if not MOUNT_TABLE.exists():
        return False
    escaped = str(path.resolve())
    for raw, code in (("\\", "\\134"), (" ", "\\040"), ("\t", "\\011"), ("\n", "\\012")):
        escaped = escaped.replace(raw, code)
    with open(MOUNT_TABLE) as table:
        return any(line.split()[4] == escaped for line in table)


def remove_earlier_attempts(final: Path) -> None:
    """Staged leftovers of a driver that crashed while writing this same batch, in either
    staging directory (mounts may have changed since): a batch's outputs are written one
    attempt at a time, so any such directory is dead."""
    listed = final.parent
    for staging in (listed.parent / f"{STAGING}-{listed.name}", listed / STAGING):
        for prefix in ("tmp-", "old-"):
            for stale in staging.glob(f"{prefix}{glob.escape(final.name)}-*"):
                shutil.rmtree(stale, ignore_errors=True)
