"""A partition's state store in a task: opened at the version the batch starts from, committed at
the batch's version. What runs here runs in the executors' Python workers.

Opening is quick when this executor holds the partition at that version (RocksDB: its local
directory; memory: this worker process). When it holds an older version on the same line (a
memory store in a worker that did not run the partition's last tasks), the store catches up by
the changelogs since. Otherwise the version is loaded from the checkpoint, the newest usable
snapshot and the changelogs after it (versions.py). That is how a partition comes back after a
restart, an executor loss, a task that ran elsewhere last time, or a batch that runs again (the
store then holds that batch's own version, not the one before it).

Committing writes the changelog into the checkpoint first, then applies the changes locally: a
task that fails between the two leaves the local store at its old version, which the batch's
next attempt starts from. Every `snapshotInterval` versions (the driver counts them) the task
also writes a snapshot and prunes what no load can need any more; a snapshot that cannot be
written is logged and tried again at the next interval: the changelogs still hold everything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dstream.runtime.state.store import KeyedStore, MemoryStore, StateStoreError, Version
from dstream.runtime.state.versions import PartitionVersions, SnapshotFile

log = logging.getLogger(__name__)

STORE_KEY = "spark.dstream.state.store"
MEMORY_MB_KEY = "spark.dstream.state.memoryMB"
SNAPSHOT_INTERVAL_KEY = "spark.dstream.state.snapshotInterval"
LOCAL_DIR_KEY = "spark.dstream.state.localDir"
KINDS = ("memory", "rocksdb")
# How long a task waits for another process of its executor to release a RocksDB directory
# (a speculative or retried attempt of the same partition that is still running).
LOCK_WAIT_S = 60.0
_SHARED = "shared.json"


@dataclass(frozen=True)
class StoreSettings:
    """The state store a job's keyed state lives in: `kind` (memory or rocksdb), the memory in MB
    the RocksDB stores a Python worker opens share, the versions between snapshots, and the local
    directory (default: the executor's Spark local directory)."""

    kind: str = "memory"
    memory_mb: int = 64
    snapshot_interval: int = 10
    local_dir: str | None = None

    @classmethod
    def from_conf(cls, get: Callable[[str], str | None]) -> StoreSettings:
        """From a SparkConf's `get`; a wrong value is a ValueError naming the key."""
        kind = (get(STORE_KEY) or cls.kind).strip()
        if kind not in KINDS:
            raise ValueError(f"{STORE_KEY}: {kind!r} is not one of {', '.join(KINDS)}")
        return cls(
            kind,
            _positive(get, MEMORY_MB_KEY, cls.memory_mb),
            _positive(get, SNAPSHOT_INTERVAL_KEY, cls.snapshot_interval),
            get(LOCAL_DIR_KEY) or None,
        )


def _positive(get: Callable[[str], str | None], key: str, default: int) -> int:
    text = get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{key}: {text!r} is not a positive whole number")
    return value


@dataclass(frozen=True)
class PartitionPlace:
    """Where one partition of one stream's store lives: `root` is the stream's directory in the
    checkpoint; its local directory is named after it, so jobs sharing an executor keep apart."""

    settings: StoreSettings
    root: str
    partition: int

    @property
    def versions(self) -> PartitionVersions:
        return PartitionVersions(Path(self.root) / str(self.partition))

    @property
    def local(self) -> Path:
        digest = hashlib.sha256(self.root.encode()).hexdigest()[:16]
        return _local_root(self.settings) / digest / str(self.partition)


def _local_root(settings: StoreSettings) -> Path:
    if settings.local_dir:
        base = settings.local_dir
    else:
        spark_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
        base = spark_dirs.split(",")[0] if spark_dirs else tempfile.gettempdir()
    return Path(base) / "dstream-state"


# A worker's memory stores, by (stream directory, partition).
_MEMORY: dict[tuple[str, int], MemoryStore] = {}


def open_store(place: PartitionPlace, version: Version | None) -> KeyedStore:
    """The partition's store at `version` (None: empty, the stream's first batch), with
    nothing pending. StateStoreError when the version cannot be loaded."""
    if place.settings.kind == "memory":
        store = _open_memory(place, version)
    else:
        store = _open_rocksdb(place, version)
    store.discard()
    return store


def _open_memory(place: PartitionPlace, version: Version | None) -> MemoryStore:
    key = (place.root, place.partition)
    held = _MEMORY.pop(key, None)
    if version is None:
        store = MemoryStore()
    elif held is not None and held.version == version:
        store = held
    else:
        scratch = place.local.with_name(f"{place.partition}.loading-{uuid.uuid4().hex}")
        try:
            restored = place.versions.restore(version, "memory", scratch, _version_of(held))
            if restored.held:
                assert held is not None
                store = held
                store.discard()
            elif restored.directory is not None:
                store = MemoryStore.load_snapshot(scratch)
            else:
                store = MemoryStore()
            for changelog in restored.changelogs:
                store.apply(changelog.changes, changelog.version)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    _MEMORY[key] = store
    return store


def _open_rocksdb(place: PartitionPlace, version: Version | None) -> KeyedStore:
    from dstream.runtime.state.rocks import RocksDBStore

    local, memory_mb = place.local, place.settings.memory_mb
    database = local / "db"
    if version is None:
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True)
        _write_shared(local, {})
        return RocksDBStore(database, memory_mb)
    held = _open_waiting(database, memory_mb) if database.exists() else None
    if held is not None and held.version == version:
        return held
    loading = local.with_name(f"{place.partition}.loading-{uuid.uuid4().hex}")
    try:
        restored = place.versions.restore(version, "rocksdb", loading, _version_of(held))
        if restored.held:
            assert held is not None
            store = held
            store.discard()
        else:
            if held is not None:
                held.close()
                held = None
            shutil.rmtree(local, ignore_errors=True)
            local.mkdir(parents=True)
            if restored.directory is not None:
                loading.rename(database)
            store = RocksDBStore(database, memory_mb)
            _write_shared(local, restored.files)
        for changelog in restored.changelogs:
            store.apply(changelog.changes, changelog.version)
        return store
    except BaseException:
        if held is not None:
            held.close()
        raise
    finally:
        shutil.rmtree(loading, ignore_errors=True)


def _version_of(store: KeyedStore | None) -> Version | None:
    return store.version if store is not None else None


def _open_waiting(database: Path, memory_mb: int) -> KeyedStore:
    """The RocksDB at `database`, waiting while another process of this executor holds it."""
    from dstream.runtime.state.rocks import RocksDBStore

    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return RocksDBStore(database, memory_mb)
        except StateStoreError as error:
            if "lock" not in str(error).lower() or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def commit_version(
    store: KeyedStore,
    place: PartitionPlace,
    version: Version,
    parent: Version | None,
    snapshot: bool,
) -> int:
    """Write the store's pending changes as the changelog of `version`, then apply them, then
    (when `snapshot`) snapshot it; the changelog's bytes. CheckpointWriteError when the
    checkpoint refuses the changelog: the store stays at its old version."""
    written = place.versions.write_changelog(version, parent, store.pending)
    store.commit(version)
    if snapshot:
        try:
            _snapshot(store, place, version)
        except (OSError, StateStoreError) as error:
            log.warning(
                "state snapshot of %s at version %s not written (%s): the changelogs hold the "
                "state; the next interval tries again",
                place.versions.directory,
                version.time_ms,
                error,
            )
    return written


def _snapshot(store: KeyedStore, place: PartitionPlace, version: Version) -> None:
    """Snapshot the committed store into the checkpoint, copying only files it lacks, then prune
    the versions no load needs any more."""
    local = place.local
    staging = local.with_name(f"{place.partition}.snapshot-{version.token}")
    shared = _read_shared(local) if place.settings.kind == "rocksdb" else {}
    try:
        store.save_snapshot(staging)
        immutable = _immutable(place.settings.kind)
        files = place.versions.write_snapshot(
            version, place.settings.kind, staging, shared, immutable
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if place.settings.kind == "rocksdb":
        _write_shared(local, files)
    place.versions.prune(version.time_ms)


def _immutable(kind: str) -> tuple[str, ...]:
    if kind != "rocksdb":
        return ()
    from dstream.runtime.state.rocks import IMMUTABLE_SUFFIXES

    return IMMUTABLE_SUFFIXES


def _read_shared(local: Path) -> dict[str, SnapshotFile]:
    """The files the local RocksDB shares with its newest snapshot in the checkpoint (none when
    unknown: the next snapshot then copies every file)."""
    try:
        entries = json.loads((local / _SHARED).read_text())
        return {entry["name"]: SnapshotFile(**entry) for entry in entries}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write_shared(local: Path, files: dict[str, SnapshotFile]) -> None:
    try:
        (local / _SHARED).write_text(json.dumps([vars(f) for f in files.values()]))
    except OSError as error:
        log.warning("cannot record the files of %s's snapshot (%s)", local, error)
