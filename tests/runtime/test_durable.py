"""Durable batch reductions (dstream/runtime/checkpoint/durable.py): the part format, its torn-file detection, and
that a window's batches are written by the batch's own output job."""

from __future__ import annotations

import operator
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from dstream import StreamingContext
from dstream.runtime.checkpoint import durable
from dstream.runtime.checkpoint.files import CheckpointWriteError, TornFileError, local_path
from dstream.runtime.scheduling.clock import ManualClock
from dstream.runtime.scheduling.graph import READ_BY, DStreamGraph
from dstream.runtime.scheduling.scheduler import CHECKPOINT_ALL_MARKED
from pyspark.rdd import Partitioner, portable_hash
from streams import collect, manual_context, run_batches

RECORDS = [(f"k{i}", i) for i in range(2_500)] + [(("tuple", "key"), [1.5, None])]


def write_parts(directory: Path, partitions: list[list[object]]) -> None:
    for index, records in enumerate(partitions):
        passed = list(durable.PartWriter(str(directory), len(partitions))(index, iter(records)))
        assert passed == records  # handed on unchanged


def test_parts_read_back_as_written_in_chunks(tmp_path):
    write_parts(tmp_path, [RECORDS, [], RECORDS[:3]])
    assert durable.is_durable(str(tmp_path))
    assert durable.check_parts(f"file:{tmp_path}") == 3
    assert durable.read_part(str(tmp_path), 0, 3) == RECORDS  # more than one chunk
    assert durable.read_part(str(tmp_path), 1, 3) == []
    unread = iter([None, None])  # what a PySpark worker would find left in its input
    assert durable.PartReader(str(tmp_path), 3)(2, unread) == RECORDS[:3]
    assert next(unread, "drained") == "drained"


def test_a_python_worker_that_read_a_durable_batch_is_reused(sc, tmp_path):
    """A worker whose task leaves input unread exits instead of going back to the pool: a
    window subtracting durable batches started a new Python worker for every task of every
    batch. Sequential one-task reads take their worker from the pool in turn (first in, first
    out), so reused workers show up as a pid read twice; with none reused, every pid is new."""
    write_parts(tmp_path, [RECORDS[:10]])
    read = DStreamGraph(1000).read_durably(sc, str(tmp_path))
    pids = [read.mapPartitions(lambda _part: [os.getpid()]).collect()[0] for _ in range(24)]
    assert len(set(pids)) < len(pids), pids


def test_a_partition_left_unfinished_writes_no_part(tmp_path):
    passing = durable.PartWriter(str(tmp_path), 1)(0, iter(RECORDS))
    assert next(passing) == RECORDS[0]
    passing.close()  # an output that took one record
    assert durable.missing_parts(str(tmp_path), 1) == [0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["cut", "flipped byte", "missing part", "moved part"])
def test_a_damaged_part_is_reported_torn(tmp_path, damage):
    write_parts(tmp_path, [RECORDS, RECORDS[:100]])
    first, second = durable.part_path(tmp_path, 0), durable.part_path(tmp_path, 1)
    data = second.read_bytes()
    rng = random.Random(len(data))
    if damage == "cut":
        second.write_bytes(data[: rng.randrange(len(data))])
    elif damage == "flipped byte":
        at = rng.randrange(len(durable.MAGIC), len(data))
        second.write_bytes(data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :])
    elif damage == "missing part":
        second.unlink()
    else:
        second.replace(first)
    with pytest.raises(TornFileError, match="part-0000"):
        durable.check_parts(str(tmp_path))


def test_every_cut_of_a_part_is_caught(tmp_path):
    write_parts(tmp_path, [RECORDS[:40]])
    part = durable.part_path(tmp_path, 0)
    whole = part.read_bytes()
    for length in range(len(whole)):
        part.write_bytes(whole[:length])
        with pytest.raises(TornFileError):
            durable.check_parts(str(tmp_path))


def jobs_per_batch(ssc, sc) -> list[int]:
    tracker = sc.statusTracker()
    return [
        len(tracker.getJobIdsForGroup(f"dstream-batch-{b.batch_time_ms}"))
        for b in ssc._scheduler.history
    ]


def test_a_windows_batches_are_written_by_the_outputs_own_job(sc, tmp_path):
    """Each batch runs one Spark job (its output), which also writes the reduction the window
    will subtract; the batch that checkpoints the window's state runs one more (Spark's)."""
    # batch times of their own: job groups are named by batch time, and the session's
    # SparkContext ran other tests' batches at the manual clock's usual times
    ssc = StreamingContext(sc, 1, clock=ManualClock(round(time.time()) * 1000))
    ssc.checkpoint(str(tmp_path / "checkpoint"))
    batches = [[("a", 1), ("b", 2)], [("a", 3)], [("c", 1)], [("a", 1)]] * 2
    seen: list[int] = []
    windowed = ssc.queueStream([sc.parallelize(b, 2) for b in batches], oneAtATime=True)
    windowed = windowed.reduceByKeyAndWindow(operator.add, operator.sub, 5, 1, 2)
    windowed.checkpoint(4)
    windowed.foreachRDD(lambda rdd: seen.append(rdd.count()))
    run_batches(ssc, 8)
    assert len(seen) == 8
    assert jobs_per_batch(ssc, sc) == [1, 1, 1, 2, 1, 1, 1, 2]
    logged = [c["state"] for c in (ssc._scheduler._checkpoint.load_log().commits.values())]
    durable_dirs = {entry["path"] for state in logged for entry in state.values()}
    assert sum(durable.is_durable(path) for path in durable_dirs) == 8


def test_every_batchs_jobs_run_in_its_own_group_and_checkpoint_marked_ancestors(sc):
    """The runner sets Spark's checkpointAllMarkedAncestors once for its thread and each
    batch's job group per batch: every batch's output runs under both."""
    ssc = manual_context(sc)
    seen: list[tuple[str, str]] = []
    stream = ssc.queueStream([sc.parallelize([1])] * 3, oneAtATime=True)
    stream.foreachRDD(
        lambda _rdd: seen.append(
            (sc.getLocalProperty("spark.jobGroup.id"), sc.getLocalProperty(CHECKPOINT_ALL_MARKED))
        )
    )
    run_batches(ssc, 3)
    assert [marked for _group, marked in seen] == ["true"] * 3
    groups = [group for group, _marked in seen]
    assert len(set(groups)) == 3 and all(g.startswith("dstream-batch-") for g in groups)


def test_each_run_writes_its_durable_batches_under_its_own_checkpoint(sc, tmp_path):
    """The graph reads the run's state directory once, when the StreamingContext is given
    its checkpoint: a second run on the same SparkContext, with a checkpoint of its own,
    writes its durable batches there, each in a directory of its own, not into the first's."""
    for name in ("first", "second"):
        ssc = manual_context(sc)
        ssc.checkpoint(str(tmp_path / name))
        pairs = ssc.queueStream([sc.parallelize([(k, 1) for k in range(20)], 2)] * 3)
        windowed = pairs.reduceByKeyAndWindow(operator.add, operator.sub, 5, 1, 2)
        windowed.foreachRDD(lambda rdd: rdd.count())
        run_batches(ssc, 3)
        commits = ssc._scheduler._checkpoint.load_log().commits
        written = {e["path"] for c in commits.values() for e in c["state"].values()}
        assert len(written) == 3
        run_dirs = {local_path(path).parent for path in written}
        assert [run.parent for run in run_dirs] == [(tmp_path / name / "state").resolve()]
        assert all(durable.check_parts(path) == 2 for path in written)


def test_partitions_an_output_did_not_compute_are_written_by_a_job_of_their_own(sc, tmp_path):
    """pprint-like outputs take a few records: the rest of the durable batch is written after
    them, so a restart finds every part."""
    ssc = manual_context(sc)
    ssc.checkpoint(str(tmp_path / "checkpoint"))
    pairs = ssc.queueStream([sc.parallelize([(k, 1) for k in range(200)], 4)] * 3)
    windowed = pairs.reduceByKeyAndWindow(operator.add, operator.sub, 5, 1, 4)
    windowed.foreachRDD(lambda rdd: rdd.take(1))
    run_batches(ssc, 3)
    commits = ssc._scheduler._checkpoint.load_log().commits
    written = [e["path"] for c in commits.values() for e in c["state"].values()]
    assert len(written) == 3
    assert all(durable.check_parts(path) == 4 for path in written)


def test_a_part_storage_refused_is_named_in_the_jobs_failure(sc, tmp_path):
    """A task that cannot write its part fails the job; the driver names the part and the
    OS's reason, not only the output whose task broke."""
    not_a_directory = tmp_path / "a-file"
    not_a_directory.write_text("")
    pairs = sc.parallelize([("a", 1)], 1)
    writing = pairs.mapPartitionsWithIndex(durable.PartWriter(f"{not_a_directory}/rdd-1", 1))
    with pytest.raises(Exception) as failed:
        writing.collect()
    found = durable.part_write_failure(failed.value)
    assert isinstance(found, CheckpointWriteError)
    part = f"{not_a_directory}/rdd-1/part-00000"
    assert str(found) == f"cannot write checkpoint file {part}: Not a directory"
    assert durable.part_write_failure(ValueError("something else")) is None


def test_the_batches_a_window_subtracts_are_read_from_their_parts_not_the_cache(sc, tmp_path):
    """Once a batch's parts are written whole, the window keeps an RDD reading them, with the
    reduction's partitioner; the reduction is never cached, even in its own batch (the
    output's tasks add it to the window as they write it): an executor lost later takes
    nothing with it that the window subtracts (test_fault_executor_loss kills one). The source
    is still read once per batch, and the window is exact."""
    ssc = manual_context(sc)
    ssc.checkpoint(str(tmp_path / "checkpoint"))
    reads = sc.accumulator(0)

    def counted(record: tuple[str, int]) -> tuple[str, int]:
        reads.add(1)
        return record

    batches = [[("a", 1), ("b", 2)], [("a", 3)], [("c", 1)], [("a", 1)], [("b", 5)]] * 2
    pairs = ssc.queueStream([sc.parallelize(b, 2) for b in batches], oneAtATime=True)
    windowed = pairs.map(counted).reduceByKeyAndWindow(operator.add, operator.sub, 5, 1, 2)
    reduced = windowed._parents[0]
    cached: list[list[bool]] = []  # at each batch's output: are the reduction's RDDs cached?
    windowed.foreachRDD(
        lambda _rdd: cached.append([r.is_cached for r in reduced.retained().values()])
    )
    got = collect(windowed.filter(lambda kv: kv[1] != 0), len(batches), sort=True)
    kept = [reduced._generated[t] for t in sorted(reduced._generated)]
    assert reads.value == sum(len(b) for b in batches)
    assert len(kept) > 5 and all(hasattr(rdd, READ_BY) for rdd in kept)
    # the first window is the first batch's reduction itself, cached as the window
    assert len(cached) == len(batches) and not any(any(held) for held in cached[1:])
    assert all(rdd.partitioner == Partitioner(2, portable_hash) for rdd in kept)
    for end, window in enumerate(got, start=1):
        summed: Counter[str] = Counter()
        for batch in batches[max(0, end - 5) : end]:
            summed.update(dict(batch))
        assert window == sorted(kv for kv in summed.items() if kv[1] != 0)
