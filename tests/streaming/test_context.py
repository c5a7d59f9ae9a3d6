"""StreamingContext and DStream behaviour beyond per-batch results: time, output, errors,
state tracking, file streams, lifecycle and pyspark.streaming compatibility details."""

from __future__ import annotations

import os
import re
import warnings
from datetime import datetime

import pytest
from dstream import StreamingContext
from dstream.runtime.control.failure import FailurePolicy
from dstream.sources import split_budget
from streams import BATCH_TIMEOUT_S, collect, final_failure, manual_context, run_batches, run_op


def advance_one(ssc: StreamingContext) -> None:
    ssc._clock.advance(ssc._batch_ms)
    ssc._scheduler.wait_for_batch(ssc._clock.now_ms(), BATCH_TIMEOUT_S)


def test_foreach_rdd_gets_batch_time_as_datetime(sc):
    ssc = manual_context(sc)
    seen = []
    ssc.queueStream([[1], [2]]).foreachRDD(lambda t, rdd: seen.append((t, rdd.collect())))
    run_batches(ssc, 2)
    assert seen == [(datetime.fromtimestamp(1), [1]), (datetime.fromtimestamp(2), [2])]


def test_pprint_prints_like_pyspark_streaming(sc, capsys):
    ssc = manual_context(sc)
    ssc.queueStream([list(range(12))]).pprint(num=10)
    run_batches(ssc, 1)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "-------------------------------------------",
        f"Time: {datetime.fromtimestamp(1)}",
        "-------------------------------------------",
    ]
    assert lines[3:14] == [str(i) for i in range(10)] + ["..."]


def test_save_as_text_files_writes_one_directory_per_batch(sc, tmp_path):
    ssc = manual_context(sc)
    ssc.queueStream([["a", "b"], ["c"]]).saveAsTextFiles(str(tmp_path / "out"), "txt")
    run_batches(ssc, 2)
    first = tmp_path / "out-1000.txt"
    assert (first / "_SUCCESS").exists()
    assert sorted("".join(p.read_text() for p in first.glob("part-*")).split()) == ["a", "b"]
    assert (tmp_path / "out-2000.txt").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_slice_returns_retained_rdds_of_a_time_range(sc):
    ssc = manual_context(sc)
    ssc.remember(10)
    stream = ssc.queueStream([[1], [2], [3], [4]])
    stream.foreachRDD(lambda rdd: None)
    run_batches(ssc, 4)
    rdds = stream.slice(datetime.fromtimestamp(2), datetime.fromtimestamp(3))
    assert [rdd.collect() for rdd in rdds] == [[2], [3]]
    assert [r.collect() for r in stream.slice(1.5, 2.5)] == [[1], [2]]


def start_with_policy(ssc: StreamingContext, policy: FailurePolicy) -> None:
    """Start on the manual clock with a failure policy (a job sets it through its spec or
    `spark.dstream.failurePolicy.*`; the session's SparkContext is shared, so tests set it here
    before the first batch time comes)."""
    ssc.start()
    ssc._scheduler.failure_policy = policy


def explode_on_two(attempts_to_fail: int | None):
    """A map function that fails on the record 2, for its first `attempts_to_fail` attempts
    (None: always). Attempts are counted in a file: tasks run in Python workers."""

    def explode(x: int, counter: str) -> int:
        if x == 2:
            with open(counter, "a") as seen:
                seen.write("x")
            if attempts_to_fail is None or os.path.getsize(counter) <= attempts_to_fail:
                raise ValueError("This is a special error")
        return x

    return explode


def failing_context(sc, tmp_path, attempts_to_fail: int | None):
    ssc = manual_context(sc)
    results = []
    counter = str(tmp_path / "attempts")
    explode = explode_on_two(attempts_to_fail)
    ssc.queueStream([[1], [2], [3]]).map(lambda x: explode(x, counter)).foreachRDD(
        lambda rdd: results.append(rdd.collect())
    )
    return ssc, results


def test_with_skip_a_failing_batch_is_committed_with_its_error_and_later_batches_run(sc, tmp_path):
    """pyspark.streaming's behaviour, which dstream keeps only when asked (onExhausted: skip)."""
    ssc, results = failing_context(sc, tmp_path, None)
    start_with_policy(ssc, FailurePolicy(retries=0, on_exhausted="skip"))
    for _ in range(3):
        advance_one(ssc)
    with pytest.raises(Exception, match="This is a special error"):
        ssc.awaitTerminationOrTimeout(5)
    assert results == [[1], [3]]
    failed = [i for i in ssc._scheduler.history if i.error]
    assert [(i.batch_time_ms, i.skipped) for i in failed] == [(2000, True)]
    assert ssc.awaitTerminationOrTimeout(0.1) is False
    ssc.stop(stopSparkContext=False)


def test_a_failing_batch_is_retried_until_it_succeeds(sc, tmp_path):
    ssc, results = failing_context(sc, tmp_path, 2)
    start_with_policy(ssc, FailurePolicy(retries=3, backoff_s=0.05))
    for _ in range(3):
        advance_one(ssc)
    assert results == [[1], [2], [3]]
    assert [(i.retries, i.error) for i in ssc._scheduler.history] == [
        (0, None),
        (2, None),
        (0, None),
    ]
    ssc.stop(stopSparkContext=False)


def stop_at_two(x: int) -> int:
    if x == 2:
        raise StopIteration("a user's function ended its own iteration")
    return x


@pytest.mark.parametrize(
    "op",
    [
        lambda s: s.map(stop_at_two),
        lambda s: s.flatMap(lambda x: [stop_at_two(x)]),
        lambda s: s.filter(lambda x: stop_at_two(x) > 0),
        lambda s: s.map(lambda x: ("k", 1)).reduceByKey(lambda a, b: stop_at_two(a + b)),
        lambda s: s.map(lambda x: ("k", x)).combineByKey(stop_at_two, max, max),
    ],
    ids=["map", "flatMap", "filter", "reduceByKey", "combineByKey"],
)
def test_a_stop_iteration_from_a_users_function_fails_the_batch_instead_of_truncating_it(sc, op):
    """Raised where the engine iterates, a StopIteration would end the partition early and
    lose its later records without a word; PySpark makes it fail the task, and so must we."""
    ssc = manual_context(sc)
    results = []
    op(ssc.queueStream([[1, 2, 3]])).foreachRDD(lambda rdd: results.append(rdd.collect()))
    start_with_policy(ssc, FailurePolicy(retries=0, on_exhausted="skip"))
    advance_one(ssc)
    with pytest.raises(Exception, match="StopIteration"):
        ssc.awaitTerminationOrTimeout(5)
    assert results == []
    ssc.stop(stopSparkContext=False)


def test_when_the_retries_are_spent_the_run_stops_with_the_batch_uncommitted(sc, tmp_path):
    ssc, results = failing_context(sc, tmp_path, None)
    start_with_policy(ssc, FailurePolicy(retries=2, backoff_s=0.05))
    advance_one(ssc)
    ssc._clock.advance(ssc._batch_ms)
    failed = final_failure(ssc)
    assert re.search(r"failed after 2 retries and was not committed", str(failed))
    ssc._clock.advance(ssc._batch_ms)  # batch 3 is due: no runner takes it
    assert results == [[1]]
    (ok, failed) = ssc._scheduler.history
    assert (failed.batch_time_ms, failed.retries, failed.skipped) == (2000, 2, False)
    assert "This is a special error" in failed.error
    ssc.stop(stopSparkContext=False)


def test_track_creates_updates_ends_and_times_out_keys(sc):
    events = [
        [("u1", "a"), ("u2", "b")],
        [("u1", "c")],
        [("u2", "d")],
        [("u1", "stop")],
        [],
    ]

    def track(stream):
        return stream.track(
            init=lambda _key, event: [event],
            update=lambda _key, state, event: None if event == "stop" else state + [event],
            timeout=2,
        )

    assert run_op(sc, events, track, sort=True) == [
        [("u1", ["a"]), ("u2", ["b"])],
        [("u1", ["a", "c"]), ("u2", ["b"])],
        [("u1", ["a", "c"]), ("u2", ["b", "d"])],
        [("u2", ["b", "d"])],
        [],
    ]


def test_state_without_checkpoint_directory_cuts_lineage_locally(sc):
    def running_total(stream):
        return stream.map(lambda x: ("n", x)).updateStateByKey(
            lambda values, state: sum(values) + (state or 0)
        )

    results = run_op(sc, [[1]] * 12, running_total)
    assert results == [[("n", i)] for i in range(1, 13)]


def test_text_file_stream_reads_new_files_in_name_order(sc, tmp_path):
    (tmp_path / "old.txt").write_text("present before start\n")
    ssc = manual_context(sc)
    results = []
    ssc.textFileStream(str(tmp_path)).foreachRDD(lambda rdd: results.append(rdd.collect()))
    ssc.start()
    (tmp_path / "b.txt").write_text("b1\nb2\n")
    (tmp_path / "a.txt").write_text("a1\n")
    (tmp_path / ".hidden").write_text("no\n")
    (tmp_path / "_temporary").write_text("no\n")
    advance_one(ssc)
    (tmp_path / "c.txt").write_text("c1\n")
    advance_one(ssc)
    advance_one(ssc)
    ssc.stop(stopSparkContext=False)
    assert results == [["a1", "b1", "b2"], ["c1"], []]


def test_queue_stream_default_and_all_at_once(sc):
    assert run_op(sc, [[1], [2]], lambda s: s, batches=1) == [[1]]
    ssc = manual_context(sc)
    stream = ssc.queueStream([[1], [2]], oneAtATime=False, default=[0])
    assert collect(stream, 2, sort=True) == [[1, 2], [0]]


def test_union_and_transform_of_many_streams(sc):
    ssc = manual_context(sc)
    a, b, c = (ssc.queueStream([[n]]) for n in (1, 2, 3))
    joined = ssc.transform([a, b, c], lambda rdds: rdds[0].union(rdds[1]).union(rdds[2]))
    both = ssc.union(joined, ssc.union(a))
    assert collect(both, 1, sort=True) == [[1, 1, 2, 3]]


def test_no_future_warning_unlike_pyspark_streaming(sc):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ssc = manual_context(sc)
        ssc.queueStream([[1]]).foreachRDD(lambda rdd: None)
        run_batches(ssc, 1)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]


def test_active_context_lifecycle(sc):
    ssc = manual_context(sc)
    ssc.queueStream([[1]]).foreachRDD(lambda rdd: None)
    assert StreamingContext.getActive() is None
    ssc.start()
    assert StreamingContext.getActive() is ssc
    assert StreamingContext.getActiveOrCreate(None, lambda: pytest.fail("created")) is ssc
    with pytest.raises(RuntimeError, match="already been started"):
        ssc.start()
    ssc.stop(stopSparkContext=False)
    assert StreamingContext.getActive() is None
    with pytest.raises(RuntimeError, match="already been stopped"):
        ssc.start()


def test_start_without_outputs_is_an_error(sc):
    ssc = manual_context(sc)
    ssc.queueStream([[1]]).map(str)
    with pytest.raises(ValueError, match="No output operations"):
        ssc.start()


@pytest.mark.parametrize(
    "define",
    [
        lambda s: s.window(1.5),
        lambda s: s.window(2, 0.5),
        lambda s: s.reduceByKeyAndWindow(lambda a, b: a + b, None, 0.1, 0.1),
        lambda s: s.countByWindow(3, 1.5),
    ],
    ids=["window", "slide", "reduceByKeyAndWindow", "countByWindow"],
)
def test_window_not_multiple_of_batch_is_rejected_at_definition(sc, define):
    ssc = manual_context(sc)
    with pytest.raises(ValueError, match="must be multiple of the parent dstream's slide"):
        define(ssc.queueStream([[1]]))


def test_rate_stream_is_deterministic_and_replayable(sc):
    def run() -> list[list[str]]:
        ssc = manual_context(sc)
        return collect(ssc.rateStream(1000, partitions=2, seed=3, recordBytes=40), 2)

    first, second = run(), run()
    assert first == second
    assert [len(batch) for batch in first] == [1000, 1000]
    assert all(len(line) == 40 for line in first[0])
    assert first[0] != first[1]


def test_split_budget_shares_in_proportion_to_backlog():
    assert split_budget([100, 300], None) == [100, 300]
    assert split_budget([100, 300], 1000) == [100, 300]
    assert split_budget([100, 300], 200) == [50, 150]
    assert sum(split_budget([7, 11, 13], 10)) == 10


def test_checkpoint_interval_must_be_multiple_of_slide(sc):
    ssc = manual_context(sc)
    with pytest.raises(ValueError, match="multiple of the slide"):
        ssc.queueStream([[1]]).checkpoint(1.5)
