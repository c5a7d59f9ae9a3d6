"""The Kafka source against a real broker (tests/kafka_server.py): planning by lag, exact reads
and replays, transactions, data loss, new partitions, bad input, and every error named."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conditions import eventually
from dstream import StreamingContext
from dstream.connectors.kafka_source import KafkaInputDStream
from dstream.runtime.scheduling.clock import ManualClock
from dstream.service.metrics import StreamingMetrics
from dstream.sources import SourceError
from dstream.spec import KafkaSource, SpecError, parse_job, password_env
from kafka_server import SASL_PASSWORD, SASL_USER, produce, transaction, wait_until_stable
from running_driver import manifest, run_until_exit
from streams import assert_stamped_between, run_batches


@pytest.fixture
def ssc(sc):
    return StreamingContext(sc, 1, clock=ManualClock())


def new_topic(kafka_server, partitions: int = 1) -> str:
    name = f"events-{uuid.uuid4().hex[:8]}"
    kafka_server.create_topic(name, partitions)
    return name


def settings(kafka_server, topic: str | None = None, **options) -> KafkaSource:
    fields = {"bootstrapServers": kafka_server.bootstrap, **options}
    if topic is not None:
        fields["topics"] = [topic]
    return KafkaSource.model_validate(fields)


def source_for(ssc, kafka_server, topic: str | None = None, **options) -> KafkaInputDStream:
    return KafkaInputDStream(ssc, settings(kafka_server, topic, **options), retry_seconds=20)


def test_budget_is_split_by_lag_and_ranges_read_exactly(ssc, kafka_server):
    topic = new_topic(kafka_server, 2)
    produce(kafka_server.bootstrap, topic, [f"a{i}" for i in range(100)], partition=0)
    produce(kafka_server.bootstrap, topic, [f"b{i}" for i in range(50)], partition=1)
    source = source_for(ssc, kafka_server, topic)
    assert source.backlog_by_partition() == {f"{topic}-0": 100, f"{topic}-1": 50}

    planned = source.plan(1000, 60)
    assert planned["slices"] == [[topic, 0, 0, 40], [topic, 1, 0, 20]]
    assert source.records_in(planned) == 60
    assert source.backlog_by_partition() == {f"{topic}-0": 60, f"{topic}-1": 30}
    assert sorted(source.compute(1000).collect()) == sorted(
        [f"a{i}" for i in range(40)] + [f"b{i}" for i in range(20)]
    )
    rest = source.plan(2000, None)
    assert source.records_in(rest) == 90
    assert len(source.compute(2000).collect()) == 90
    assert source.plan(3000, None)["slices"] == []  # nothing new: an empty batch


def test_a_task_asks_the_broker_for_no_more_than_its_range_holds(sc, kafka_server):
    """consume() returns once it has all the messages it was asked for, or at its timeout: a
    task asking for a full chunk at the end of its range would wait out the timeout on every
    batch. The read asks for what the range has left, and ends there."""
    from confluent_kafka import TopicPartition
    from dstream.connectors.kafka_source import RangeReader

    topic = new_topic(kafka_server)
    produce(kafka_server.bootstrap, topic, [f"r{i}" for i in range(10)])
    reader = RangeReader(settings(kafka_server, topic), "", sc.accumulator(0), 20)
    consumer = reader.consumer()
    asked: list[int] = []

    class Recording:
        def consume(self, num_messages: int, timeout: float):
            asked.append(num_messages)
            return consumer.consume(num_messages=num_messages, timeout=timeout)

    try:
        consumer.assign([TopicPartition(topic, 0, 4)])
        read = [m.value() for m in reader.messages(Recording(), topic, 0, 4, 7)]
    finally:
        consumer.close()
    assert read == [b"r4", b"r5", b"r6"]
    assert asked and asked[0] == 3 and all(n <= 3 for n in asked), asked


def test_max_records_per_partition_and_min_partitions_shape_the_tasks(ssc, kafka_server):
    topic = new_topic(kafka_server, 2)
    produce(kafka_server.bootstrap, topic, [f"hot{i}" for i in range(900)], partition=0)
    produce(kafka_server.bootstrap, topic, [f"cold{i}" for i in range(10)], partition=1)
    source = source_for(ssc, kafka_server, topic, maxRecordsPerPartition=600, minPartitions=4)
    planned = source.plan(1000, None)
    by_partition = {}
    for _t, partition, start, until in planned["slices"]:
        by_partition.setdefault(partition, []).append((start, until))
    assert by_partition[0] == [(0, 150), (150, 300), (300, 450), (450, 600)]  # hot: 4 tasks
    assert by_partition[1] == [(0, 10)]
    assert len(source.compute(1000).collect()) == 610


def test_a_restarted_driver_replays_the_same_records_and_goes_on_after_them(sc, kafka_server):
    topic = new_topic(kafka_server)
    produce(kafka_server.bootstrap, topic, [f"x{i}" for i in range(30)])
    first = source_for(StreamingContext(sc, 1, clock=ManualClock()), kafka_server, topic)
    planned = first.plan(1000, 10)
    before = first.compute(1000).collect()
    produce(kafka_server.bootstrap, topic, [f"late{i}" for i in range(5)])

    again = source_for(StreamingContext(sc, 1, clock=ManualClock()), kafka_server, topic)
    again.replay(1000, json.loads(json.dumps(planned)))  # as read back from the batch log
    assert again.compute(1000).collect() == before == [f"x{i}" for i in range(10)]
    assert again.records_in(again.plan(2000, None)) == 25


def test_starting_offsets_latest_timestamp_and_per_partition(ssc, kafka_server):
    topic = new_topic(kafka_server, 2)
    produce(kafka_server.bootstrap, topic, ["old0", "old1"], partition=0)
    produce(kafka_server.bootstrap, topic, ["p1-0", "p1-1", "p1-2"], partition=1)
    latest = source_for(ssc, kafka_server, topic, startingOffsets="latest")
    offsets = source_for(ssc, kafka_server, topic, startingOffsets=f'{{"{topic}": {{"1": 2}}}}')
    future = source_for(ssc, kafka_server, topic, startingOffsets="2999-01-01T00:00:00Z")
    past = source_for(ssc, kafka_server, topic, startingOffsets="2000-01-01T00:00:00+01:00")
    produce(kafka_server.bootstrap, topic, ["new"], partition=0)
    latest.plan(1000, None)
    assert latest.compute(1000).collect() == ["new"]
    offsets.plan(1000, None)  # partition 0 unlisted: from its beginning; partition 1 from 2
    assert sorted(offsets.compute(1000).collect()) == ["new", "old0", "old1", "p1-2"]
    future.plan(1000, None)  # no record at or after the timestamp: from the end at the start
    assert future.compute(1000).collect() == ["new"]
    past.plan(1000, None)
    assert len(past.compute(1000).collect()) == 6


def test_read_committed_skips_aborted_records_and_ends_ranges_on_markers(ssc, kafka_server):
    topic = new_topic(kafka_server)
    transaction(kafka_server.bootstrap, topic, ["c1", "c2"], commit=True)
    transaction(kafka_server.bootstrap, topic, ["gone1", "gone2", "gone3"], commit=False)
    produce(kafka_server.bootstrap, topic, ["plain"])
    transaction(kafka_server.bootstrap, topic, ["c3"], commit=True)  # ends on its marker
    committed = source_for(ssc, kafka_server, topic)
    planned = committed.plan(1000, None)
    assert planned["slices"] == [[topic, 0, 0, 10]]  # 2+1 + 3+1 + 1 + 1+1 offsets
    assert committed.compute(1000).collect() == ["c1", "c2", "plain", "c3"]
    everything = source_for(ssc, kafka_server, topic, isolation="read_uncommitted")
    everything.plan(1000, None)
    assert everything.compute(1000).collect() == ["c1", "c2", "gone1", "gone2", "gone3"] + [
        "plain",
        "c3",
    ]


def test_each_record_is_measured_from_its_kafka_timestamp_once_however_often_read(
    ssc, kafka_server
):
    """On a LogAppendTime topic the broker stamps a record when it appends it, between the
    producer's clock readings before and after; a range read twice reports each record once."""
    topic = f"stamped-{uuid.uuid4().hex[:8]}"
    kafka_server.create_topic(topic, 2, **{"message.timestamp.type": "LogAppendTime"})
    before_ms = int(time.time() * 1000)
    produce(kafka_server.bootstrap, topic, [f"s{i}" for i in range(30)])
    after_ms = int(time.time() * 1000)
    source = source_for(ssc, kafka_server, topic)
    assert_stamped_between(source, 30, before_ms, after_ms)


def test_an_open_transaction_is_not_planned_until_it_ends(ssc, kafka_server):
    from confluent_kafka import Producer

    topic = new_topic(kafka_server)
    produce(kafka_server.bootstrap, topic, ["before"])
    producer = Producer(
        {"bootstrap.servers": kafka_server.bootstrap, "transactional.id": f"open-{topic}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value="pending")
    producer.flush(30)
    produce(kafka_server.bootstrap, topic, ["after"])
    source = source_for(ssc, kafka_server, topic)
    assert source.plan(1000, None)["slices"] == [[topic, 0, 0, 1]]  # stops at the LSO
    assert source.compute(1000).collect() == ["before"]
    producer.commit_transaction(30)
    wait_until_stable(kafka_server.bootstrap, topic)
    source.plan(2000, None)
    assert source.compute(2000).collect() == ["pending", "after"]


def test_retention_of_a_recorded_range_stops_the_job_naming_it(sc, kafka_server):
    from confluent_kafka import TopicPartition

    topic = new_topic(kafka_server)
    produce(kafka_server.bootstrap, topic, [f"x{i}" for i in range(20)])
    planned = source_for(StreamingContext(sc, 1, clock=ManualClock()), kafka_server, topic).plan(
        1000, None
    )
    admin = kafka_server.admin()  # delete_records moves the log start as retention does
    admin.delete_records([TopicPartition(topic, 0, 15)])[TopicPartition(topic, 0, 15)].result(30)
    again = source_for(StreamingContext(sc, 1, clock=ManualClock()), kafka_server, topic)
    with pytest.raises(SourceError, match=rf"data loss: {topic}-0 offsets \[0, 15\) of a recorded"):
        again.replay(1000, planned)
    with pytest.raises(Exception, match=rf"data loss: {topic}-0 offsets \[0, 20\) of a recorded"):
        again._ranges[1000] = planned  # a task meets it too (planned, then removed)
        again.compute(1000).collect()


def test_retention_before_planning_fails_or_with_skip_is_counted_and_logged(
    ssc, kafka_server, caplog
):
    from confluent_kafka import TopicPartition

    topic = new_topic(kafka_server)
    produce(kafka_server.bootstrap, topic, [f"x{i}" for i in range(20)])
    failing = source_for(ssc, kafka_server, topic)
    skipping = source_for(ssc, kafka_server, topic, onDataLoss="skip")
    metrics = StreamingMetrics("lossjob", ssc, state_keys_interval_s=3600)
    failing.plan(1000, 5)
    skipping.plan(1000, 5)
    admin = kafka_server.admin()
    admin.delete_records([TopicPartition(topic, 0, 12)])[TopicPartition(topic, 0, 12)].result(30)
    with pytest.raises(SourceError, match=rf"{topic}-0 offsets \[5, 12\) was removed"):
        failing.plan(2000, None)
    planned = skipping.plan(2000, None)
    assert planned["lost"] == [[topic, 0, 5, 12]]
    labels = {"job": "lossjob", "source": skipping.name, "partition": f"{topic}-0"}
    assert metrics.registry.get_sample_value("dstream_source_records_lost_total", labels) == 7
    assert f"skipped (onDataLoss: skip): {topic}-0 offsets [5, 12) was removed" in caplog.text
    assert skipping.compute(2000).collect() == [f"x{i}" for i in range(12, 20)]


def test_a_partition_added_while_running_is_read_from_its_start(ssc, kafka_server):
    topic = new_topic(kafka_server)
    source = source_for(ssc, kafka_server, topic, startingOffsets="latest")
    produce(kafka_server.bootstrap, topic, ["p0"], partition=0)
    source.plan(1000, None)
    assert source.compute(1000).collect() == ["p0"]
    kafka_server.add_partitions(topic, 2)
    produce(kafka_server.bootstrap, topic, ["p1-first", "p1-second"], partition=1)
    source.plan(2000, None)
    assert source.compute(2000).collect() == ["p1-first", "p1-second"]


def test_a_pattern_picks_up_new_topics(ssc, kafka_server):
    prefix = f"logs{uuid.uuid4().hex[:6]}"
    kafka_server.create_topic(f"{prefix}.a")
    kafka_server.create_topic(f"other{prefix}")
    produce(kafka_server.bootstrap, f"{prefix}.a", ["a"])
    produce(kafka_server.bootstrap, f"other{prefix}", ["not matched"])
    source = source_for(ssc, kafka_server, topicPattern=rf"{prefix}\..*")
    source.plan(1000, None)
    assert source.compute(1000).collect() == ["a"]
    kafka_server.create_topic(f"{prefix}.b")
    produce(kafka_server.bootstrap, f"{prefix}.b", ["b"])
    source.plan(2000, None)
    assert source.compute(2000).collect() == ["b"]


def test_undecodable_records_are_counted_and_set_aside(ssc, kafka_server, tmp_path):
    topic = new_topic(kafka_server)
    produce(kafka_server.bootstrap, topic, [b'{"n": 1}', b"\xff\xfe not utf-8", b"{broken", b"[2]"])
    ssc.checkpoint(str(tmp_path / "checkpoint"))
    source = source_for(ssc, kafka_server, topic, format="json")
    source.plan(1000, None)
    assert source.compute(1000).collect() == [{"n": 1}, [2]]
    assert source.malformed_records == 2
    [dead] = Path(ssc._graph.deadletter_dir(1000)).glob("*.jsonl")
    entries = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [(e["topic"], e["partition"], e["offset"]) for e in entries] == [
        (topic, 0, 1),
        (topic, 0, 2),
    ]
    assert entries[0]["error"].startswith("not UTF-8")
    assert entries[1]["error"].startswith("not JSON")


def test_a_broker_restart_between_planning_and_reading_loses_nothing(ssc, kafka_server):
    topic = new_topic(kafka_server, 2)
    produce(kafka_server.bootstrap, topic, [f"x{i}" for i in range(300)])
    source = source_for(ssc, kafka_server, topic)
    source.plan(1000, None)
    kafka_server.restart()
    assert sorted(source.compute(1000).collect()) == sorted(f"x{i}" for i in range(300))
    produce(kafka_server.bootstrap, topic, ["after restart"])
    source.plan(2000, None)
    assert source.compute(2000).collect() == ["after restart"]


def test_an_unreachable_broker_an_unknown_topic_and_a_refused_login_are_named(
    ssc, kafka_server, monkeypatch
):
    nowhere = KafkaSource.model_validate({"bootstrapServers": "127.0.0.1:1", "topics": ["t"]})
    with pytest.raises(SourceError, match=r"kafka 127\.0\.0\.1:1 unreachable"):
        KafkaInputDStream(ssc, nowhere)
    with pytest.raises(SourceError, match=r"topic 'no-such-topic' does not exist.*--create"):
        source_for(ssc, kafka_server, "no-such-topic")
    topic = new_topic(kafka_server)
    login = {
        "bootstrapServers": kafka_server.sasl_bootstrap,
        "topics": [topic],
        "securityProtocol": "SASL_PLAINTEXT",
        "saslMechanism": "PLAIN",
        "username": SASL_USER,
        "passwordSecret": {"name": "kafka-login", "key": "password"},
    }
    with pytest.raises(SourceError, match=r"DSTREAM_KAFKA_PASSWORD is not in the environment"):
        KafkaInputDStream(ssc, KafkaSource.model_validate(login))
    monkeypatch.setenv(password_env("kafka"), "wrong")
    with pytest.raises(SourceError, match=r"refused the login.*DSTREAM_KAFKA_PASSWORD"):
        KafkaInputDStream(ssc, KafkaSource.model_validate(login))
    monkeypatch.setenv(password_env("kafka"), SASL_PASSWORD)
    produce(kafka_server.bootstrap, topic, ["over sasl"])
    source = KafkaInputDStream(ssc, KafkaSource.model_validate(login))
    # planning logs in (the tasks' Python workers keep the environment they started with)
    assert source.records_in(source.plan(1000, None)) == 1


def job_with_source(kafka: dict) -> dict:
    source = {"type": "kafka", "kafka": kafka}
    return manifest(
        "kafka-job", {"batchInterval": "1s", "app": {"builtin": "wordcount"}, "source": source}
    )


@pytest.mark.parametrize(
    ("kafka", "problem"),
    [
        ({"topics": ["t"]}, "spec.source.kafka.bootstrapServers: Field required"),
        ({"bootstrapServers": "localhost", "topics": ["t"]}, "bootstrapServers: String should"),
        ({"bootstrapServers": "h:9092"}, "set exactly one of topics or topicPattern"),
        ({"bootstrapServers": "h:9092", "topics": []}, "topics: List should have at least 1"),
        ({"bootstrapServers": "h:9092", "topicPattern": "("}, "topicPattern: Value error, not a"),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "startingOffsets": "yesterday"},
            "startingOffsets: Value error, expected earliest, latest",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "startingOffsets": "2026-01-01T00:00"},
            "startingOffsets: Value error, the timestamp needs a time zone",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "startingOffsets": '{"t": 3}'},
            "startingOffsets: Value error, per-partition offsets must be JSON",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "isolation": "dirty"},
            "isolation: Input should be 'read_committed' or 'read_uncommitted'",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "maxRecordsPerPartition": 0},
            "maxRecordsPerPartition: Input should be greater than or equal to 1",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "minPartitions": 0},
            "minPartitions: Input should be greater than or equal to 1",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "format": "avro"},
            "format: Input should be 'text' or 'json'",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "onDataLoss": "ignore"},
            "onDataLoss: Input should be 'fail' or 'skip'",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "clientProperties": {"group.id": "g"}},
            "clientProperties: Value error, 'group.id' is set by the connector",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "securityProtocol": "SASL_SSL"},
            "securityProtocol SASL_SSL needs saslMechanism and username",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "saslMechanism": "PLAIN"},
            "saslMechanism needs a SASL_ securityProtocol",
        ),
        (
            {"bootstrapServers": "h:9092", "topics": ["t"], "offsets": "earliest"},
            "spec.source.kafka.offsets: Extra inputs are not permitted",
        ),
    ],
)
def test_every_spec_error_names_its_field(kafka, problem):
    with pytest.raises(SpecError) as raised:
        parse_job(job_with_source(kafka))
    assert any(problem in p for p in raised.value.problems), raised.value.problems


def test_dstream_run_exits_naming_an_unknown_topic(tmp_path, kafka_server):
    path = tmp_path / "job.yaml"
    kafka = {"bootstrapServers": kafka_server.bootstrap, "topics": ["nope"]}
    path.write_text(yaml.safe_dump(job_with_source(kafka)))
    done = run_until_exit(path)
    assert done.returncode == 4, done.stderr[-2000:]
    assert "error: kafka topic 'nope' does not exist" in done.stderr


def test_a_streaming_context_reads_every_record_once_reports_lag_and_commits_the_group(
    ssc, kafka_server
):
    topic = new_topic(kafka_server, 3)
    keys = ["hot"] * 14_000 + [f"k{i}" for i in range(6_000)]  # one partition gets the most
    produce(kafka_server.bootstrap, topic, ["a b"] * 20_000, keys=keys)
    source = source_for(ssc, kafka_server, topic, groupId=f"lag-{topic}", minPartitions=6)
    counts: list[int] = []
    source.flatMap(str.split).count().foreachRDD(lambda rdd: counts.extend(rdd.collect()))
    metrics = StreamingMetrics("lagjob", ssc, state_keys_interval_s=3600)
    run_batches(ssc, 2)
    assert counts == [40_000]  # the second batch is empty
    produce(kafka_server.bootstrap, topic, ["late"] * 5, keys=["hot"] * 5)

    def lag(partition: int) -> float | None:
        labels = {"job": "lagjob", "source": "kafka", "partition": f"{topic}-{partition}"}
        return metrics.registry.get_sample_value("dstream_partition_backlog_records", labels)

    assert sorted([lag(0), lag(1), lag(2)]) == [0, 0, 5]
    assert_group_committed(kafka_server, f"lag-{topic}", topic, total=20_000)


def assert_group_committed(kafka_server, group: str, topic: str, total: int) -> None:
    """The group's committed offsets (what lag tools read) add up to what the job read."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka_server.bootstrap, "group.id": group})
    partitions = [TopicPartition(topic, p) for p in range(3)]

    def committed() -> int:
        return sum(max(0, tp.offset) for tp in consumer.committed(partitions, timeout=10))

    try:
        eventually(
            lambda: committed() == total, 30, message=f"group {group} committed {total} offsets"
        )
    finally:
        consumer.close()


def test_a_deleted_topic_stops_the_job_or_with_a_pattern_and_skip_is_dropped(ssc, kafka_server):
    prefix = f"gone{uuid.uuid4().hex[:6]}"
    for suffix in ("a", "b"):
        kafka_server.create_topic(f"{prefix}.{suffix}")
        produce(kafka_server.bootstrap, f"{prefix}.{suffix}", [suffix])
    listed = source_for(ssc, kafka_server, f"{prefix}.a")
    matched = source_for(ssc, kafka_server, topicPattern=rf"{prefix}\..*")
    skipping = source_for(ssc, kafka_server, topicPattern=rf"{prefix}\..*", onDataLoss="skip")
    for source in (listed, matched, skipping):
        source.plan(1000, None)
    admin = kafka_server.admin()
    admin.delete_topics([f"{prefix}.a"])[f"{prefix}.a"].result(30)
    eventually(
        lambda: f"{prefix}.a" not in admin.list_topics(timeout=10).topics, 30, message="deleted"
    )
    with pytest.raises(SourceError, match=rf"topic '{prefix}\.a' was deleted"):
        listed.plan(2000, None)
    with pytest.raises(SourceError, match=rf"{prefix}\.a-0 .* is gone: topic {prefix}\.a was"):
        matched.plan(2000, None)
    produce(kafka_server.bootstrap, f"{prefix}.b", ["b2"])
    skipping.plan(2000, None)
    assert skipping.compute(2000).collect() == ["b2"]
