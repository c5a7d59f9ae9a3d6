"""Checkpoint files that are whole or detected as torn: written to a temporary sibling, fsynced
and placed by a rename (replacing) or a hard link (created only if absent), JSON documents
wrapped with the sha256 of their body, and the fault points the crash tests kill at.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

FAULT_INJECT_ENV = "DSTREAM_FAULT_INJECT"
_fault_arrivals: dict[str, int] = {}
_COPY_BLOCK = 1 << 20


def fault_point(name: str) -> None:
    """Test hook for the fault suite: DSTREAM_FAULT_INJECT=<name>:<n> SIGKILLs this process the
    n-th time it reaches `name`, so a crash can land exactly there. A no-op when unset."""
    wanted = os.environ.get(FAULT_INJECT_ENV)
    if not wanted or wanted.partition(":")[0] != name:
        return
    _fault_arrivals[name] = _fault_arrivals.get(name, 0) + 1
    if _fault_arrivals[name] == int(wanted.partition(":")[2] or 1):
        log.warning("%s=%s: killing this process", FAULT_INJECT_ENV, wanted)
        os.kill(os.getpid(), signal.SIGKILL)


class TornFileError(ValueError):
    """A checkpoint file that is truncated, corrupt or fails its checksum."""


class CheckpointWriteError(OSError):
    """A checkpoint file the storage refused to write (read-only, full, unmounted): the errno,
    the OS's message and the file's own name (not its temporary one's)."""

    def __str__(self) -> str:
        return f"cannot write checkpoint file {self.filename}: {self.strerror}"


def write_atomically(path: Path, data: bytes, fault: str | None = None) -> None:
    """Write to a temporary sibling, fsync, rename over `path`, fsync the directory; `fault`
    names the spot between the temporary file and its rename for fault_point.

    Storage that refuses the write (read-only, full, gone) raises CheckpointWriteError after
    the temporary file is removed, so `path` keeps its previous content or, when only the
    directory sync failed, the complete new one: never a part."""
    _write_then_place(path, lambda out: out.write(data), fault, os.replace)


def create_exclusively(path: Path, data: bytes, fault: str | None = None) -> None:
    """As write_atomically, but `path` must not exist yet: the temporary file is hard-linked to
    its name, which fails with FileExistsError when the name is taken (a link, atomic on local
    file systems and NFS alike, never replaces a file as a rename does)."""
    _write_then_place(path, lambda out: out.write(data), fault, os.link)


def copy_atomically(source: Path, path: Path, fault: str | None = None) -> int:
    """Copy the file `source` to `path` as write_atomically writes, a block at a time (a file
    may be larger than memory should hold); the CRC-32 of what was copied. A `source` that
    cannot be opened raises its OSError, a `path` that cannot be written CheckpointWriteError."""
    crc = 0

    def copy(out: BinaryIO) -> None:
        nonlocal crc
        while block := data.read(_COPY_BLOCK):
            crc = zlib.crc32(block, crc)
            out.write(block)

    with open(source, "rb") as data:
        _write_then_place(path, copy, fault, os.replace)
    return crc


def _write_then_place(
    path: Path,
    write: Callable[[BinaryIO], object],
    fault: str | None,
    place: Callable[[Path, Path], None],
) -> None:
    """`write` a temporary sibling, fsync it, `place` it at `path` (a rename or a link), fsync
    the directory; the temporary file is gone afterwards, whatever happened."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        if fault:
            fault_point(fault)
        place(tmp, path)
        _fsync_directory(path.parent)
    except FileExistsError:
        raise
    except OSError as error:
        raise CheckpointWriteError(error.errno, error.strerror or str(error), str(path)) from error
    finally:
        with contextlib.suppress(OSError):  # read-only: it was never created
            tmp.unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_document(path: Path, document: dict[str, Any], fault: str = "document-write") -> None:
    """A JSON document wrapped with the sha256 of its canonical body, written atomically."""
    write_atomically(path, wrapped_document(document), fault)


def canonical_json(document: dict[str, Any]) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def wrapped_document(document: dict[str, Any]) -> bytes:
    digest = hashlib.sha256(canonical_json(document).encode()).hexdigest()
    return json.dumps({"sha256": digest, "body": document}).encode()


def read_document(path: Path) -> dict[str, Any]:
    """The body of a document written by write_document; TornFileError if it does not verify."""
    try:
        wrapper = json.loads(path.read_bytes())
        body = wrapper["body"]
        digest = wrapper["sha256"]
    except (ValueError, KeyError, TypeError) as error:
        raise TornFileError(f"{path}: unreadable ({error})") from None
    if hashlib.sha256(canonical_json(body).encode()).hexdigest() != digest:
        raise TornFileError(f"{path}: checksum mismatch")
    return body


def local_path(uri: str) -> Path:
    """A local path (a checkpoint's, an output's) from the `file:` URI Spark gives, or a plain
    path."""
    return Path(uri.removeprefix("file:")).resolve()
