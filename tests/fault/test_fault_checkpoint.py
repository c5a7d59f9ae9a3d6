"""Torn files in a real checkpoint directory between two runs of the same job.

The job runs in this process on a manual clock (a restart is a new StreamingContext on the same
checkpoint), its files are damaged the way a crash or a bad disk would leave them, and the
restarted job must skip what is torn, fall back to the previous good file, count it, and still
produce exactly the reference output; or, when exact recovery is impossible, refuse clearly.
"""

from __future__ import annotations

import os
import random
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from dstream import StreamingContext
from dstream.runtime.checkpoint import directory as checkpoint
from dstream.runtime.checkpoint.directory import (
    CheckpointDir,
    CheckpointUnrecoverableError,
    verify_state_checkpoint,
)
from dstream.runtime.checkpoint.files import TornFileError
from dstream.runtime.checkpoint.recovery import hash_partitioned_checkpoint, verified_state
from dstream.runtime.control.failure import FailurePolicy
from dstream.runtime.scheduling.clock import ManualClock
from dstream.runtime.scheduling.graph import READ_BY
from dstream.runtime.timeutil import time_to_ms
from fault.harness import InProcessJob, RateJob, fault_rng, truncate_at_random_byte, verify
from pyspark import RDD
from pyspark.rdd import Partitioner, portable_hash


@pytest.fixture
def job(sc, tmp_path) -> InProcessJob:
    """1 s batches, a 5 s window (the incremental path), state checkpoints every 2 s; one input
    partition keeps the task count low (the rate source's partitions are the kill test's job)."""
    return InProcessJob(
        sc, RateJob(tmp_path, batch_s=1, partitions=1, window_s=5, checkpoint_interval_s=2)
    )


def newest(log_dir: Path, kind: str) -> Path:
    return max(log_dir.glob(f"{kind}-*.json"), key=lambda p: int(p.stem.split("-")[1]))


def assert_exact(job: InProcessJob) -> None:
    verdict = verify(job.job)
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert (verdict.lost, verdict.duplicated) == (0, 0)


def test_torn_log_and_metadata_files_are_skipped_and_output_stays_exact(job):
    """The newest batch record, its commit marker and metadata.json cut short at random bytes,
    the commit before it changed in place (its checksum fails) and a writer's stale temporary
    file: the restart skips what is torn (metadata.json's backup serves), runs the batch whose
    commit was lost again and plans the one whose record was lost again; the output is exact."""
    rng = fault_rng()
    ssc = job.start()
    job.run(ssc, 5)
    ssc.stop(stopSparkContext=False)
    log_dir = job.job.checkpoint / "log"
    record, commit = newest(log_dir, "batch"), newest(log_dir, "commit")
    for torn in (record, commit, job.job.checkpoint / "metadata.json"):
        truncate_at_random_byte(torn, rng)
    changed = log_dir / f"commit-{4 * job.batch_ms}.json"
    damaged = bytearray(changed.read_bytes())
    damaged[-20:-10] = b"0123456789"  # same length, checksum no longer matches
    changed.write_bytes(bytes(damaged))
    stale_temp = log_dir / f".{record.name}.tmp-4242"
    stale_temp.write_bytes(b'{"sha256": "')  # a writer that died before its rename

    ssc = job.start()
    recovery = ssc._scheduler.recovery
    assert {record.name, commit.name, changed.name} <= set(recovery.torn_files)
    assert recovery.replayed == [4 * job.batch_ms]
    assert not stale_temp.exists()
    job.run(ssc, 2)
    ssc.stop(stopSparkContext=False)
    assert_exact(job)


def cut_state_part(path: str, how: str, rng: random.Random) -> None:
    """Cut a part of a Spark reliable checkpoint short: its first at a random byte ("byte"), or
    its largest at a random 512-byte chunk boundary, as a lost disk block leaves it ("chunk":
    Hadoop's checksums alone miss that cut)."""
    directory = Path(path.removeprefix("file:"))
    if how == "byte":
        truncate_at_random_byte(directory / "part-00000", rng)
        return
    part = max(directory.glob("part-*"), key=lambda p: p.stat().st_size)
    chunks = -(-part.stat().st_size // 512)
    assert chunks > 1, f"{part} has no chunk boundary inside it"
    os.truncate(part, 512 * rng.randrange(1, chunks))


def delete_first_part(path: str) -> None:
    part = Path(path.removeprefix("file:")) / "part-00000"
    part.unlink()
    part.with_name(".part-00000.crc").unlink(missing_ok=True)


def durable_stream(ssc: Any) -> Any:
    """The stream whose every batch is written: the incremental window's per-batch counts."""
    (stream,) = [s for s in ssc._graph.streams if s.checkpoint_data.durable_batches]
    return stream


def flip_a_byte(part: Path, rng: random.Random) -> None:
    """Change one byte of `part` in place, as a bad disk would: its length stays whole."""
    data = bytearray(part.read_bytes())
    data[rng.randrange(len(data))] ^= 0x40
    part.write_bytes(bytes(data))


def spark_checkpoint(sc: Any, tmp_path: Path, records: list[Any], partitions: int) -> str:
    """Where Spark wrote a reliable checkpoint of `records` in `partitions` parts."""
    sc.setCheckpointDir(str(tmp_path / "state"))
    rdd = sc.parallelize(records, partitions)
    rdd.checkpoint()
    rdd.count()
    return rdd.getCheckpointFile()


DAMAGES = {
    "a byte changed": lambda parts, rng: flip_a_byte(parts[1], rng),
    "cut at a chunk boundary": lambda parts, _rng: os.truncate(parts[1], 512),
    "a part missing": lambda parts, _rng: parts[1].unlink(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_state_checkpoint_is_verified_in_the_driver_against_its_checksums(
    sc, tmp_path, monkeypatch, damage
):
    """A restarted driver verifies a state checkpoint itself, without a Spark job that would
    wait for its executors: every damage Spark's read would find, and the cut Spark misses.
    Parts are read a few chunks at a time here, so that a part spans several reads."""
    monkeypatch.setattr(checkpoint, "_CHUNKS_PER_READ", 3)
    path = spark_checkpoint(sc, tmp_path, [(f"k{i}", "v" * 40) for i in range(6000)], 3)
    parts = sorted(Path(path.removeprefix("file:")).glob("part-*"))
    assert len(parts) == 3 and parts[1].stat().st_size > 1024
    assert verify_state_checkpoint(path) is True

    DAMAGES[damage](parts, fault_rng())
    with pytest.raises(TornFileError, match="part-00001"):
        verify_state_checkpoint(path)


def test_a_state_checkpoint_without_checksums_is_left_to_sparks_read(sc, tmp_path):
    """Where no .crc lies beside the parts (HDFS, object stores), Spark's read through the
    checkpoint verifies it, and the RDD that read is the one a restore gets."""
    path = spark_checkpoint(sc, tmp_path, list(range(100)), 2)
    for crc in Path(path.removeprefix("file:")).glob(".part-*.crc"):
        crc.unlink()
    assert verify_state_checkpoint(path) is False
    assert sorted(RDD(verified_state(sc, path), sc, sc.serializer).collect()) == list(range(100))

    part = Path(path.removeprefix("file:")) / "part-00000"
    part.write_bytes(b"damaged" + part.read_bytes()[7:])  # the stream header
    with pytest.raises(Exception, match="StreamCorruptedException"):
        verified_state(sc, path)


def test_torn_state_checkpoints_fall_back_to_the_previous_ones(job):
    rng = fault_rng()
    ssc = job.start()
    job.run(ssc, 6)  # state checkpoints at 2, 4 and 6 s; the newest two stay on disk
    ssc.stop(stopSparkContext=False)
    checkpoints = CheckpointDir(job.job.checkpoint).load_log().state_checkpoints()
    del checkpoints[str(durable_stream(ssc)._index)]
    assert len(checkpoints) == 2, checkpoints  # updateStateByKey and the incremental window
    newest_paths = []
    # the running totals' parts are small; the window's span several 512-byte chunks
    for (stream, kept), how in zip(sorted(checkpoints.items()), ("byte", "chunk"), strict=True):
        assert len(kept) >= 2, f"stream {stream} has no older checkpoint to fall back to: {kept}"
        cut_state_part(kept[0][1], how, rng)
        newest_paths.append(kept[0][1])

    ssc = job.start()
    recovery = ssc._scheduler.recovery
    assert set(newest_paths) <= set(recovery.torn_files)
    assert recovery.restored_state == {s: kept[1][0] for s, kept in checkpoints.items()}
    job.run(ssc, 2)
    ssc.stop(stopSparkContext=False)
    assert_exact(job)


def test_a_restarted_window_subtracts_its_durable_batches_instead_of_recomputing_them(job):
    """Every batch's counts under the window are written (5 s window, state every 2 s: the
    newest 5 + 2 * 2 + 1 = 10 stay); a restart reads them back, from their part files rather
    than by lineage to the source, and one torn among them is recomputed from its source
    instead."""
    rng = fault_rng()
    ssc = job.start()
    job.run(ssc, 12)
    ssc.stop(stopSparkContext=False)
    index = str(durable_stream(ssc)._index)
    logged = CheckpointDir(job.job.checkpoint).load_log().state_checkpoints()[index]
    kept, pruned = logged[:10], logged[10:]
    times = [time_ms for time_ms, _path in kept]
    assert times == list(range(12 * job.batch_ms, 2 * job.batch_ms, -job.batch_ms))
    on_disk = {p.as_uri() for p in (job.job.checkpoint / "state").glob("*/rdd-*")}
    assert {path.replace("file:", "file://") for _t, path in kept} <= on_disk
    assert not {path.replace("file:", "file://") for _t, path in pruned} & on_disk
    torn_time, torn_path = kept[3]  # the batch leaving the window at 14 s
    cut_state_part(torn_path, "byte", rng)

    ssc = job.start()
    stream = durable_stream(ssc)
    assert ssc._scheduler.recovery.torn_files == [torn_path]  # the pruned ones are not torn
    restored = {t: stream._generated[t] for t in times if t in stream._generated}
    assert sorted(restored) == sorted(set(times) - {torn_time})
    for rdd in restored.values():
        assert getattr(rdd, READ_BY).directory.startswith("file:")  # read from its files
        assert rdd.partitioner is not None  # one batch is subtracted without a shuffle
        assert rdd._jrdd.rdd().partitioner().isDefined()  # nor a union of the window's
    job.run(ssc, 3)
    ssc.stop(stopSparkContext=False)
    assert_exact(job)


def test_restored_state_meets_a_new_batch_without_a_shuffle(sc, tmp_path):
    """A state checkpoint written by another driver (here: partitioned by another function
    object of the same hash, as another process's `portable_hash` is to PySpark) is read back
    partitioned as this run's batches are: their union keeps the state's two partitions, so
    the first cogroup after a restart moves only the batch. Read the plain way, the union has
    four and the whole state is shuffled again."""
    sc.setCheckpointDir(str(tmp_path))
    written = sc.parallelize([(w, 1) for w in "abcdefgh"])
    written = written.partitionBy(2, lambda key: portable_hash(key)).mapValues(lambda v: v)
    written.checkpoint()
    written.count()
    path = written.getCheckpointFile()
    batch = sc.parallelize([("a", 2), ("z", 3)]).partitionBy(2)

    plain = RDD(sc._jsc.checkpointFile(path), sc, sc.serializer)
    assert plain.union(batch).getNumPartitions() == 4
    state = RDD(hash_partitioned_checkpoint(sc, path, 2), sc, sc.serializer)
    state.partitioner = Partitioner(2, portable_hash)
    assert state.union(batch).getNumPartitions() == 2
    assert state.glom().collect() == written.glom().collect()  # each key where it was
    merged = state.cogroup(batch, 2).mapValues(lambda sv: sum(sv[0]) + sum(sv[1]))
    assert dict(merged.collect()) == {**dict.fromkeys("bcdefgh", 1), "a": 3, "z": 3}


def test_a_missing_batch_record_in_the_middle_is_refused(job):
    ssc = job.start()
    job.run(ssc, 3)
    ssc.stop(stopSparkContext=False)
    middle = job.job.checkpoint / "log" / f"batch-{2 * job.batch_ms}.json"
    middle.unlink()
    with pytest.raises(
        CheckpointUnrecoverableError, match=f"no readable batch record .*{2 * job.batch_ms}"
    ):
        job.start()


def test_state_lost_after_the_log_was_pruned_is_refused(job):
    ssc = job.start()
    job.run(ssc, 3)
    ssc.stop(stopSparkContext=False)
    (job.job.checkpoint / "log" / f"batch-{job.batch_ms}.json").unlink()  # as pruning would
    for _stream, kept in CheckpointDir(job.job.checkpoint).load_log().state_checkpoints().items():
        for _time, path in kept:
            delete_first_part(path)
    with pytest.raises(CheckpointUnrecoverableError, match="has no readable state checkpoint"):
        job.start()
    assert os.path.exists(job.job.checkpoint / "metadata.json")


def run_failing_once(sc, tmp_path, policy: FailurePolicy) -> tuple[str, dict[int, Any]]:
    """A running total whose output fails once, at batch 2000: three batches, then a restart
    from the checkpoint that runs one more. The outputs seen, by batch time."""
    outputs: dict[int, Any] = {}
    clock_ms = [0]

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=ManualClock(clock_ms[0]))
        ones = ssc.rateStream(10, 1, seed=3).map(lambda _line: ("n", 1))
        totals = ones.updateStateByKey(lambda new, total: (total or 0) + sum(new))

        def keep(time: datetime, rdd: Any) -> None:
            if time_to_ms(time) == 2000 and 2000 not in outputs:
                outputs[2000] = "failed"
                raise OSError("sink unavailable")
            outputs[time_to_ms(time)] = rdd.collect()

        totals.foreachRDD(keep)
        return ssc

    checkpoint = str(tmp_path / "checkpoint")
    for batches in (3, 1):
        # rebuild: the restart runs setup again, so its functions fill this test's `outputs`
        # (a graph restored from the checkpoint would hold copies of them).
        ssc = StreamingContext.getOrCreate(checkpoint, setup, rebuild=True)
        ssc.start()
        ssc._scheduler.failure_policy = policy
        for _ in range(batches):
            clock_ms[0] += 1000
            ssc._clock.advance(1000)
            ssc._scheduler.wait_for_batch(clock_ms[0], 120)
        ssc.stop(stopSparkContext=False)
        if batches == 1:
            assert ssc._scheduler.recovery.replayed == []
    return checkpoint, outputs


def test_a_failed_output_is_retried_and_the_batch_commits(sc, tmp_path):
    checkpoint, outputs = run_failing_once(sc, tmp_path, FailurePolicy(retries=1, backoff_s=0.05))
    assert outputs == {1000: [("n", 10)], 2000: [("n", 20)], 3000: [("n", 30)], 4000: [("n", 40)]}
    assert "error" not in CheckpointDir(checkpoint).load_log().commits[2000]


def test_a_skipped_batch_is_recorded_with_its_ranges_and_not_rerun_after_a_restart(sc, tmp_path):
    """With onExhausted: skip the live run moves on past the failed batch; a restart must do
    the same rather than re-run it behind later batches, so its output equals the live one's."""
    policy = FailurePolicy(retries=0, on_exhausted="skip")
    checkpoint, outputs = run_failing_once(sc, tmp_path, policy)
    assert outputs == {1000: [("n", 10)], 2000: "failed", 3000: [("n", 30)], 4000: [("n", 40)]}
    log = CheckpointDir(checkpoint).load_log()
    commit = log.commits[2000]
    assert commit["error"] == "OSError: sink unavailable"
    assert commit["skipped"] == log.records[2000]["ranges"]


def test_an_unwritable_sink_for_seconds_is_ridden_out_by_retries(sc, tmp_path):
    """The files sink's directory is replaced by a regular file (root writes through chmod)
    during batch 3 and restored after its first retry: the batch commits whole, nothing lost."""
    policy = {"retries": 6, "backoffSeconds": 0.25}
    job = InProcessJob(sc, RateJob(tmp_path, extra_spec={"failurePolicy": policy}))
    ssc = job.start()
    job.run(ssc, 2)
    aside = tmp_path / "out-aside"
    job.job.out.rename(aside)
    job.job.out.write_text("not a directory")
    time_ms = job.advance(ssc)
    job.wait_for_retry(ssc)
    job.job.out.unlink()
    aside.rename(job.job.out)
    ssc._scheduler.wait_for_batch(time_ms, 60)
    job.run(ssc, 2)
    ssc.stop(stopSparkContext=False)
    retried = [info for info in ssc._scheduler.history if info.retries]
    assert [info.error for info in retried] == [None]
    verdict = verify(job.job)
    assert verdict.batches == 5 and not verdict.mismatched_batches
    assert verdict.lost == verdict.duplicated == 0
