"""Sinks, all idempotent per batch time, so a re-run batch replaces its output and never appends.

A batch's directory is written under a hidden temporary name and renamed into place; a reader
therefore sees a batch's output whole or not at all. User sinks in `foreachRDD` get the same
guarantee only if they follow the same contract: write keyed by the batch time, replacing.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark import RDD

from dstream.timeutil import time_to_ms


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


def _local(path: str) -> Path:
    return Path(path.removeprefix("file:"))


def save_text_atomically(rdd: RDD, path: str) -> None:
    """rdd.saveAsTextFile into a hidden sibling, then rename over `path` (with `_SUCCESS`)."""
    final = _local(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_earlier_attempts(final)
    tmp = final.with_name(f".tmp-{final.name}-{uuid.uuid4().hex[:8]}")
    rdd.saveAsTextFile(str(tmp))
    replace_directory(tmp, final)


def remove_earlier_attempts(final: Path) -> None:
    """Hidden leftovers of a driver that crashed while writing this same batch: a batch's
    outputs are written one attempt at a time, so any such directory is dead."""
    for prefix in (".tmp-", ".old-"):
        for stale in final.parent.glob(f"{prefix}{glob.escape(final.name)}-*"):
            shutil.rmtree(stale, ignore_errors=True)


def to_json_line(record: Any) -> str:
    """One JSON document per record: pairs become {"key", "value"}, the rest as they are."""
    if isinstance(record, tuple) and len(record) == 2:
        record = {"key": record[0], "value": record[1]}
    return json.dumps(record, default=str, ensure_ascii=False)


class FilesSink:
    """`<path>/batch-<epoch-ms>/part-*` of JSON lines, with a `_SUCCESS` marker."""

    def __init__(self, path: str):
        self.path = path

    def batch_dir(self, time: datetime) -> str:
        return str(Path(self.path) / f"batch-{time_to_ms(time)}")

    def __call__(self, time: datetime, rdd: RDD) -> None:
        save_text_atomically(rdd.map(to_json_line), self.batch_dir(time))


class ConsoleSink:
    """Prints each batch's first (or, for counts, largest) records as they arrive."""

    def __init__(self, num: int = 10, largest_first: bool = False):
        self.num = num
        self.largest_first = largest_first

    def __call__(self, time: datetime, rdd: RDD) -> None:
        if self.largest_first:
            shown = rdd.takeOrdered(self.num + 1, key=lambda kv: (-kv[1], str(kv[0])))
        else:
            shown = rdd.take(self.num + 1)
        items = ", ".join(_show(record) for record in shown[: self.num])
        more = " ..." if len(shown) > self.num else ""
        print(f"  {time:%H:%M:%S.%f}"[:-3] + f"  {items}{more}", flush=True)


def _show(record: Any) -> str:
    if isinstance(record, tuple) and len(record) == 2:
        return f"{record[0]}={record[1]}"
    return str(record)
