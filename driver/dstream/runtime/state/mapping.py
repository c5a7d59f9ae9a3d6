"""mapWithState's step, as its tasks run it on a partition's state store: Scala Spark's semantics
(MapWithStateRDDRecord), with the state in the store instead of a copied hash map.

Per batch and partition: open the store at the version of the last committed batch; call the
mapping function once per record of the batch, in the order the partition holds them, each call
seeing the state the previous one left; then call it once, with no value, for every key idle
for longer than the timeout, and remove those keys; write the changes as the batch's version and
hand on what the calls returned. Only keys with data or timing out are touched, so a batch costs
what it touches, not what the state holds: idle keys are found through an index by the time of
their last update instead of a pass over every key (Spark finds them only in its checkpoint
batches, by such a pass).

Store layout of a key `k` (bytes from `encode_key`): `s` + k holds the pickled (key, state,
time of its last update); with a timeout, `t` + the time (8 bytes, big-endian) + k indexes it.
"""

from __future__ import annotations

import pickle
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstream.runtime.state.partition import (
    PartitionPlace,
    StoreSettings,
    commit_version,
    open_store,
)
from dstream.runtime.state.store import KeyedStore, Version
from dstream.runtime.state.versions import PartitionVersions
from dstream.runtime.timeutil import datetime_of

STATE = b"s"
INDEX = b"t"
_TIME = struct.Struct(">Q")
_LENGTH = struct.Struct(">I")
_DOUBLE = struct.Struct(">d")
# Tags of the first batch's records: the initial state, then the batch's data.
INITIAL, DATA = 0, 1


def encode_key(key: Any) -> bytes:
    """The key's bytes in the store: equal keys of these types (None, bool, int, float, str,
    bytes, and tuples of them) encode equally however they were built, which pickle does not
    promise (it shares repeated objects by identity). Types differ as on the JVM: 1, 1.0 and
    True are three keys. Other keys are pickled."""
    if key is None:
        return b"N"
    if key is True or key is False:
        return b"T" if key else b"F"
    if isinstance(key, int):
        return _sized(b"I", str(key).encode())
    if isinstance(key, float):
        return b"D" + _DOUBLE.pack(key)
    if isinstance(key, str):
        return _sized(b"S", key.encode("utf-8", "surrogatepass"))
    if isinstance(key, bytes):
        return _sized(b"B", key)
    if isinstance(key, tuple):
        return b"(" + _LENGTH.pack(len(key)) + b"".join(encode_key(item) for item in key)
    return _sized(b"P", pickle.dumps(key, pickle.HIGHEST_PROTOCOL))


def _sized(tag: bytes, payload: bytes) -> bytes:
    return tag + _LENGTH.pack(len(payload)) + payload


class State:
    """A key's state inside the mapping function, as Scala Spark's `State[S]`: `exists`, `get`,
    `getOption`, `update`, `remove` and `isTimingOut`, with its rules (a timing-out key cannot
    be updated or kept: it is removed after the call)."""

    def __init__(self) -> None:
        self._wrap(False, None)

    def _wrap(self, exists: bool, value: Any, timing_out: bool = False) -> None:
        self._exists = exists
        self._value = value
        self._timing_out = timing_out
        self._updated = False
        self._removed = False

    def exists(self) -> bool:
        return self._exists

    def get(self) -> Any:
        if not self._exists:
            raise LookupError("State is not set")
        return self._value

    def getOption(self) -> Any:
        """The state, or None where there is none."""
        return self._value if self._exists else None

    def update(self, newState: Any) -> None:
        if self._removed:
            raise ValueError("Cannot update the state after it has been removed")
        if self._timing_out:
            raise ValueError("Cannot update the state that is timing out")
        self._exists, self._value, self._updated = True, newState, True

    def remove(self) -> None:
        if self._timing_out:
            raise ValueError("Cannot remove the state that is timing out")
        if self._removed:
            raise ValueError("Cannot remove the state that has already been removed")
        self._exists, self._value, self._updated, self._removed = False, None, False, True

    def isTimingOut(self) -> bool:
        return self._timing_out

    def __repr__(self) -> str:
        return f"State({self._value!r})" if self._exists else "State(<not set>)"


@dataclass(frozen=True)
class MapWithStateStep:
    """One batch's step of a mapWithState stream, for every partition (`__call__` runs in the
    task of partition `index`): from `parent` (None: the stream's first batch, whose input
    carries the initial state tagged when `initial`) to `version`."""

    function: Callable[..., Any]
    with_time: bool
    timeout_ms: int | None
    settings: StoreSettings
    root: str
    partitions: int
    version: Version
    parent: Version | None
    snapshot: bool
    initial: bool

    def __call__(self, index: int, records: Iterable[Any]) -> list[Any]:
        place = PartitionPlace(self.settings, self.root, index)
        store = open_store(place, self.parent)
        try:
            mapped = self._step(store, records)
            commit_version(store, place, self.version, self.parent, self.snapshot)
        except BaseException:
            store.discard()
            raise
        finally:
            store.close()
        return mapped

    def _step(self, store: KeyedStore, records: Iterable[Any]) -> list[Any]:
        time_ms = self.version.time_ms
        if self.initial:
            records = self._put_initial(store, records)
        call = self._caller()
        state = State()
        mapped = []
        for key, value in records:
            encoded = encode_key(key)
            before = _stored(store.get(STATE + encoded))
            state._wrap(before is not None, before[1] if before is not None else None)
            mapped.append(call(key, value, state))
            self._keep(store, key, encoded, before, state)
        if self.timeout_ms is not None:
            mapped += self._time_out(store, time_ms - self.timeout_ms, call, state)
        return mapped

    def _put_initial(self, store: KeyedStore, tagged: Iterable[Any]) -> list[Any]:
        """Store the initial state's records (as updated at this batch's time); the batch's
        own records, which follow, whatever order the shuffle delivered them in."""
        data = []
        for key, (tag, value) in tagged:
            if tag == INITIAL:
                self._put(store, key, encode_key(key), value, None)
            else:
                data.append((key, value))
        return data

    def _caller(self) -> Callable[[Any, Any, State], Any]:
        if not self.with_time:
            return self.function
        time = datetime_of(self.version.time_ms)
        return lambda key, value, state: self.function(time, key, value, state)

    def _keep(
        self, store: KeyedStore, key: Any, encoded: bytes, before: tuple | None, state: State
    ) -> None:
        """What the call left, as Spark keeps it: a removed key goes; an updated one, or with
        a timeout any that exists, is stored as updated now."""
        old_time = before[2] if before is not None else None
        if state._removed:
            if before is not None:
                store.delete(STATE + encoded)
                self._unindex(store, encoded, old_time)
        elif state._updated or (state._exists and self.timeout_ms is not None):
            self._put(store, key, encoded, state._value, old_time)

    def _put(
        self, store: KeyedStore, key: Any, encoded: bytes, value: Any, old: int | None
    ) -> None:
        time_ms = self.version.time_ms
        store.put(STATE + encoded, pickle.dumps((key, value, time_ms), pickle.HIGHEST_PROTOCOL))
        if self.timeout_ms is not None:
            self._unindex(store, encoded, old)
            store.put(INDEX + _TIME.pack(time_ms) + encoded, b"")

    def _unindex(self, store: KeyedStore, encoded: bytes, time_ms: int | None) -> None:
        if self.timeout_ms is not None and time_ms is not None:
            store.delete(INDEX + _TIME.pack(time_ms) + encoded)

    def _time_out(
        self, store: KeyedStore, threshold_ms: int, call: Callable[..., Any], state: State
    ) -> list[Any]:
        """Call the function for each key last updated before `threshold_ms` and not in this
        batch (its index entry is deleted then), and remove it."""
        mapped = []
        for index_key, _ in store.scan(INDEX, INDEX + _TIME.pack(max(threshold_ms, 0))):
            if index_key in store.pending:
                continue
            encoded = index_key[len(INDEX) + _TIME.size :]
            stored = _stored(store.get(STATE + encoded))
            assert stored is not None, "an indexed key has its state"
            key, value, _updated = stored
            state._wrap(True, value, timing_out=True)
            mapped.append(call(key, None, state))
            store.delete(STATE + encoded)
            store.delete(index_key)
        return mapped

    def missing(self) -> list[int]:
        """The partitions whose changelog of this version is not this step's (not written yet,
        or by another attempt of the batch)."""
        return [
            index
            for index in range(self.partitions)
            if PartitionVersions(Path(self.root) / str(index)).written_token(self.version.time_ms)
            != self.version.token
        ]

    def listing(self) -> dict[str, Any]:
        """What the batch's commit marker lists of this version."""
        return {
            "time": self.version.time_ms,
            "token": self.version.token,
            "snapshot": self.snapshot,
        }


def _stored(raw: bytes | None) -> tuple[Any, Any, int] | None:
    return None if raw is None else pickle.loads(raw)


@dataclass(frozen=True)
class SnapshotReader:
    """stateSnapshots' task: once the step of `version` has run for the partition (its records,
    the input here, are drained), every live key's (key, state) at that version."""

    settings: StoreSettings
    root: str
    version: Version

    def __call__(self, index: int, stepped: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        deque(stepped, maxlen=0)
        store = open_store(PartitionPlace(self.settings, self.root, index), self.version)
        try:
            for _key, raw in store.scan(STATE, INDEX):
                key, value, _updated = pickle.loads(raw)
                yield key, value
        finally:
            store.close()
