"""mapWithState (Scala Spark's, on dstream's state store) with real Spark and real RocksDB: its
records and state snapshots exact against a reference computed here, batch by batch, with
timeouts, removals and an initial state; a driver restart from the checkpoint (getOrCreate)
gives what a fault-free run gives, also when it re-runs a batch whose commit was lost or loads
its state from the checkpoint instead of its executor; a torn snapshot is passed over; a torn
changelog that nothing covers stops the run naming it."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from dstream import State, StateSpec, StreamingContext
from dstream.runtime.checkpoint.directory import CheckpointDir, CheckpointMismatchError
from dstream.runtime.scheduling.clock import ManualClock
from dstream.runtime.state.partition import LOCAL_DIR_KEY, SNAPSHOT_INTERVAL_KEY, STORE_KEY
from streams import BATCH_TIMEOUT_S, final_failure, manual_context, run_batches

KINDS = ["memory", "rocksdb"]
RETRIES_KEY = "spark.dstream.failurePolicy.retries"


@contextmanager
def store_conf(sc, settings: dict[str, str]) -> Iterator[None]:
    """The live context's settings for the block, as a job's sparkConf would set them (the
    session's SparkContext is shared: they are removed after)."""
    for key, value in settings.items():
        sc._conf.set(key, value)
    try:
        yield
    finally:
        for key in settings:
            sc._conf._jconf.remove(key)


def counting(key: Any, value: int | None, state: State) -> tuple[Any, ...]:
    """A total per key; 0 removes the key; a timing-out key reports its total."""
    if value is None:
        assert state.isTimingOut()
        return ("timed out", key, state.get())
    if value == 0:
        state.remove()
        return ("removed", key)
    total = (state.getOption() or 0) + value
    state.update(total)
    return ("total", key, total)


def reference(
    batches: list[list[tuple[Any, int]]], initial: dict[Any, int], timeout_ms: int
) -> tuple[list[list[Any]], list[list[Any]]]:
    """What Scala Spark's mapWithState gives for `counting`, computed here without dstream: per
    record the function, then every key last updated before batch time - timeout times out."""
    state = {key: (value, 1000) for key, value in initial.items()}  # (total, last update)
    records, snapshots = [], []
    for number, batch in enumerate(batches, start=1):
        time_ms, out = number * 1000, []
        for key, value in batch:
            if value == 0:
                state.pop(key, None)
                out.append(("removed", key))
            else:
                total = state.get(key, (0, 0))[0] + value
                state[key] = (total, time_ms)
                out.append(("total", key, total))
        for key, (total, updated) in list(state.items()):
            if updated < time_ms - timeout_ms:
                out.append(("timed out", key, total))
                del state[key]
        records.append(sorted(out, key=repr))
        snapshots.append(sorted(((k, v) for k, (v, _t) in state.items()), key=repr))
    return records, snapshots


def random_batches(seed: int, count: int) -> list[list[tuple[Any, int]]]:
    """Each key at most once per batch (the order of a key's records within a batch is the
    shuffle's), of several types: str, int and tuple keys."""
    rng = random.Random(seed)
    keys = [f"user-{i}" for i in range(12)] + list(range(6)) + [("pair", i) for i in range(4)]
    return [
        [(key, rng.choice([0, 1, 2, 5])) for key in rng.sample(keys, rng.randint(0, 9))]
        for _ in range(count)
    ]


def run_map_with_state(sc, tmp_path: Path, batches, initial, timeout_s: float, partitions: int):
    ssc = manual_context(sc)
    ssc.checkpoint(str(tmp_path / "checkpoint"))
    spec = (
        StateSpec.function(counting)
        .timeout(timeout_s)
        .numPartitions(partitions)
        .initialState(sc.parallelize(sorted(initial.items(), key=repr)))
    )
    mapped = ssc.queueStream(batches, default=[]).mapWithState(spec)
    records: list[list[Any]] = []
    snapshots: list[list[Any]] = []
    mapped.foreachRDD(lambda rdd: records.append(sorted(rdd.collect(), key=repr)))
    mapped.stateSnapshots().foreachRDD(
        lambda rdd: snapshots.append(sorted(rdd.collect(), key=repr))
    )
    run_batches(ssc, len(batches))
    return records, snapshots


@pytest.mark.parametrize("kind", KINDS)
def test_records_and_snapshots_match_spark_semantics_batch_by_batch(sc, tmp_path, kind):
    batches = random_batches(seed=11, count=9) + [[], [], []]  # the last keys time out
    initial = {"user-0": 100, ("pair", 9): 7}
    with store_conf(sc, {STORE_KEY: kind, SNAPSHOT_INTERVAL_KEY: "3"}):
        records, snapshots = run_map_with_state(sc, tmp_path, batches, initial, 2, 3)
    expected_records, expected_snapshots = reference(batches, initial, 2000)
    assert records == expected_records
    assert snapshots == expected_snapshots
    assert any(r[0] == "timed out" for batch in records for r in batch)
    assert any(r[0] == "removed" for batch in records for r in batch)
    assert snapshots[-1] == []
    stores = tmp_path / "checkpoint" / "stores"
    [stream] = stores.iterdir()
    assert sorted(p.name for p in stream.iterdir()) == ["0", "1", "2"]
    assert any(p.name.startswith("snapshot-") for p in (stream / "0").iterdir())


def test_the_function_may_take_the_batch_time_and_keys_only_need_data_to_be_touched(sc, tmp_path):
    seen: list[Any] = []

    def with_time(time: datetime, key: str, value: int, state: State) -> tuple[Any, ...]:
        state.update(value)
        return (time.timestamp(), key, value)

    ssc = manual_context(sc)
    ssc.checkpoint(str(tmp_path))
    mapped = ssc.queueStream([[("a", 1), ("b", 2)], [("a", 3)], []]).mapWithState(
        StateSpec.function(with_time)
    )
    mapped.foreachRDD(lambda rdd: seen.append(sorted(rdd.collect())))
    run_batches(ssc, 3)
    # without a timeout a key without data is never called: no record for b after batch 1
    assert seen == [[(1.0, "a", 1), (1.0, "b", 2)], [(2.0, "a", 3)], []]


def test_state_follows_scala_spark_rules():
    state = State()
    assert not state.exists() and state.getOption() is None
    with pytest.raises(LookupError, match="State is not set"):
        state.get()
    state.update(3)
    assert (state.exists(), state.get()) == (True, 3)
    state.remove()
    with pytest.raises(ValueError, match="after it has been removed"):
        state.update(4)
    with pytest.raises(ValueError, match="already been removed"):
        state.remove()
    state._wrap(True, 5, timing_out=True)
    with pytest.raises(ValueError, match="timing out"):
        state.update(6)
    with pytest.raises(ValueError, match="timing out"):
        state.remove()


def test_a_bad_spec_or_a_missing_checkpoint_is_refused_by_name(sc):
    with pytest.raises(ValueError, match="numPartitions must be at least 1"):
        StateSpec.function(counting).numPartitions(0)
    with pytest.raises(ValueError, match="duration must be positive"):
        StateSpec.function(counting).timeout(0)
    with pytest.raises(TypeError, match="callable"):
        StateSpec.function("counting")
    ssc = manual_context(sc)
    ssc.queueStream([[("a", 1)]]).mapWithState(StateSpec.function(counting)).pprint()
    with pytest.raises(ValueError, match=r"mapWithState at .* StreamingContext.checkpoint"):
        ssc.start()
    ssc.stop(stopSparkContext=False)


class Program:
    """mapWithState over the rate source, its records and state snapshots written batch by batch
    to files; restarted through getOrCreate (functions that capture only a path survive
    pickling, as a real program's must)."""

    def __init__(self, sc: Any, root: Path):
        self.sc = sc
        self.checkpoint = str(root / "checkpoint")
        self.out = root / "out"
        self.out.mkdir(parents=True)
        self.now_ms = 0

    def setup(self) -> StreamingContext:
        ssc = StreamingContext(self.sc, 1)
        words = ssc.rateStream(30, 2, seed=7).map(lambda line: (line.split()[0], 1))
        spec = StateSpec.function(counting).timeout(3).numPartitions(2)
        mapped = words.mapWithState(spec)
        out = str(self.out)

        def save(kind: str) -> Any:
            def write(time: Any, rdd: Any) -> None:
                name = f"{kind}-{int(time.timestamp() * 1000)}.json"
                (Path(out) / name).write_text(json.dumps(sorted(rdd.collect(), key=repr)))

            return write

        mapped.foreachRDD(save("records"))
        mapped.stateSnapshots().foreachRDD(save("state"))
        return ssc

    def run(self, batches: int) -> StreamingContext:
        ssc = StreamingContext.getOrCreate(self.checkpoint, self.setup)
        ssc._clock = ManualClock(self.now_ms)
        ssc.start()
        for _ in range(batches):
            self.now_ms += 1000
            ssc._clock.advance(1000)
            ssc._scheduler.wait_for_batch(self.now_ms, BATCH_TIMEOUT_S)
        ssc.stop(stopSparkContext=False)
        return ssc

    def outputs(self) -> dict[str, Any]:
        return {p.stem: json.loads(p.read_text()) for p in self.out.glob("*.json")}

    def uncommit_last(self) -> int:
        """Drop the newest commit marker, as a driver killed before writing it leaves the log:
        the batch is recorded, not committed, and a restart runs it again."""
        log = CheckpointDir(self.checkpoint).log_dir
        newest = max(int(p.stem.split("-")[1]) for p in log.glob("commit-*.json"))
        (log / f"commit-{newest}.json").unlink()
        self.now_ms -= 1000
        return newest

    def partition_dir(self, partition: int) -> Path:
        [stream] = (Path(self.checkpoint) / "stores").iterdir()
        return stream / str(partition)


@pytest.mark.parametrize("kind", KINDS)
def test_a_restarted_driver_gives_what_a_fault_free_run_gives(sc, tmp_path, kind):
    settings = {STORE_KEY: kind, SNAPSHOT_INTERVAL_KEY: "2", LOCAL_DIR_KEY: str(tmp_path / "a")}
    with store_conf(sc, settings):
        reference = Program(sc, tmp_path / "reference")
        reference.run(8)
        program = Program(sc, tmp_path / "restarted")
        program.run(3)
        program.run(2)  # a plain restart: its executor still holds the state
        program.uncommit_last()  # a restart that re-runs a batch whose commit was lost
        program.run(2)
    fresh = {**settings, LOCAL_DIR_KEY: str(tmp_path / "b")}
    with store_conf(sc, fresh):  # executors without a copy: loaded from the checkpoint
        program.run(2)
    if kind == "rocksdb":
        assert any((tmp_path / "b").rglob("CURRENT"))  # its RocksDBs loaded there
    assert len(reference.outputs()) == 16
    assert program.outputs() == reference.outputs()
    assert any(r[0] == "timed out" for r in sum(reference.outputs().values(), []))


def test_a_torn_snapshot_is_passed_over_and_the_state_stays_exact(sc, tmp_path):
    settings = {
        STORE_KEY: "rocksdb",
        SNAPSHOT_INTERVAL_KEY: "2",
        LOCAL_DIR_KEY: str(tmp_path / "a"),
    }
    with store_conf(sc, settings):
        reference = Program(sc, tmp_path / "reference")
        reference.run(6)
        program = Program(sc, tmp_path / "restarted")
        program.run(4)
    for partition in (0, 1):
        directory = program.partition_dir(partition)
        newest = max(directory.glob("snapshot-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        stamp = newest.stem.split("-")[1]
        [table, *_] = sorted((directory / "files").glob(f"{stamp}-*.sst"))
        table.write_bytes(table.read_bytes()[:-5])  # cut short
    with store_conf(sc, {**settings, LOCAL_DIR_KEY: str(tmp_path / "b")}):
        program.run(2)
    assert program.outputs() == reference.outputs()


def test_a_torn_changelog_that_no_snapshot_covers_stops_the_run_naming_it(sc, tmp_path):
    settings = {STORE_KEY: "rocksdb", LOCAL_DIR_KEY: str(tmp_path / "a")}
    with store_conf(sc, settings):
        program = Program(sc, tmp_path / "restarted")
        program.run(3)
    torn = program.partition_dir(1) / "changelog-2000"
    torn.write_bytes(torn.read_bytes()[:-3])
    with store_conf(sc, {**settings, LOCAL_DIR_KEY: str(tmp_path / "b"), RETRIES_KEY: "0"}):
        ssc = StreamingContext.getOrCreate(program.checkpoint, program.setup)
        ssc._clock = ManualClock(program.now_ms)
        ssc.start()
        ssc._clock.advance(1000)
        failed = final_failure(ssc)
        ssc.stop(stopSparkContext=False)
    assert "batch" in str(failed) and "not committed" in str(failed)
    assert f"{torn}: checksum mismatch" in str(failed.__cause__)
    assert "no usable snapshot after it" in str(failed.__cause__)
    assert not (CheckpointDir(program.checkpoint).log_dir / "commit-4000.json").exists()
    shutil.rmtree(tmp_path / "b", ignore_errors=True)


def test_the_store_kind_stays_the_checkpoints_and_a_rebuilt_graph_with_another_is_refused(
    sc, tmp_path
):
    program = Program(sc, tmp_path / "job")
    with store_conf(sc, {STORE_KEY: "rocksdb", LOCAL_DIR_KEY: str(tmp_path / "a")}):
        program.run(2)
    with store_conf(sc, {STORE_KEY: "memory"}):
        restored = StreamingContext.getOrCreate(program.checkpoint, program.setup)
        [stream] = [s for s in restored.all_streams if type(s).__name__ == "MapWithStateDStream"]
        assert stream._settings.kind == "rocksdb"  # its checkpoint holds RocksDB snapshots
        rebuilt = StreamingContext.getOrCreate(program.checkpoint, program.setup, rebuild=True)
        with pytest.raises(CheckpointMismatchError, match="store was 'rocksdb', now 'memory'"):
            rebuilt.start()
        rebuilt.stop(stopSparkContext=False)
