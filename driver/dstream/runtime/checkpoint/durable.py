"""Durable batch reductions: each partition written by the task that computes it.

An incremental window subtracts the batches leaving it, so a restarted driver needs those
batches' reductions; they are written under the run's state directory as `rdd-<id>/part-NNNNN`
(beside Spark's reliable checkpoints, pruned the same way). Spark's `rdd.checkpoint()` would
write them in a second job after every batch's output job, plus the driver's side of a Spark
checkpoint (bench/results/2026-11-25-bench.md, "What the engine changes of 2026-11-25 bought").
Here the task that computes a partition for the batch's output also writes it, as it hands the
records on; the driver only runs a job for partitions no output computed (an output that took a
few records).

A part file: MAGIC, then chunks of records (each an 8-byte length and a pickled list), then a
trailer: the part's index, the RDD's partition count, the CRC-32 of the chunks and the record
count. It is written to a temporary name, fsynced and renamed, so a crash leaves no part or a
whole one; a part that is cut short, altered or missing is found by `check_parts`.
"""

from __future__ import annotations

import pickle
import re
import struct
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from dstream.runtime.checkpoint.files import (
    CheckpointWriteError,
    TornFileError,
    local_path,
    write_atomically,
)
from dstream.runtime.task_errors import raised_in_task

MAGIC = b"dstream-part\x01"
_TRAILER = struct.Struct(">IIIQ")  # index, partitions, crc32 of the chunks, records
_LENGTH = struct.Struct(">Q")
CHUNK_RECORDS = 1024
_PART_NOT_WRITTEN = re.compile(r"cannot write checkpoint file (.+?/part-\d+): (.+)$")


def part_path(directory: str | Path, index: int) -> Path:
    return local_path(str(directory)) / f"part-{index:05d}"


def is_durable(directory: str) -> bool:
    """Whether a state checkpoint directory holds parts of this format (else Spark's own)."""
    first = part_path(directory, 0)
    try:
        with open(first, "rb") as part:
            return part.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


@dataclass(frozen=True)
class PartWriter:
    """The task side: pass a partition's records on, and once all have passed, write them as
    the partition's part file. The pickled partition is held until then (a batch's reduction:
    at most one record per key). A partition left unfinished (an output that took only some
    records) writes nothing."""

    directory: str
    partitions: int

    def __call__(self, index: int, records: Iterable[Any]) -> Iterator[Any]:
        chunks: list[bytes] = []
        count = 0
        records = iter(records)
        while chunk := list(islice(records, CHUNK_RECORDS)):
            pickled = pickle.dumps(chunk, pickle.HIGHEST_PROTOCOL)
            chunks += (_LENGTH.pack(len(pickled)), pickled)
            count += len(chunk)
            yield from chunk
        body = b"".join(chunks)
        trailer = _TRAILER.pack(index, self.partitions, zlib.crc32(body), count)
        write_atomically(part_path(self.directory, index), MAGIC + body + trailer)

    def missing(self) -> list[int]:
        """The partitions whose part is not written yet."""
        return missing_parts(self.directory, self.partitions)


def read_part(directory: str, index: int, partitions: int) -> list[Any]:
    """A part's records; TornFileError unless it is whole and belongs where it is found."""
    path, body, count = _whole_part(directory, index, partitions)
    records: list[Any] = []
    at = 0
    while at < len(body):
        (length,) = _LENGTH.unpack_from(body, at)
        records += pickle.loads(body[at + _LENGTH.size : at + _LENGTH.size + length])
        at += _LENGTH.size + length
    if len(records) != count:
        raise TornFileError(f"{path}: {len(records)} records, its trailer says {count}")
    return records


def check_parts(directory: str) -> int:
    """The partition count of a durable batch whose every part is whole; TornFileError else.
    Checksums only: the records are unpickled by the tasks that read them back."""
    path, _body, (first, partitions, _count) = _checked_part(directory, 0)
    if first != 0 or partitions < 1:
        raise TornFileError(f"{path}: part {first} of {partitions}, expected part 0 of 1 or more")
    for index in range(1, partitions):
        _whole_part(directory, index, partitions)
    return partitions


def _whole_part(directory: str, index: int, partitions: int) -> tuple[Path, bytes, int]:
    """A part's path, chunks and record count, once it is known to be part `index` of
    `partitions`."""
    path, body, (found_index, found_partitions, count) = _checked_part(directory, index)
    if (found_index, found_partitions) != (index, partitions):
        raise TornFileError(
            f"{path}: part {found_index} of {found_partitions}, expected {index} of {partitions}"
        )
    return path, body, count


def _checked_part(directory: str, index: int) -> tuple[Path, bytes, tuple[int, int, int]]:
    """A part file's chunks and its trailer's index, partitions and count, once its checksum
    matches."""
    path = part_path(directory, index)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TornFileError(f"{path}: missing") from None
    except OSError as error:
        raise TornFileError(f"{path}: unreadable ({error})") from None
    if len(data) < len(MAGIC) + _TRAILER.size or not data.startswith(MAGIC):
        raise TornFileError(f"{path}: not a whole part ({len(data)} bytes)")
    body = data[len(MAGIC) : -_TRAILER.size]
    found_index, found_partitions, crc, count = _TRAILER.unpack(data[-_TRAILER.size :])
    if zlib.crc32(body) != crc:
        raise TornFileError(f"{path}: checksum mismatch")
    return path, body, (found_index, found_partitions, count)


def missing_parts(directory: str, partitions: int) -> list[int]:
    return [i for i in range(partitions) if not part_path(directory, i).exists()]


@dataclass(frozen=True)
class PartReader:
    """The task side of reading a durable batch back: partition i is part i.

    Its input, an empty partition that only gives the RDD its partitioner, is read to its end
    all the same. A PySpark worker whose task left input unread finds no end-of-stream mark
    after it, tells the JVM not to reuse it and exits: every task that subtracted a durable
    batch then started a fresh Python worker (in a window's steady state, one per task of
    every batch; docs/fault-tolerance.md, "Executor loss under load", gives the cost, and
    bench/results/2026-11-26-recovery.md, "The durable reader killed its Python workers", the
    runs)."""

    directory: str
    partitions: int

    def __call__(self, index: int, nothing: Iterable[Any]) -> list[Any]:
        deque(nothing, maxlen=0)
        return read_part(self.directory, index, self.partitions)


def part_write_failure(error: BaseException) -> CheckpointWriteError | None:
    """The CheckpointWriteError behind a failed job when a task could not write its durable
    part: it reaches the driver only as text in Spark's error (which a sink may wrap again),
    and the checkpoint file that storage refused says more than the output whose task broke."""
    message = raised_in_task(error, CheckpointWriteError)
    found = _PART_NOT_WRITTEN.match(message) if message is not None else None
    return CheckpointWriteError(None, found.group(2), found.group(1)) if found else None
