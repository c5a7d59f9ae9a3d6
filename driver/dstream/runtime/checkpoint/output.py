"""Atomic per-batch output directories, shared by `saveAsTextFiles` and the files sink.

A batch's directory is written under a hidden temporary name and renamed into place; a reader
therefore sees a batch's output whole or not at all, and a re-run batch replaces its output and
never appends. User sinks in `foreachRDD` get the same guarantee only if they follow the same
contract: write keyed by the batch time, replacing. The sinks themselves are in `dstream.connectors`.
"""

from __future__ import annotations

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


class OutputWriteError(RuntimeError):
    """Spark failed to write a batch's output directory. The message names the directory and
    the root cause (e.g. `java.io.IOException: No space left on device`), which the JVM's
    error, kept as __cause__, buries under stack traces."""


def text_file_name(prefix: str, suffix: str | None, time: datetime) -> str:
    """pyspark.streaming's naming: `prefix-<ms>[.suffix]`."""
    name = f"{prefix}-{time_to_ms(time)}"
    return f"{name}.{suffix}" if suffix else name


def replace_directory(tmp: Path, final: Path) -> None:
    """Move a fully written directory into place, replacing an earlier attempt's output."""
    if final.exists():
        old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def save_text_atomically(rdd: RDD, path: str) -> None:
    """rdd.saveAsTextFile into a hidden sibling, then rename over `path` (with `_SUCCESS`)."""
    final = local_path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_earlier_attempts(final)
    tmp = final.with_name(f".tmp-{final.name}-{uuid.uuid4().hex[:8]}")
    try:
        rdd.saveAsTextFile(str(tmp))
    except Py4JJavaError as error:
        raise OutputWriteError(f"writing {final} failed: {jvm_root_cause(error)}") from error
    replace_directory(tmp, final)


def remove_earlier_attempts(final: Path) -> None:
    """Hidden leftovers of a driver that crashed while writing this same batch: a batch's
    outputs are written one attempt at a time, so any such directory is dead."""
    for prefix in (".tmp-", ".old-"):
        for stale in final.parent.glob(f"{prefix}{glob.escape(final.name)}-*"):
            shutil.rmtree(stale, ignore_errors=True)
