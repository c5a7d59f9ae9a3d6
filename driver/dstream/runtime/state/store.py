"""One partition's keyed state at a version, behind one small interface with two implementations:
in this process's memory (`MemoryStore`) or in an embedded RocksDB on the executor's local disk
(`rocks.RocksDBStore`, which holds more state than memory).

Keys and values are bytes (the operators above encode theirs), so both stores order keys alike
and their changes can be written as one changelog format. Changes are buffered until `commit`,
which applies them at once, together with the store's new version: a task that dies mid-batch
leaves the store at the version it started from. A version is a batch time and a token naming
the write of it (a batch that runs again writes its version again under a new token), so a
store left on disk by another write of the same batch time is never taken for this one.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# A key's new value, or None where the key is deleted.
Changes = dict[bytes, bytes | None]
# Keys from here on are the user's; below it each store keeps its own bookkeeping.
FIRST_KEY = b"\x01"
_CHUNK = 4096
MEMORY_SNAPSHOT = "state.pickle"


@dataclass(frozen=True)
class Version:
    """A committed version: the batch time it is the state after, and the token of its write."""

    time_ms: int
    token: str


class StateStoreError(RuntimeError):
    """A state store that cannot be opened, written or loaded; the message names the files."""


class KeyedStore(ABC):
    """Keyed state of one partition. `get`, `put` and `delete` see this batch's changes;
    `scan` sees committed state only."""

    def __init__(self) -> None:
        self._pending: Changes = {}

    @property
    @abstractmethod
    def version(self) -> Version | None:
        """The committed version the store holds (None: empty, never committed)."""

    def get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        return self._read(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._pending[_checked(key)] = value

    def delete(self, key: bytes) -> None:
        self._pending[_checked(key)] = None

    def scan(
        self, start: bytes = FIRST_KEY, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Committed (key, value) pairs with start <= key < stop, in key order."""
        return self._scan(max(start, FIRST_KEY), stop)

    @property
    def pending(self) -> Changes:
        """The changes since the last commit."""
        return self._pending

    def commit(self, version: Version) -> Changes:
        """Apply the pending changes and move to `version`, at once; the changes applied."""
        changes, self._pending = self._pending, {}
        self._write(changes, version)
        return changes

    def discard(self) -> None:
        """Drop the pending changes (those of a task that failed before its commit)."""
        self._pending = {}

    def apply(self, changes: Changes, version: Version) -> None:
        """Apply a changelog read back from the checkpoint (nothing may be pending)."""
        assert not self._pending, "a changelog is applied to a store without pending changes"
        self._write(changes, version)

    @abstractmethod
    def _read(self, key: bytes) -> bytes | None: ...

    @abstractmethod
    def _scan(self, start: bytes, stop: bytes | None) -> Iterator[tuple[bytes, bytes]]: ...

    @abstractmethod
    def _write(self, changes: Changes, version: Version) -> None:
        """Apply `changes` and set `version` atomically."""

    @abstractmethod
    def save_snapshot(self, directory: Path) -> None:
        """Write the committed state as files into the local `directory`, which this creates,
        for the same kind of store to load back."""

    @abstractmethod
    def close(self) -> None: ...


def _checked(key: bytes) -> bytes:
    if key < FIRST_KEY:
        raise ValueError(f"state store keys start at {FIRST_KEY!r}: {key!r} is reserved")
    return key


class MemoryStore(KeyedStore):
    """State in a dict of this Python worker. Every worker process that ran a partition keeps its
    copy until it runs that partition again (then it is brought to the version asked for), so
    an executor may hold a partition more than once. `scan` sorts the keys in its range: a pass
    over the partition's keys."""

    def __init__(self, data: dict[bytes, bytes] | None = None, version: Version | None = None):
        super().__init__()
        self._data = data if data is not None else {}
        self._version = version

    @property
    def version(self) -> Version | None:
        return self._version

    def _read(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def _scan(self, start: bytes, stop: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        keys = sorted(k for k in self._data if start <= k and (stop is None or k < stop))
        data = self._data
        return ((k, data[k]) for k in keys if k in data)

    def _write(self, changes: Changes, version: Version) -> None:
        for key, value in changes.items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = value
        self._version = version

    def save_snapshot(self, directory: Path) -> None:
        """One file: the version, then the pairs in pickled chunks."""
        directory.mkdir(parents=True)
        with open(directory / MEMORY_SNAPSHOT, "wb") as out:
            pickle.dump(self._version, out, pickle.HIGHEST_PROTOCOL)
            items = list(self._data.items())
            for start in range(0, len(items), _CHUNK):
                pickle.dump(items[start : start + _CHUNK], out, pickle.HIGHEST_PROTOCOL)

    @classmethod
    def load_snapshot(cls, directory: Path) -> MemoryStore:
        data: dict[bytes, bytes] = {}
        with open(directory / MEMORY_SNAPSHOT, "rb") as source:
            version = pickle.load(source)
            while True:
                try:
                    data.update(pickle.load(source))
                except EOFError:
                    break
        return cls(data, version)

    def close(self) -> None:
        """Nothing to release: the worker keeps the store for its next task."""
