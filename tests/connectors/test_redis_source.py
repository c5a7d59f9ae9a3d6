"""The Redis Streams source against a real redis-server: planning, exact reads and replays,
trimming detected, a restarting broker ridden out, bad input named."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
import redis
import yaml
from dstream import StreamingContext
from dstream.connectors.redis import RedisInputDStream, retries_within
from dstream.runtime.scheduling.clock import ManualClock
from dstream.service.metrics import StreamingMetrics
from dstream.sources import SourceError
from dstream.spec import password_env
from running_driver import run_until_exit
from streams import run_batches


@pytest.fixture
def client(redis_server):
    return redis.Redis.from_url(redis_server.url, decode_responses=True)


@pytest.fixture
def ssc(sc):
    return StreamingContext(sc, 1, clock=ManualClock())


def new_stream(client: redis.Redis, lines: list[str], field: str = "line") -> str:
    key = f"events-{uuid.uuid4().hex[:8]}"
    for line in lines:
        client.xadd(key, {field: line})
    return key


def source_for(ssc, url: str, *streams: str, **options) -> RedisInputDStream:
    return RedisInputDStream(ssc, url, list(streams), retry_seconds=10, **options)


def test_budget_is_split_by_backlog_and_ranges_read_exactly(ssc, client, redis_server):
    big = new_stream(client, [f"a{i}" for i in range(100)])
    small = new_stream(client, [f"b{i}" for i in range(50)])
    source = source_for(ssc, redis_server.url, big, small, field="line")
    assert source.backlog_by_partition() == {big: 100, small: 50}

    planned = source.plan(1000, 60)
    assert source.records_in(planned) == 60
    counts = {k: sum(c for *_, c in s["slices"]) for k, s in planned["streams"].items()}
    assert counts == {big: 40, small: 20}
    assert source.backlog(1000) == 90
    assert source.backlog_by_partition() == {big: 60, small: 30}
    assert sorted(source.compute(1000).collect()) == sorted(
        [f"a{i}" for i in range(40)] + [f"b{i}" for i in range(20)]
    )

    rest = source.plan(2000, None)
    assert source.records_in(rest) == 90
    assert len(source.compute(2000).collect()) == 90
    assert source.plan(3000, None)["streams"][big]["slices"] == []  # nothing new: empty range


def test_a_restarted_driver_replays_the_same_entries_and_goes_on_after_them(
    sc, client, redis_server
):
    key = new_stream(client, [f"x{i}" for i in range(30)])
    first = source_for(StreamingContext(sc, 1, clock=ManualClock()), redis_server.url, key)
    planned = first.plan(1000, 10)
    before = first.compute(1000).collect()
    for i in range(5):
        client.xadd(key, {"line": f"late{i}"})

    again = source_for(StreamingContext(sc, 1, clock=ManualClock()), redis_server.url, key)
    again.replay(1000, json.loads(json.dumps(planned)))  # as read back from the batch log
    assert again.compute(1000).collect() == before == [{"line": f"x{i}"} for i in range(10)]
    assert again.records_in(again.plan(2000, None)) == 25


def test_start_from_latest_skips_what_was_there(ssc, client, redis_server):
    key = new_stream(client, ["old"])
    source = source_for(ssc, redis_server.url, key, field="line", start_from="latest")
    client.xadd(key, {"line": "new"})
    source.plan(1000, None)
    assert source.compute(1000).collect() == ["new"]


def test_entries_trimmed_before_a_replay_stop_the_job_naming_stream_and_range(
    sc, client, redis_server
):
    key = new_stream(client, [f"x{i}" for i in range(20)])
    planned = source_for(StreamingContext(sc, 1, clock=ManualClock()), redis_server.url, key).plan(
        1000, None
    )
    first_id = planned["streams"][key]["slices"][0][0]
    client.xtrim(key, maxlen=5, approximate=False)
    again = source_for(StreamingContext(sc, 1, clock=ManualClock()), redis_server.url, key)
    with pytest.raises(SourceError, match=rf"redis stream '{key}'.*{first_id}\.\..*trimmed"):
        again.replay(1000, planned)


def test_entries_trimmed_before_they_were_planned_stop_the_job(ssc, client, redis_server):
    key = new_stream(client, [f"x{i}" for i in range(20)])
    source = source_for(ssc, redis_server.url, key)
    source.plan(1000, 5)
    client.xtrim(key, maxlen=3, approximate=False)  # removes 12 entries this job never read
    with pytest.raises(SourceError, match=rf"'{key}': 12 entries after .* trimmed or deleted"):
        source.plan(2000, None)


def test_a_range_trimmed_between_planning_and_reading_fails_its_task(ssc, client, redis_server):
    key = new_stream(client, [f"x{i}" for i in range(20)])
    source = source_for(ssc, redis_server.url, key)
    source.plan(1000, None)
    client.xtrim(key, maxlen=0, approximate=False)
    with pytest.raises(Exception, match=rf"redis stream '{key}'.*was trimmed before it was read"):
        source.compute(1000).collect()


def test_entries_without_the_field_are_counted_and_set_aside(ssc, client, redis_server, tmp_path):
    key = new_stream(client, ["good1"])
    bad_id = client.xadd(key, {"text": "wrong field"})
    client.xadd(key, {"line": "good2"})
    ssc.checkpoint(str(tmp_path / "checkpoint"))
    source = source_for(ssc, redis_server.url, key, field="line")
    source.plan(1000, None)
    assert source.compute(1000).collect() == ["good1", "good2"]
    assert source.malformed_records == 1
    [dead] = Path(ssc._graph.deadletter_dir(1000)).glob("*.jsonl")
    entry = json.loads(dead.read_text())
    assert entry == {
        "stream": key,
        "id": bad_id,
        "error": "no field 'line'",
        "record": {"text": "wrong field"},
    }


def test_a_broker_restart_during_a_read_is_retried_and_loses_nothing(ssc, client, redis_server):
    key = new_stream(client, [f"x{i}" for i in range(500)], field="line")
    source = source_for(ssc, redis_server.url, key, field="line")
    source.plan(1000, None)
    redis_server.stop()
    result: list[list[str]] = []
    reader = threading.Thread(target=lambda: result.append(source.compute(1000).collect()))
    reader.start()
    redis_server.start()
    reader.join(60)
    assert result == [[f"x{i}" for i in range(500)]]
    client.xadd(key, {"line": "after restart"})
    source.plan(2000, None)  # planning reconnects too
    assert source.compute(2000).collect() == ["after restart"]


def test_an_unreachable_broker_is_named(ssc):
    with pytest.raises(SourceError, match=r"cannot reach redis://127\.0\.0\.1:1/0"):
        source_for(ssc, "redis://127.0.0.1:1/0", "events")


def test_a_missing_stream_or_a_key_of_another_type_is_named(ssc, client, redis_server):
    with pytest.raises(SourceError, match=r"stream 'no-such-stream' does not exist"):
        source_for(ssc, redis_server.url, "no-such-stream")
    client.set("plain-string", "x")
    with pytest.raises(SourceError, match=r"key 'plain-string' .* is a string"):
        source_for(ssc, redis_server.url, "plain-string")


def test_backoff_retries_fit_the_time_given():
    assert retries_within(0) == 0
    assert 10 <= retries_within(20) <= 20  # 50 ms doubling up to 2 s steps
    assert retries_within(60) > retries_within(20)


def test_dstream_run_exits_naming_a_missing_stream(tmp_path, redis_server):
    manifest = tmp_path / "job.yaml"
    source = {"type": "redis", "redis": {"url": redis_server.url, "streams": ["nope"]}}
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "dstream.dev/v1alpha1",
                "kind": "StreamingJob",
                "metadata": {"name": "missing-stream"},
                "spec": {"batchInterval": "1s", "app": {"builtin": "wordcount"}, "source": source},
            }
        )
    )
    done = run_until_exit(manifest)
    assert done.returncode == 4, done.stderr[-2000:]
    assert f"error: redis source: stream 'nope' does not exist at {redis_server.url}" in done.stderr


def test_a_streaming_context_reads_every_entry_once_and_reports_lag_per_stream(
    ssc, client, redis_server
):
    first = new_stream(client, ["a b"] * 30)
    second = new_stream(client, ["b"] * 10)
    source = source_for(ssc, redis_server.url, first, second, field="line")
    counts: list[int] = []
    source.flatMap(str.split).count().foreachRDD(lambda rdd: counts.extend(rdd.collect()))
    metrics = StreamingMetrics("lagjob", ssc, state_keys_interval_s=3600)
    run_batches(ssc, 2)
    assert counts == [70]  # 30 x "a b" + 10 x "b", the second batch empty
    for _ in range(5):
        client.xadd(first, {"line": "late"})

    def lag(stream: str) -> float | None:
        labels = {"job": "lagjob", "source": "redis", "partition": stream}
        return metrics.registry.get_sample_value("dstream_partition_backlog_records", labels)

    assert (lag(first), lag(second)) == (5, 0)
    assert (
        metrics.registry.get_sample_value(
            "dstream_backlog_records", {"job": "lagjob", "source": "redis"}
        )
        == 5
    )


def test_the_password_comes_from_the_environment(ssc, client, redis_server, monkeypatch):
    key = new_stream(client, ["x"])
    client.config_set("requirepass", "s3cret")
    try:
        with pytest.raises(SourceError, match="refused the login.*DSTREAM_REDIS_PASSWORD"):
            source_for(ssc, redis_server.url, key)
        monkeypatch.setenv(password_env("redis"), "s3cret")
        source = source_for(ssc, redis_server.url, key, field="line")
        assert source.records_in(source.plan(1000, None)) == 1
    finally:
        authed = redis.Redis.from_url(redis_server.url, password="s3cret")
        authed.config_set("requirepass", "")


def test_each_entry_is_measured_from_its_id_and_counted_once_however_often_read(
    ssc, client, redis_server
):
    """Entry IDs carry the milliseconds Redis added them at (here chosen by the test); a range
    read twice reports each entry once, and an entry without the field is not counted."""
    key = f"events-{uuid.uuid4().hex[:8]}"
    for entry_id, fields in [
        ("300-0", {"line": "a"}),
        ("300-1", {"line": "b"}),
        ("700-0", {"other": "c"}),
        ("850-0", {"line": "d"}),
    ]:
        client.xadd(key, fields, id=entry_id)
    source = source_for(ssc, redis_server.url, key, field="line")
    planned = source.plan(1000, None)
    rdd = source.compute(1000)
    assert sorted(rdd.collect()) == ["a", "b", "d"] and rdd.count() == 3
    assert source.record_ages(1000, planned) == {700: 2, 150: 1}
    assert source.record_ages(1000, planned) is None  # taken once
