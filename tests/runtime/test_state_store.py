"""The state store (dstream/runtime/state): one partition's keyed state at a version, in memory or
in a real RocksDB, checkpointed by what changed. A version written is loaded back the same
wherever the task runs next: from this executor's copy, or from the checkpoint's newest usable
snapshot and the changelogs after it; torn files are detected, a torn snapshot is passed over
for an older one, and a full disk fails the write clearly and loses nothing."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from dstream.runtime.checkpoint.files import CheckpointWriteError, read_document
from dstream.runtime.state import partition
from dstream.runtime.state.partition import (
    PartitionPlace,
    StoreSettings,
    commit_version,
    open_store,
)
from dstream.runtime.state.store import StateStoreError, Version
from fault.harness import fill_up, tmpfs

KINDS = ["memory", "rocksdb"]


def place_of(
    tmp_path: Path, kind: str, interval: int = 100, name: str = "stores"
) -> PartitionPlace:
    settings = StoreSettings(
        kind, memory_mb=8, snapshot_interval=interval, local_dir=str(tmp_path / "local")
    )
    return PartitionPlace(settings, str(tmp_path / "checkpoint" / name / "0"), 3)


def forget_local(place: PartitionPlace) -> None:
    """What an executor's loss (or a task on another executor) takes: the local copy."""
    shutil.rmtree(place.local, ignore_errors=True)
    partition._MEMORY.pop((place.root, place.partition), None)


def key(i: int) -> bytes:
    return b"k%06d" % i


class Writer:
    """Commits versions 1000, 2000, ... of a partition, each from the one before, and keeps what
    the state must be after each."""

    def __init__(self, place: PartitionPlace):
        self.place = place
        self.version: Version | None = None
        self.expected: dict[bytes, bytes] = {}
        self.history: dict[Version, dict[bytes, bytes]] = {}

    def commit(self, changes: dict[bytes, bytes | None], snapshot: bool = False) -> Version:
        store = open_store(self.place, self.version)
        for k, v in changes.items():
            if v is None:
                store.delete(k)
            else:
                store.put(k, v)
        version = Version(
            (self.version.time_ms if self.version else 0) + 1000, f"token-{len(self.history)}"
        )
        commit_version(store, self.place, version, self.version, snapshot)
        store.close()
        for k, v in changes.items():
            if v is None:
                self.expected.pop(k, None)
            else:
                self.expected[k] = v
        self.version = version
        self.history[version] = dict(self.expected)
        return version


def contents(place: PartitionPlace, version: Version) -> dict[bytes, bytes]:
    store = open_store(place, version)
    try:
        assert store.version == version
        return dict(store.scan())
    finally:
        store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_versions_load_back_from_the_local_copy_and_from_the_checkpoint(tmp_path, kind):
    place = place_of(tmp_path, kind)
    writer = Writer(place)
    writer.commit({key(i): b"a%d" % i for i in range(500)})
    writer.commit({key(1): None, key(2): b"two", key(900): b"new"})
    last = writer.commit({key(3): None, key(2): None})
    assert contents(place, last) == writer.expected  # this executor's copy
    forget_local(place)
    assert contents(place, last) == writer.expected  # from the changelogs alone
    first = next(iter(writer.history))
    assert contents(place, first) == writer.history[first]  # an older version, on demand
    assert list(dict(contents(place, last))) == sorted(writer.expected)  # scans in key order


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_held_at_an_older_version_catches_up_by_the_changelogs_since(tmp_path, kind):
    """A memory store in a worker that did not run the partition's last tasks, or a RocksDB
    copy left behind, applies the changelogs after its version instead of loading it all."""
    place = place_of(tmp_path, kind)
    writer = Writer(place)
    writer.commit({key(i): b"a" for i in range(300)})
    old = writer.commit({key(1): b"b"}, snapshot=True)
    stale = tmp_path / "stale"
    if kind == "rocksdb":
        shutil.copytree(place.local, stale)
    held = partition._MEMORY.get((place.root, place.partition))
    held_copy = None if held is None else type(held)(dict(held._data), held.version)
    writer.commit({key(2): b"c"})
    last = writer.commit({key(3): None})
    forget_local(place)
    if kind == "rocksdb":
        shutil.copytree(stale, place.local)
    if held_copy is not None:
        partition._MEMORY[(place.root, place.partition)] = held_copy
    for name in ("changelog-1000", "changelog-2000", f"snapshot-{old.time_ms}.json"):
        (place.versions.directory / name).unlink()  # what it holds is not loaded again
    assert contents(place, last) == writer.expected


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_reads_its_pending_changes_and_a_failed_task_leaves_none_behind(tmp_path, kind):
    place = place_of(tmp_path, kind)
    writer = Writer(place)
    base = writer.commit({key(1): b"one"})
    store = open_store(place, base)
    store.put(key(1), b"changed")
    store.delete(key(7))
    assert (store.get(key(1)), store.get(key(7))) == (b"changed", None)
    assert dict(store.scan()) == {key(1): b"one"}  # a scan sees committed state only
    store.close()  # the task failed before its commit
    again = open_store(place, base)
    assert (again.get(key(1)), again.pending) == (b"one", {})
    again.close()
    with pytest.raises(ValueError, match="reserved"):
        open_store(place, base).put(b"\x00version", b"x")


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_written_again_is_loaded_from_its_own_write(tmp_path, kind):
    """A batch that ran, wrote its changelog and then ran again (its commit marker was never
    written) writes the same batch time under a new token: the local copy, at the first
    write, is not taken for the second."""
    place = place_of(tmp_path, kind)
    writer = Writer(place)
    base = writer.commit({key(1): b"one"})
    store = open_store(place, base)
    store.put(key(2), b"first attempt")
    commit_version(store, place, Version(2000, "attempt-1"), base, False)
    store.close()
    store = open_store(place, base)  # the local copy is at attempt 1: loaded again
    assert store.get(key(2)) is None
    store.put(key(2), b"second attempt")
    commit_version(store, place, Version(2000, "attempt-2"), base, False)
    store.close()
    forget_local(place)
    assert contents(place, Version(2000, "attempt-2")) == {
        key(1): b"one",
        key(2): b"second attempt",
    }
    with pytest.raises(
        StateStoreError, match="version 2000 of write attempt-2, not write attempt-1"
    ):
        open_store(place, Version(2000, "attempt-1"))


@pytest.mark.parametrize("kind", KINDS)
def test_snapshots_cut_the_changelogs_needed_and_prune_what_no_load_needs(tmp_path, kind):
    place = place_of(tmp_path, kind)
    writer = Writer(place)
    for batch in range(1, 8):
        changes = {key(batch * 100 + i): b"v%d" % batch for i in range(200)}
        changes[key(100 + batch)] = None
        writer.commit(changes, snapshot=batch % 3 == 0)
    directory = place.versions.directory
    names = sorted(p.name for p in directory.iterdir() if p.name != "files")
    # snapshots at 3000 and 6000 kept, changelogs after the older of them only
    assert names == [
        "changelog-4000",
        "changelog-5000",
        "changelog-6000",
        "changelog-7000",
        "snapshot-3000.json",
        "snapshot-6000.json",
    ]
    forget_local(place)
    assert contents(place, writer.version) == writer.expected


def test_a_rocksdb_snapshot_copies_only_the_table_files_the_checkpoint_lacks(tmp_path):
    place = place_of(tmp_path, "rocksdb")
    writer = Writer(place)
    first = writer.commit({key(i): os.urandom(200) for i in range(2000)}, snapshot=True)
    copied = {p.name: p.stat().st_size for p in place.versions.files.iterdir()}
    second = writer.commit({key(5): b"changed"}, snapshot=True)
    added = {
        p.name: p.stat().st_size for p in place.versions.files.iterdir() if p.name not in copied
    }
    tables = {name for name in copied if name.endswith(".sst")}
    listed = {
        entry["stored"]
        for entry in read_document(place.versions.snapshot_path(second.time_ms))["files"]
    }
    assert tables and tables <= listed  # the second snapshot lists the first one's tables
    assert all(name.startswith(f"{second.time_ms}-") for name in added)
    new_tables = sum(size for name, size in added.items() if name.endswith(".sst"))
    assert new_tables < sum(copied[name] for name in tables) / 10
    assert first.time_ms < second.time_ms
    forget_local(place)
    assert contents(place, writer.version) == writer.expected


@pytest.mark.parametrize("kind", KINDS)
def test_a_torn_changelog_is_detected_and_named(tmp_path, kind):
    place = place_of(tmp_path, kind)
    writer = Writer(place)
    writer.commit({key(1): b"one"})
    last = writer.commit({key(2): b"two"})
    path = place.versions.changelog_path(last.time_ms)
    path.write_bytes(path.read_bytes()[:-7])  # cut short, as a copy that stopped
    forget_local(place)
    with pytest.raises(StateStoreError, match=rf"{path}: .*no usable snapshot after it"):
        open_store(place, last)
    path.write_bytes(place.versions.changelog_path(1000).read_bytes())  # another version's
    with pytest.raises(
        StateStoreError, match="holds version 1000 of write token-0, not write token-1"
    ):
        open_store(place, last)


@pytest.mark.parametrize("kind", KINDS)
def test_a_torn_changelog_that_a_later_snapshot_covers_is_not_needed(tmp_path, kind):
    place = place_of(tmp_path, kind)
    writer = Writer(place)
    torn = writer.commit({key(1): b"one"})
    writer.commit({key(2): b"two"}, snapshot=True)
    last = writer.commit({key(3): b"three"})
    path = place.versions.changelog_path(torn.time_ms)
    path.write_bytes(b"garbage")
    forget_local(place)
    assert contents(place, last) == writer.expected


@pytest.mark.parametrize("kind", KINDS)
def test_a_torn_or_deleted_snapshot_falls_back_to_the_one_before_with_a_log_line(
    tmp_path, kind, caplog
):
    place = place_of(tmp_path, kind)
    writer = Writer(place)
    writer.commit({key(i): b"a" for i in range(300)}, snapshot=True)
    writer.commit({key(i): b"b" for i in range(100)})
    newest = writer.commit({key(7): None}, snapshot=True)
    last = writer.commit({key(8): b"c"})
    manifest = place.versions.snapshot_path(newest.time_ms)
    newest_files = {
        p for p in place.versions.files.iterdir() if p.name.startswith(f"{newest.time_ms}-")
    }
    victim = max(newest_files, key=lambda p: p.stat().st_size)
    victim.unlink()  # a snapshot file deleted
    forget_local(place)
    with caplog.at_level(logging.WARNING, logger="dstream.runtime.state.versions"):
        assert contents(place, last) == writer.expected
    assert f"state snapshot of version {newest.time_ms} unusable" in caplog.text
    assert f"{victim}: missing" in caplog.text
    manifest.write_bytes(manifest.read_bytes()[:40])  # the manifest itself torn
    forget_local(place)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dstream.runtime.state.versions"):
        assert contents(place, last) == writer.expected
    assert "unreadable" in caplog.text


@pytest.mark.parametrize("kind", KINDS)
def test_a_full_checkpoint_disk_fails_the_commit_clearly_and_loses_nothing(tmp_path, kind):
    checkpoint = tmp_path / "full"
    with tmpfs(checkpoint, size_kb=1024):
        settings = StoreSettings(kind, 8, 100, str(tmp_path / "local"))
        place = PartitionPlace(settings, str(checkpoint / "stores" / "0"), 0)
        writer = Writer(place)
        base = writer.commit({key(i): b"kept" for i in range(50)})
        filler = fill_up(checkpoint)
        store = open_store(place, base)
        for i in range(2000):
            store.put(key(i), b"y" * 200)
        with pytest.raises(
            CheckpointWriteError,
            match=r"cannot write checkpoint file .*changelog-2000: No space left",
        ):
            commit_version(store, place, Version(2000, "full"), base, False)
        store.close()
        assert store.version == base  # not applied locally either
        assert contents(place, base) == writer.expected
        assert not place.versions.changelog_path(2000).exists()
        filler.unlink()  # space again: the batch's next attempt goes through
        assert writer.commit({key(i): b"y" * 200 for i in range(2000)}) == Version(2000, "token-1")
        forget_local(place)
        assert contents(place, writer.version) == writer.expected


def test_a_snapshot_that_cannot_be_written_is_logged_and_the_changelog_still_holds(
    tmp_path, caplog
):
    checkpoint = tmp_path / "full"
    with tmpfs(checkpoint, size_kb=1024):
        settings = StoreSettings("memory", 8, 100, str(tmp_path / "local"))
        place = PartitionPlace(settings, str(checkpoint / "stores" / "0"), 0)
        writer = Writer(place)
        changes = {key(i): bytes([i % 251]) * 90 for i in range(6000)}  # changelog ~0.6 MB
        with caplog.at_level(logging.WARNING, logger="dstream.runtime.state.partition"):
            last = writer.commit(changes, snapshot=True)  # the snapshot finds no room left
        assert "state snapshot" in caplog.text and "not written" in caplog.text
        assert not place.versions.has_snapshot(last.time_ms)
        forget_local(place)
        assert contents(place, last) == writer.expected


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"spark.dstream.state.store": "leveldb"}, "not one of memory, rocksdb"),
        ({"spark.dstream.state.memoryMB": "0"}, "memoryMB: '0' is not a positive"),
        ({"spark.dstream.state.snapshotInterval": "ten"}, "snapshotInterval: 'ten'"),
    ],
)
def test_settings_name_the_wrong_key(conf, message):
    with pytest.raises(ValueError, match=message):
        StoreSettings.from_conf(conf.get)
    assert StoreSettings.from_conf({}.get) == StoreSettings("memory", 64, 10, None)
