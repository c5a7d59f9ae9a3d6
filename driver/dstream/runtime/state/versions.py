"""A partition's state in the job's checkpoint, by what changed: one changelog per version (that
batch's puts and deletes), a snapshot every so many versions, and loading a version back as the
newest usable snapshot plus the changelogs after it.

Layout, under the stream's directory `<checkpoint>/stores/<stream>/<partition>/`:
    changelog-<ms>          the changes of the version of batch time <ms>: a header (version,
                            token, parent version, change count), the changes in pickled
                            chunks, and a CRC-32 of all before it
    snapshot-<ms>.json      a snapshot's manifest (a checksummed document): the store's kind
                            and its files, each with its size and CRC-32
    files/                  the snapshots' files, each under a name of its own: a file that
                            never changes (a RocksDB table) is shared by later snapshots
Every file is written to a temporary name, fsynced and renamed (runtime/checkpoint/files.py), so
a crash leaves none or a whole one; a file cut short or altered later fails its checksum. A
version names its parent, so a version is loaded by walking back from it to a snapshot; a torn
or missing snapshot is passed over for an older one (with a log line), and a torn or missing
changelog that no later snapshot covers is a StateStoreError naming it: never a silent gap.
"""

from __future__ import annotations

import json
import logging
import pickle
import re
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from dstream.runtime.checkpoint.files import (
    TornFileError,
    copy_atomically,
    read_document,
    write_atomically,
    write_document,
)
from dstream.runtime.state.store import Changes, StateStoreError, Version

log = logging.getLogger(__name__)

MAGIC = b"dstream-changelog\x01"
_HEADER_LENGTH = struct.Struct(">I")
_CHUNK_LENGTH = struct.Struct(">Q")
_CRC = struct.Struct(">I")
_CHUNK = 4096
_CHANGELOG = re.compile(r"^changelog-(\d+)$")
_SNAPSHOT = re.compile(r"^snapshot-(\d+)\.json$")
_BLOCK = 1 << 20
# Snapshots kept: when the newest is torn, the one before it and the changelogs since serve.
SNAPSHOTS_KEPT = 2


@dataclass(frozen=True)
class SnapshotFile:
    """A file of a snapshot: its name in the store's directory, its name under files/, its size
    and CRC-32."""

    name: str
    stored: str
    size: int
    crc32: int


@dataclass(frozen=True)
class Changelog:
    version: Version
    parent: Version | None
    changes: Changes


class PartitionVersions:
    """The versions of one partition's state under `directory` in the checkpoint."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.files = directory / "files"

    def changelog_path(self, time_ms: int) -> Path:
        return self.directory / f"changelog-{time_ms}"

    def snapshot_path(self, time_ms: int) -> Path:
        return self.directory / f"snapshot-{time_ms}.json"

    # -- changelogs -----------------------------------------------------------------------

    def write_changelog(self, version: Version, parent: Version | None, changes: Changes) -> int:
        """Write the changes of `version` durably; the bytes written. CheckpointWriteError when
        the storage refuses (full, read-only): nothing is left half written."""
        header = json.dumps(
            {
                "time": version.time_ms,
                "token": version.token,
                "parent": None if parent is None else [parent.time_ms, parent.token],
                "count": len(changes),
            }
        ).encode()
        parts = [MAGIC, _HEADER_LENGTH.pack(len(header)), header]
        pairs = list(changes.items())
        for start in range(0, len(pairs), _CHUNK):
            chunk = pickle.dumps(pairs[start : start + _CHUNK], pickle.HIGHEST_PROTOCOL)
            parts += (_CHUNK_LENGTH.pack(len(chunk)), chunk)
        body = b"".join(parts)
        data = body + _CRC.pack(zlib.crc32(body))
        write_atomically(self.changelog_path(version.time_ms), data, "changelog-write")
        return len(data)

    def written_token(self, time_ms: int) -> str | None:
        """The token in the header of the changelog of `time_ms` (None: there is none, or its
        header is unreadable); the body is not checked."""
        try:
            with open(self.changelog_path(time_ms), "rb") as source:
                if source.read(len(MAGIC)) != MAGIC:
                    return None
                (length,) = _HEADER_LENGTH.unpack(source.read(_HEADER_LENGTH.size))
                return json.loads(source.read(length))["token"]
        except (OSError, ValueError, KeyError, struct.error):
            return None

    def read_changelog(self, time_ms: int) -> Changelog:
        """The changelog of `time_ms`, verified; TornFileError when it is missing, cut short or
        altered."""
        path = self.changelog_path(time_ms)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise TornFileError(f"{path}: missing") from None
        except OSError as error:
            raise TornFileError(f"{path}: unreadable ({error})") from None
        if len(data) < len(MAGIC) + _HEADER_LENGTH.size + _CRC.size or not data.startswith(MAGIC):
            raise TornFileError(f"{path}: not a whole changelog ({len(data)} bytes)")
        body, (crc,) = data[: -_CRC.size], _CRC.unpack(data[-_CRC.size :])
        if zlib.crc32(body) != crc:
            raise TornFileError(f"{path}: checksum mismatch")
        at = len(MAGIC)
        (length,) = _HEADER_LENGTH.unpack_from(body, at)
        at += _HEADER_LENGTH.size
        header = json.loads(body[at : at + length])
        at += length
        changes: Changes = {}
        while at < len(body):
            (size,) = _CHUNK_LENGTH.unpack_from(body, at)
            at += _CHUNK_LENGTH.size
            changes.update(pickle.loads(body[at : at + size]))
            at += size
        if len(changes) != header["count"]:
            raise TornFileError(
                f"{path}: {len(changes)} changes, its header says {header['count']}"
            )
        parent = header["parent"]
        return Changelog(
            Version(header["time"], header["token"]),
            None if parent is None else Version(*parent),
            changes,
        )

    # -- snapshots ------------------------------------------------------------------------

    def write_snapshot(
        self,
        version: Version,
        kind: str,
        local: Path,
        shared: dict[str, SnapshotFile],
        immutable: tuple[str, ...],
    ) -> dict[str, SnapshotFile]:
        """Copy the snapshot in the local directory `local` into the checkpoint and write its
        manifest; the files it lists by name. A file of an `immutable` kind found in `shared`
        (the files of the snapshot the store was loaded from or last wrote) with the same size
        is not copied again."""
        files: dict[str, SnapshotFile] = {}
        for path in sorted(local.iterdir()):
            size = path.stat().st_size
            known = shared.get(path.name)
            if path.name.endswith(immutable) and known is not None and known.size == size:
                files[path.name] = known
                continue
            stored = f"{version.time_ms}-{version.token[:12]}-{path.name}"
            crc = copy_atomically(path, self.files / stored, "snapshot-file-write")
            files[path.name] = SnapshotFile(path.name, stored, size, crc)
        manifest = {
            "time": version.time_ms,
            "token": version.token,
            "kind": kind,
            "files": [vars(f) for f in files.values()],
        }
        write_document(self.snapshot_path(version.time_ms), manifest, "snapshot-write")
        return files

    def read_snapshot(self, version: Version, kind: str, target: Path) -> dict[str, SnapshotFile]:
        """Copy the snapshot of `version` into the local directory `target` (which this
        creates), each file checked; its files by name. TornFileError when its manifest or a
        file is missing, cut short or altered, or it is another write's snapshot of that time."""
        manifest = read_document(self.snapshot_path(version.time_ms))
        if (manifest["time"], manifest["token"]) != (version.time_ms, version.token):
            raise TornFileError(f"{self.snapshot_path(version.time_ms)}: another write's snapshot")
        if manifest["kind"] != kind:
            raise StateStoreError(
                f"{self.snapshot_path(version.time_ms)} is a snapshot of a {manifest['kind']} "
                f"store, this job's store is {kind}"
            )
        target.mkdir(parents=True)
        files = {entry["name"]: SnapshotFile(**entry) for entry in manifest["files"]}
        for entry in files.values():
            source = self.files / entry.stored
            try:
                crc = copy_atomically(source, target / entry.name)
            except FileNotFoundError:
                raise TornFileError(f"{source}: missing") from None
            size = (target / entry.name).stat().st_size
            if (size, crc) != (entry.size, entry.crc32):
                raise TornFileError(
                    f"{source}: {size} bytes with CRC-32 {crc:08x}, its snapshot "
                    f"{self.snapshot_path(version.time_ms).name} says {entry.size} bytes, "
                    f"{entry.crc32:08x}"
                )
        return files

    def has_snapshot(self, time_ms: int) -> bool:
        return self.snapshot_path(time_ms).exists()

    # -- pruning --------------------------------------------------------------------------

    def prune(self, newest: int) -> None:
        """After a snapshot of `newest`: keep it and the SNAPSHOTS_KEPT - 1 before it with the
        changelogs after the oldest kept, and the files they list; drop the rest. Entries
        after `newest` (another write of a later batch) are left alone."""
        snapshots = sorted(t for t in self._times(_SNAPSHOT) if t <= newest)
        kept = snapshots[-SNAPSHOTS_KEPT:]
        if len(kept) < SNAPSHOTS_KEPT:
            return
        oldest = kept[0]
        for time_ms in snapshots[:-SNAPSHOTS_KEPT]:
            self.snapshot_path(time_ms).unlink(missing_ok=True)
        for time_ms in self._times(_CHANGELOG):
            if time_ms <= oldest:
                self.changelog_path(time_ms).unlink(missing_ok=True)
        listed = set()
        for time_ms in self._times(_SNAPSHOT):
            listed |= self._listed_files(time_ms)
        if self.files.exists():
            for path in self.files.iterdir():
                if path.name not in listed and not path.name.startswith("."):
                    path.unlink(missing_ok=True)

    def _listed_files(self, time_ms: int) -> set[str]:
        try:
            manifest = read_document(self.snapshot_path(time_ms))
        except (TornFileError, FileNotFoundError):
            return set()
        return {entry["stored"] for entry in manifest["files"]}

    def _times(self, pattern: re.Pattern[str]) -> list[int]:
        if not self.directory.exists():
            return []
        return [int(m.group(1)) for p in self.directory.iterdir() if (m := pattern.match(p.name))]

    # -- loading --------------------------------------------------------------------------

    def restore(
        self, target: Version, kind: str, scratch: Path, held: Version | None = None
    ) -> Restored:
        """What loading `target` takes. When the version a store `held` is on its line and
        the changelogs back to it are whole, those changelogs: the store catches up by what
        changed since. Else the newest usable snapshot on the line, copied into `scratch`
        (none: start empty), and the changelogs after it, oldest first. A torn snapshot is
        passed over for an older one, with a warning; a changelog that is needed and torn or
        missing is a StateStoreError."""
        if held is not None:
            since = self._changelogs_since(held, target)
            if since is not None:
                return Restored(None, None, {}, since, [], held=True)
        changelogs: list[Changelog] = []
        passed_over: list[str] = []
        wanted: Version | None = target
        while wanted is not None:
            if self.has_snapshot(wanted.time_ms):
                try:
                    files = self.read_snapshot(wanted, kind, scratch)
                    return Restored(wanted, scratch, files, changelogs[::-1], passed_over)
                except TornFileError as torn:
                    log.warning(
                        "state snapshot of version %s unusable (%s): loading an older one and "
                        "the changelogs after it instead",
                        wanted.time_ms,
                        torn,
                    )
                    passed_over.append(str(torn))
                    shutil.rmtree(scratch, ignore_errors=True)
            changelog = self._needed_changelog(wanted, target)
            changelogs.append(changelog)
            wanted = changelog.parent
        return Restored(None, None, {}, changelogs[::-1], passed_over)

    def _changelogs_since(self, held: Version, target: Version) -> list[Changelog] | None:
        """The changelogs from `held` (not included) to `target`, oldest first; None when
        `held` is not on target's line or one of them is not whole."""
        changelogs: list[Changelog] = []
        wanted: Version | None = target
        while wanted is not None and wanted.time_ms > held.time_ms:
            try:
                changelog = self.read_changelog(wanted.time_ms)
            except TornFileError:
                return None
            if changelog.version != wanted:
                return None
            changelogs.append(changelog)
            wanted = changelog.parent
        return changelogs[::-1] if wanted == held else None

    def _needed_changelog(self, wanted: Version, target: Version) -> Changelog:
        """The changelog of `wanted`, on the way back from `target`; StateStoreError when it is
        unreadable or another write's (nothing can stand in for it)."""
        try:
            changelog = self.read_changelog(wanted.time_ms)
        except TornFileError as torn:
            raise StateStoreError(
                f"cannot load the state of version {target.time_ms} from {self.directory}: "
                f"{torn}, and no usable snapshot after it"
            ) from None
        if changelog.version != wanted:
            raise StateStoreError(
                f"cannot load the state of version {target.time_ms} from {self.directory}: "
                f"{self.changelog_path(wanted.time_ms)} holds version "
                f"{changelog.version.time_ms} of write {changelog.version.token}, not write "
                f"{wanted.token}"
            )
        return changelog


@dataclass(frozen=True)
class Restored:
    """A version's way back from the checkpoint: its snapshot's version, local directory and
    files (None: none), the changelogs to apply after it, oldest first, the snapshots passed
    over as torn, and whether the changelogs apply to the version the store held (else, with
    no snapshot, to an empty store)."""

    snapshot: Version | None
    directory: Path | None
    files: dict[str, SnapshotFile]
    changelogs: list[Changelog]
    passed_over: list[str]
    held: bool = False
