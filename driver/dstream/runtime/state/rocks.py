"""The state store in an embedded RocksDB (`rocksdict`, which ships RocksDB in its wheel), on the
executor's local disk: state larger than memory stays on disk, and the memory RocksDB takes is
capped per Python worker (the block cache and memtables of the stores it opens share one LRU
cache of `memory_mb`, as Spark's `boundedMemoryUsage` does per executor).

A snapshot is a RocksDB checkpoint: the memtable flushed, then the table files hard-linked and
the small descriptor files copied into a directory, so it costs about nothing locally; the
table files never change once written, which lets the checkpoint copy only the new ones.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import rocksdict

from dstream.runtime.state.store import Changes, KeyedStore, StateStoreError, Version

_VERSION_KEY = b"\x00version"
_MB = 1 << 20
# Files of a RocksDB directory that never change once written: a snapshot shares them.
IMMUTABLE_SUFFIXES = (".sst", ".blob")


def _options(memory_mb: int) -> rocksdict.Options:
    """Raw byte keys; block cache, index and filter blocks and memtables charged to one cache of
    `memory_mb`, half of it at most for memtables; bloom filters for point lookups."""
    cache, buffers = _shared_memory(memory_mb)
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_manager(buffers)
    options.set_write_buffer_size(max(_MB, memory_mb * _MB // 4))
    options.set_max_write_buffer_number(2)
    options.set_keep_log_file_num(2)
    return options


@functools.cache
def _shared_memory(memory_mb: int) -> tuple[rocksdict.Cache, rocksdict.WriteBufferManager]:
    """The worker's one cache of `memory_mb` and the memtables' share of it, for every store it
    opens: a store is opened per task, and the blocks its last task read stay cached."""
    cache = rocksdict.Cache(memory_mb * _MB)
    buffers = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
        memory_mb * _MB // 2, False, cache
    )
    return cache, buffers


class RocksDBStore(KeyedStore):
    """One partition's state in the RocksDB at `directory`, open until `close`. RocksDB lets one
    process at a time open a directory: a store is opened per task and closed after it."""

    def __init__(self, directory: Path, memory_mb: int):
        super().__init__()
        self.directory = directory
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)
            self._db = rocksdict.Rdict(str(directory), _options(memory_mb))
        except Exception as error:
            raise StateStoreError(
                f"cannot open the RocksDB state store {directory}: {error}"
            ) from None
        self._version = _decoded(self._db.get(_VERSION_KEY))

    @property
    def version(self) -> Version | None:
        return self._version

    def _read(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def _scan(self, start: bytes, stop: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        cursor = self._db.iter()
        cursor.seek(start)
        while cursor.valid():
            key = cursor.key()
            if stop is not None and key >= stop:
                return
            yield key, cursor.value()
            cursor.next()

    def _write(self, changes: Changes, version: Version) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, value in changes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        batch.put(_VERSION_KEY, json.dumps([version.time_ms, version.token]).encode())
        try:
            self._db.write(batch)
        except Exception as error:
            raise StateStoreError(
                f"cannot write the RocksDB state store {self.directory}: {error}"
            ) from None
        self._version = version

    def save_snapshot(self, directory: Path) -> None:
        """A RocksDB checkpoint into `directory` (which must not exist yet)."""
        try:
            rocksdict.Checkpoint(self._db).create_checkpoint(str(directory))
        except Exception as error:
            raise StateStoreError(
                f"cannot snapshot the RocksDB state store {self.directory}: {error}"
            ) from None

    def close(self) -> None:
        self._db.close()


def _decoded(raw: bytes | None) -> Version | None:
    if raw is None:
        return None
    time_ms, token = json.loads(raw)
    return Version(time_ms, token)
