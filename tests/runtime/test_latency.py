"""End-to-end latency per record (dstream.runtime.control.latency): the bins and percentiles, then the rate
and file sources on a manual clock, where the test knows exactly when each record became
available and when its batch committed."""

from __future__ import annotations

import bisect
import os

import pytest
from dstream.runtime.control import latency
from dstream.runtime.control.failure import FailurePolicy
from dstream.runtime.control.latency import SliceReports
from dstream.service.metrics import StreamingMetrics
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from streams import BATCH_TIMEOUT_S, manual_context


def test_bins_are_exact_below_a_second_and_keep_three_digits_above():
    assert [latency.age_bin(a) for a in (0, 7, 999, -250)] == [0, 7, 999, -250]
    assert [latency.age_bin(a) for a in (1000, 1009, 12_345, 987_654)] == [
        1000,
        1000,
        12_300,
        987_000,
    ]
    assert latency.age_bin(-12_345) == -12_300
    assert [latency.next_bin(b) for b in (5, 999, 1000, 12_300)] == [6, 1000, 1010, 12_400]


def test_percentiles_are_nearest_rank_over_records_and_buckets_count_each_record():
    ages = {900: 1, 800: 1, 700: 1, 600: 1, 500: 1, 400: 1, 300: 1, 200: 1, 100: 1, 0: 1}
    summary = latency.summarize(ages, commit_delay_ms=100)
    assert summary is not None
    assert (summary.records, summary.p50_s, summary.p99_s) == (10, 0.5, 1.0)
    assert summary.sum_s == pytest.approx(sum(0.1 * i for i in range(1, 11)))
    by_bound = dict(zip((*latency.LATENCY_BUCKETS_S, "inf"), summary.buckets, strict=True))
    assert by_bound[0.1] == 1 and by_bound[0.25] == 1 and by_bound[0.5] == 3
    assert by_bound[0.75] == 2 and by_bound[1.0] == 3 and sum(summary.buckets) == 10
    assert latency.summarize({}, 0) is None


def test_a_slice_reported_twice_counts_once_and_old_reports_are_dropped():
    param = SliceReports()
    held = param.zero({})
    for _read in range(3):  # a task retried, a stage recomputed, a second output
        param.addInPlace(held, {(2000, 0): {100: 5}})
    param.addInPlace(held, {(2000, 1): {40: 2}, (1000, 0): {1: 1}})

    class Held:
        value = held

    assert latency.reported_ages(Held, 2000) == {100: 5, 40: 2}  # type: ignore[arg-type]
    assert held == {}  # the stale report of batch 1000 went with them


@settings(deadline=None, max_examples=50)
@given(rate=st.integers(1, 5000), batch_s=st.integers(1, 3), start=st.integers(0, 50))
def test_the_rate_schedule_gives_the_same_ages_as_visiting_every_record(rate, batch_s, start):
    """ages_of_schedule (one count per bin) against each record's own availability time."""
    batch_ms = (start + batch_s) * 1000

    def available(number: int) -> int:
        return -(-(number + 1) * 1000 // rate)

    first, last = rate * start * 1000 // 1000, rate * batch_ms // 1000
    times = [available(n) for n in range(first, last)]
    if not times:
        return

    def available_by(at_ms: int) -> int:
        return bisect.bisect_right(times, at_ms)

    expected = latency.ages_at(batch_ms, times)
    assert latency.ages_of_schedule(batch_ms, min(times), max(times), available_by) == expected


def test_a_rate_stream_measures_each_record_from_its_scheduled_time(sc):
    """10 records/s over 2 partitions: record n of batch 1 is due at (n + 1) * 100 ms and the
    batch commits at 1000 ms, when the output has also moved the clock by 250 ms."""
    ssc = manual_context(sc)
    source = ssc.rateStream(10, partitions=2)
    clock = ssc._clock
    counted = []
    source.foreachRDD(lambda rdd: counted.append(rdd.count()))
    source.foreachRDD(lambda time, rdd: clock.advance(250) if len(counted) == 2 else None)
    ssc.start()
    try:
        clock.advance(1000)
        first = ssc._scheduler.wait_for_batch(1000, BATCH_TIMEOUT_S)
        clock.advance(1000)
        second = ssc._scheduler.wait_for_batch(2000, BATCH_TIMEOUT_S)
    finally:
        ssc.stop(stopSparkContext=False)
    assert first.latency is not None and first.latency.records == 10
    # latencies 0.0, 0.1, ... 0.9 s: the 5th and the 10th by rank
    assert (first.latency.p50_s, first.latency.p99_s) == (0.4, 0.9)
    assert second.processing_end_ms == 2250  # the second batch's output moved the clock
    assert second.latency is not None and second.latency.records == 10
    assert (second.latency.p50_s, second.latency.p99_s) == (0.65, 1.15)
    assert first.to_json()["endToEndLatency"] == {
        "records": 10,
        "p50Seconds": 0.4,
        "p99Seconds": 0.9,
    }


def test_the_rate_sources_derivation_matches_each_records_availability(sc):
    ssc = manual_context(sc)
    source = ssc.rateStream(7, partitions=3)
    ssc._graph.zero_ms = 0
    planned = source.plan(3000, None)
    times = [
        source.available_at(p, offset)
        for p, (start, end) in enumerate(planned)
        for offset in range(start, end)
    ]
    assert len(times) == 21 and max(times) <= 3000
    assert sorted(times) == [-(-(n + 1) * 1000 // 7) for n in range(21)]
    assert source.record_ages(3000, planned) == latency.ages_at(3000, times)


def write_file(directory, name: str, lines: list[str], mtime_ms: int) -> None:
    """A file renamed into place whose modification time the test sets (the manual clock's
    milliseconds: the file 'arrived' then)."""
    hidden = directory / f".{name}"
    hidden.write_text("".join(f"{line}\n" for line in lines))
    os.utime(hidden, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    hidden.rename(directory / name)


def test_a_file_is_measured_from_its_arrival_once_per_record_though_read_three_times(sc, tmp_path):
    """Two outputs read the stream and the first fails once, so the batch's input is read three
    times; each record counts once, measured from its file's arrival."""
    ssc = manual_context(sc)
    stream = ssc.textFileStream(str(tmp_path))
    seen = []

    def flaky(rdd):
        seen.append(rdd.collect())
        if len(seen) == 1:
            raise RuntimeError("the sink refused the first attempt")

    stream.foreachRDD(flaky)
    stream.foreachRDD(lambda rdd: seen.append(rdd.collect()))
    ssc.start()
    ssc._scheduler.failure_policy = FailurePolicy(retries=1, backoff_s=0.01)
    try:
        write_file(tmp_path, "a.txt", ["a1", "a2", "a3"], mtime_ms=300)
        write_file(tmp_path, "b.txt", ["b1"], mtime_ms=900)
        ssc._clock.advance(1000)
        info = ssc._scheduler.wait_for_batch(1000, BATCH_TIMEOUT_S)
    finally:
        ssc.stop(stopSparkContext=False)
    assert len(seen) == 3 and info.retries == 1
    assert info.latency is not None and info.latency.records == 4
    assert (info.latency.p50_s, info.latency.p99_s) == (0.7, 0.7)
    assert info.latency.sum_s == pytest.approx(3 * 0.7 + 0.1)


def test_a_json_file_counts_its_parsed_records_not_its_malformed_lines(sc, tmp_path):
    ssc = manual_context(sc)
    stream = ssc.fileStream(str(tmp_path), format="json")
    stream.foreachRDD(lambda rdd: rdd.collect())
    ssc.start()
    try:
        write_file(tmp_path, "a.jsonl", ['{"a": 1}', "not json", '{"a": 2}'], mtime_ms=-500)
        ssc._clock.advance(1000)
        info = ssc._scheduler.wait_for_batch(1000, BATCH_TIMEOUT_S)
    finally:
        ssc.stop(stopSparkContext=False)
    assert info.latency is not None and info.latency.records == 2
    assert info.latency.p99_s == 1.5


def test_the_histogram_metric_adds_each_batchs_records(sc):
    ssc = manual_context(sc)
    ssc.rateStream(10, partitions=2).foreachRDD(lambda rdd: None)
    metrics = StreamingMetrics("latency-test", ssc, state_keys_interval_s=3600)
    ssc.addStreamingListener(metrics)
    ssc.start()
    try:
        for time_ms in (1000, 2000):
            ssc._clock.advance(1000)
            ssc._scheduler.wait_for_batch(time_ms, BATCH_TIMEOUT_S)
    finally:
        ssc.stop(stopSparkContext=False)
        metrics.close()
    text = generate_latest(metrics.registry).decode()
    series = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("dstream_end_to_end_latency_seconds")
    }
    prefix = 'dstream_end_to_end_latency_seconds_bucket{job="latency-test",le='
    assert series[prefix + '"0.1"}'] == 2 * 2  # 0.0 and 0.1 s in each batch
    assert series[prefix + '"0.5"}'] == 2 * 6
    assert series[prefix + '"+Inf"}'] == 20
    assert series['dstream_end_to_end_latency_seconds_count{job="latency-test"}'] == 20
    assert series['dstream_end_to_end_latency_seconds_sum{job="latency-test"}'] == pytest.approx(9)


def test_a_batch_without_known_availability_has_no_latency(sc):
    ssc = manual_context(sc)
    ssc.queueStream([[1, 2]]).foreachRDD(lambda rdd: rdd.collect())
    ssc.start()
    try:
        ssc._clock.advance(1000)
        info = ssc._scheduler.wait_for_batch(1000, BATCH_TIMEOUT_S)
    finally:
        ssc.stop(stopSparkContext=False)
    assert info.latency is None and info.to_json()["endToEndLatency"] is None


def test_a_file_stream_restored_from_a_checkpoint_older_than_latency_measures_too(sc, tmp_path):
    """A graph pickled before sources reported ages (no accumulator in it) restores and
    measures its records."""
    from dstream import StreamingContext
    from dstream.runtime.scheduling.clock import ManualClock

    checkpoint, inputs = str(tmp_path / "checkpoint"), tmp_path / "in"
    inputs.mkdir()

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1)
        stream = ssc.textFileStream(str(inputs))
        del stream._age_reports  # as the stream of an older checkpoint
        stream.foreachRDD(lambda rdd: rdd.count())
        return ssc

    first = StreamingContext.getOrCreate(checkpoint, setup)
    first._clock = ManualClock(0)
    first.start()
    first.stop(stopSparkContext=False)

    restored = StreamingContext.getOrCreate(checkpoint, setup)
    restored._clock = ManualClock(0)
    restored.start()
    try:
        write_file(inputs, "a.txt", ["a1", "a2"], mtime_ms=600)
        restored._clock.advance(1000)
        info = restored._scheduler.wait_for_batch(1000, BATCH_TIMEOUT_S)
    finally:
        restored.stop(stopSparkContext=False)
    assert info.latency is not None and info.latency.records == 2


def test_records_available_after_the_batch_time_count_at_age_zero_and_all_count():
    """A batch planned late takes records that arrived after its time: none is lost, none
    gets a negative age, and the work stays one count per bin."""
    times = [900, 950, 1000, 1200, 1500]  # batch time 1000: two arrived after it
    calls = []

    def available_by(at_ms: int) -> int:
        calls.append(at_ms)
        return sum(1 for t in times if t <= at_ms)

    ages = latency.ages_of_schedule(1000, min(times), max(times), available_by)
    assert ages == {100: 1, 50: 1, 0: 3}
    assert len(calls) <= 200


def test_the_first_time_a_count_is_reached_is_found_past_the_hint():
    def count_by(t: int) -> int:
        return max(0, (t - 5_000) // 7)

    assert latency.first_time_reaching(count_by, 1, 0, 1_000) == 5_007
    assert latency.first_time_reaching(count_by, 3, 0, 1_000_000) == 5_021
