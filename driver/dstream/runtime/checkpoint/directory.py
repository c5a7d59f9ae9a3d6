"""The checkpoint directory: graph metadata, the batch log, commit markers and state checkpoints.

Layout under the checkpoint path:
    metadata.json           zero time, the pickled DStream graph with its signature, and the
                            SparkContext's settings; written when a run starts (.bk: previous)
    log/batch-<ms>.json     the input ranges of a batch, written before the batch runs
    log/commit-<ms>.json    written once the batch's output jobs succeeded; lists the state
                            checkpoints that batch made and the state store versions it wrote
                            (a batch skipped under failurePolicy onExhausted: skip is
                            committed with its error and skipped ranges, so a restart does not
                            re-run it)
    epochs/epoch-<n>.json   the drivers that led the checkpoint, one claim each (fencing.py);
                            every record and commit carries its writer's epoch
    state/                  Spark's reliable RDD checkpoints (sc.setCheckpointDir), and
                            windows' durable batch reductions beside them (durable.py)
    stores/                 state stores' changelogs and snapshots, per stream and partition
                            (runtime/state/versions.py)
    deadletter/             malformed input records, per batch
Every file is written to a temporary name, fsynced and renamed, and carries a checksum, so a
crash mid-write leaves either the old state or a file that is detected as torn and ignored; a
write the storage refuses (read-only, full) raises CheckpointWriteError and leaves no part behind.
Batch records and commit markers are created exclusively (linked to their name, never renamed
over one), so a record, once written, is the batch's for good, whichever driver wrote it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstream.runtime.checkpoint.files import (
    TornFileError,
    canonical_json,
    create_exclusively,
    local_path,
    read_document,
    wrapped_document,
    write_document,
)

if TYPE_CHECKING:
    from dstream.runtime.leadership.fencing import Fence

log = logging.getLogger(__name__)

_BATCH_FILE = re.compile(r"^batch-(\d+)\.json$")
_COMMIT_FILE = re.compile(r"^commit-(\d+)\.json$")
_TEMP_FILE = re.compile(r"^\..+\.tmp-\d+$")
# Signature keys a restarted program may change: they decide when state is checkpointed, not
# what it holds, so a checkpoint written with another interval restores just as well.
_TUNABLE_SIGNATURE_KEYS = frozenset({"checkpointMs"})
# 1: zero time, batch interval, graph signature. 2: adds the pickled graph and Spark settings.
# A version-1 checkpoint still recovers, by running the program's setup (there is no graph).
METADATA_VERSION = 2
_CRC_MAGIC = b"crc\0"
_CHUNKS_PER_READ = 2048
# Another run's empty state directory younger than this may be a driver's that is starting.
_FRESH_RUN_DIR_S = 60.0


class LogConflictError(RuntimeError):
    """A batch record or commit marker that this driver was about to create exists already,
    with other content: written by a deposed driver in the moment between its last fence check
    and its write. The run stops; a restart recovers from the log, which that file is now part
    of."""


class CheckpointMismatchError(RuntimeError):
    """The checkpoint was written by a different streaming graph than the one being started."""


class CheckpointUnrecoverableError(RuntimeError):
    """The checkpoint lost what exact recovery needs (a batch record, or every state checkpoint
    of a stream after the log was pruned); going on would silently change the results."""


@dataclass
class LogState:
    """What a restarting driver learns from the log."""

    records: dict[int, dict[str, Any]] = field(default_factory=dict)
    commits: dict[int, dict[str, Any]] = field(default_factory=dict)
    torn: list[str] = field(default_factory=list)

    @property
    def pending(self) -> list[int]:
        """Batches that were planned but never committed: they are re-run with the same input."""
        return sorted(t for t in self.records if t not in self.commits)

    @property
    def newest_epoch(self) -> int:
        """The newest epoch an entry was written under (0: none, or written before epochs)."""
        entries = [*self.records.values(), *self.commits.values()]
        return max((entry.get("epoch", 0) for entry in entries), default=0)

    @property
    def last_time(self) -> int | None:
        return max(self.records) if self.records else None

    def store_versions(self) -> dict[str, tuple[dict[str, Any], int]]:
        """Per state store stream, the version its newest commit lists, and how many versions
        its commits list after the last that was snapshot (all it lists, when none was)."""
        found: dict[str, tuple[dict[str, Any], int]] = {}
        since: dict[str, int] = {}
        snapshot_seen: set[str] = set()
        for time_ms in sorted(self.commits, reverse=True):
            for stream, listing in self.commits[time_ms].get("stores", {}).items():
                found.setdefault(stream, (listing, 0))
                if stream not in snapshot_seen:
                    if listing.get("snapshot"):
                        snapshot_seen.add(stream)
                    else:
                        since[stream] = since.get(stream, 0) + 1
        return {stream: (listing, since.get(stream, 0)) for stream, (listing, _) in found.items()}

    def state_checkpoints(self) -> dict[str, list[tuple[int, str]]]:
        """Per stateful stream, its committed checkpoints (time, path), newest first."""
        found: dict[str, list[tuple[int, str]]] = {}
        for time_ms in sorted(self.commits, reverse=True):
            for stream, entry in self.commits[time_ms].get("state", {}).items():
                found.setdefault(stream, []).append((entry["time"], entry["path"]))
        return found


class CheckpointDir:
    """Reads and writes one job's checkpoint directory."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.log_dir = self.path / "log"
        self.state_dir = self.path / "state"
        self.deadletter_dir = self.path / "deadletter"

    def exists(self) -> bool:
        return (self.path / "metadata.json").exists()

    def read_metadata(self) -> dict[str, Any] | None:
        meta = self.path / "metadata.json"
        if not meta.exists():
            return None
        try:
            metadata = read_document(meta)
        except TornFileError as torn:
            backup = self.path / "metadata.json.bk"
            log.warning("checkpoint metadata torn; using the backup %s", backup)
            try:
                metadata = read_document(backup)
            except (TornFileError, FileNotFoundError) as error:
                raise CheckpointUnrecoverableError(
                    f"checkpoint metadata is torn and so is its backup: {torn}; {error}"
                ) from None
        version = metadata.get("version", 1)
        if version > METADATA_VERSION:
            raise CheckpointMismatchError(
                f"checkpoint {self.path} has metadata version {version}; this dstream reads "
                f"up to {METADATA_VERSION}: run it with the newer dstream that wrote it"
            )
        return metadata

    def write_metadata(self, metadata: dict[str, Any]) -> None:
        write_document(self.path / "metadata.json.bk", metadata)
        write_document(self.path / "metadata.json", metadata)

    def write_batch(self, time_ms: int, record: dict[str, Any], fence: Fence | None = None) -> None:
        """Create the batch's record, under the fence's epoch (0 without one)."""
        self._create_entry(f"batch-{time_ms}.json", time_ms, record, "batch-record-write", fence)

    def write_commit(
        self, time_ms: int, commit: dict[str, Any], fence: Fence | None = None
    ) -> None:
        """Create the batch's commit marker, under the fence's epoch (0 without one)."""
        self._create_entry(f"commit-{time_ms}.json", time_ms, commit, "commit-write", fence)

    def _create_entry(
        self, name: str, time_ms: int, body: dict[str, Any], fault: str, fence: Fence | None
    ) -> None:
        """Check the fence (DeposedError when a newer epoch leads), then create the log entry
        exclusively. An entry that exists already with this very content is an earlier attempt
        of this driver whose write went through; with other content, it is a newer driver's
        (DeposedError) or a deposed one's (LogConflictError)."""
        document = {"time": time_ms, **body, "epoch": fence.epoch if fence else 0}
        if fence is not None:
            fence.check()
        path = self.log_dir / name
        try:
            create_exclusively(path, wrapped_document(document), fault)
        except FileExistsError:
            existing = read_document(path)
            if canonical_json(existing) == canonical_json(json.loads(json.dumps(document))):
                return
            if fence is not None:
                fence.check()
            raise LogConflictError(
                f"{path} exists already, written under epoch {existing.get('epoch', 0)}: "
                "another driver wrote this batch; restart to recover from the log"
            ) from None

    def load_log(self, tidy: bool = True) -> LogState:
        """Every readable record and commit; torn files are reported and skipped, and deleted
        with the temporary files of writers that crashed when `tidy` (a standby following the
        log while the leader writes it leaves them be)."""
        state = LogState()
        if not self.log_dir.exists():
            return state
        for entry in sorted(self.log_dir.iterdir()):
            if tidy and _TEMP_FILE.match(entry.name):
                entry.unlink(missing_ok=True)  # a writer that crashed before its rename
            for pattern, target in ((_BATCH_FILE, state.records), (_COMMIT_FILE, state.commits)):
                match = pattern.match(entry.name)
                if not match:
                    continue
                try:
                    target[int(match.group(1))] = read_document(entry)
                except FileNotFoundError:
                    continue  # pruned by the leader since the listing
                except TornFileError as error:
                    log.warning("ignoring torn checkpoint file: %s", error)
                    state.torn.append(entry.name)
                    if tidy:
                        entry.unlink(missing_ok=True)
        return state

    def prune(
        self,
        keep_from_ms: int,
        keep_state_paths: set[str],
        current_run: str | None,
        others_before: float = math.inf,
    ) -> None:
        """Drop log entries older than keep_from_ms and state checkpoints no longer in force.

        `current_run` is this SparkContext's checkpoint directory: only there can a checkpoint
        still be in the middle of being written (earlier runs' leftovers are simply dropped).
        Another run's checkpoint goes only if it was written before `others_before`, the
        pruning driver's claim of its epoch: whatever a newer leader wrote is newer, and a
        driver deposed in the middle of a prune, frozen and thawed, must not delete it."""
        if self.log_dir.exists():
            for entry in self.log_dir.iterdir():
                match = _BATCH_FILE.match(entry.name) or _COMMIT_FILE.match(entry.name)
                if match and int(match.group(1)) < keep_from_ms:
                    entry.unlink(missing_ok=True)
        if not self.state_dir.exists():
            return
        keep = {local_path(p) for p in keep_state_paths}
        running = local_path(current_run) if current_run else None
        for run_dir in self.state_dir.iterdir():
            resolved = run_dir.resolve()  # once: the checkpoints in it are not links
            this_run = resolved == running
            for rdd_dir in run_dir.glob("rdd-*"):
                if resolved / rdd_dir.name in keep or (this_run and _being_written(rdd_dir)):
                    continue
                if not this_run and not _written_before(rdd_dir, others_before):
                    continue
                shutil.rmtree(rdd_dir, ignore_errors=True)
            if not this_run and _abandoned(run_dir):
                run_dir.rmdir()

    def prune_after_commit(
        self,
        keep_from_ms: int,
        keep_state_paths: set[str],
        current_run: str | None,
        fence: Fence | None,
    ) -> None:
        """Prune (as `prune`) once a batch committed, under the fence it committed with: a
        driver deposed since leaves the newer leader's files alone, and storage that refuses
        a deletion only delays it to a later commit."""
        if fence is not None and fence.superseded():
            return
        claimed_at = math.inf if fence is None else fence.claimed_at
        try:
            self.prune(keep_from_ms, keep_state_paths, current_run, claimed_at)
        except OSError as error:
            log.warning("pruning the checkpoint failed (%s); the next commit tries again", error)

    def move_aside(self, suffix: str) -> Path:
        """Rename the whole directory out of the way (start fresh without destroying data)."""
        target = self.path.with_name(f"{self.path.name}.{suffix}")
        os.replace(self.path, target)
        return target


def move_checkpoint_aside(path: str | Path) -> Path | None:
    """Start fresh without destroying data: rename the old checkpoint to `<path>.old-<time>`."""
    directory = CheckpointDir(path)
    if not directory.path.exists():
        return None
    moved = directory.move_aside(f"old-{int(time.time())}")
    log.warning("moved the previous checkpoint %s to %s", directory.path, moved)
    return moved


def verify_state_checkpoint(uri: str) -> bool:
    """Verify a Spark reliable checkpoint in the driver, from the `.crc` Hadoop's local file
    system keeps beside each part: the parts numbered from 0 without a gap, each as long as its
    `.crc` covers (Hadoop's reader checks the chunks it reads, not that none is missing, so a
    part cut at a chunk boundary would read back as fewer records), and each chunk's CRC-32 as
    recorded. True when every part was verified so; False where Spark must read the checkpoint
    through to verify it (parts without a `.crc`, another file system). TornFileError when a
    part fails. Done here, a restarted driver's restore need not wait for its executors."""
    if not uri.startswith(("file:", "/")):
        return False
    parts = sorted(local_path(uri).glob("part-*"))
    if not parts:
        return False
    for index, part in enumerate(parts):
        if part.name != f"part-{index:05d}":
            raise TornFileError(f"{part}: expected part-{index:05d}, a part is missing")
        sums = _crc_sums(part.with_name(f".{part.name}.crc"))
        if sums is None:
            return False
        _check_chunks(part, *sums)
    return True


def _check_chunks(part: Path, chunk: int, sums: bytes) -> None:
    """TornFileError unless `part` has as many `chunk`-byte chunks as `sums` holds CRCs, each
    matching. Read a block at a time: a state part can be larger than the driver's memory
    should hold (the check takes about 1 s per GB on one core)."""
    size = part.stat().st_size
    if -(-size // chunk) != len(sums) // 4:
        raise TornFileError(f"{part}: {size} bytes, its .crc covers {len(sums) // 4} chunks")
    index = 0
    with open(part, "rb") as data:
        while block := data.read(chunk * _CHUNKS_PER_READ):
            view = memoryview(block)
            for start in range(0, len(block), chunk):
                recorded = int.from_bytes(sums[index * 4 : index * 4 + 4], "big")
                if zlib.crc32(view[start : start + chunk]) != recorded:
                    raise TornFileError(f"{part}: chunk {index} fails its checksum")
                index += 1


def _crc_sums(path: Path) -> tuple[int, bytes] | None:
    """(bytes per chunk, a CRC-32 per chunk) of a Hadoop `.crc` file: magic, chunk size, the
    CRCs. None without a readable one (Spark's read then judges the part)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    chunk = int.from_bytes(data[4:8], "big")
    if len(data) < 8 or data[:4] != _CRC_MAGIC or chunk <= 0:
        return None
    return chunk, data[8:]


def _abandoned(run_dir: Path) -> bool:
    """An empty state directory of another run, left alone for a while. A driver starting beside
    the leader (a standby, or the next pod while the old one still stops) makes its own with
    Spark's `setCheckpointDir`, which creates it empty and sets its permissions after: removed
    in between, that driver's start failed (`chmod: cannot access ...`). Once it is older, its
    removal costs a live driver nothing: Spark makes the directory again when it first writes a
    checkpoint there."""
    try:
        return (
            not any(run_dir.iterdir()) and time.time() - run_dir.stat().st_mtime > _FRESH_RUN_DIR_S
        )
    except FileNotFoundError:  # another driver's prune removed it meanwhile
        return False


def _written_before(rdd_dir: Path, moment: float) -> bool:
    """Whether the checkpoint's directory last changed before `moment` (False once gone)."""
    try:
        return rdd_dir.stat().st_mtime < moment
    except FileNotFoundError:
        return False


def _being_written(rdd_dir: Path) -> bool:
    """Spark writes each checkpoint part as `.part-N-attempt-M` and renames it when done (the
    `.crc` files beside finished parts are Hadoop's checksums, not work in progress)."""
    return any("-attempt-" in p.name for p in rdd_dir.iterdir())


def compare_signatures(saved: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[str]:
    """Human-readable differences between two graph signatures (empty when compatible)."""
    differences = []
    if len(saved) != len(current):
        differences.append(f"the checkpoint has {len(saved)} streams, the program {len(current)}")
    for index, (old, new) in enumerate(zip(saved, current, strict=False)):
        for key in sorted((set(old) | set(new)) - _TUNABLE_SIGNATURE_KEYS):
            if old.get(key) != new.get(key):
                differences.append(
                    f"stream #{index} ({new.get('kind', '?')}): {key} was {old.get(key)!r}, "
                    f"now {new.get(key)!r}"
                )
    return differences
