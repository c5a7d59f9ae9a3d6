"""The Kafka sink against a real broker: one transaction per batch, a re-run batch written once,
a killed writer fenced, keys and headers, at-least-once delivery, a broker restart."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from confluent_kafka import KafkaException, Message
from dstream.connectors.kafka_sink import BATCH_TIME_HEADER, EPOCH_HEADER, KafkaSink
from dstream.runtime.leadership.fencing import DeposedError, EpochLedger, Fence
from dstream.spec import KafkaSink as KafkaSinkSettings
from dstream.spec import SpecError, parse_job
from kafka_server import read_all, wait_until_stable
from running_driver import manifest
from streams import manual_context, run_batches

JOB = "kafkatest"


def new_topic(kafka_server, partitions: int = 1) -> str:
    name = f"out-{uuid.uuid4().hex[:8]}"
    kafka_server.create_topic(name, partitions)
    return name


def sink(kafka_server, topic: str, job: str = JOB, **options) -> KafkaSink:
    settings = KafkaSinkSettings.model_validate(
        {"bootstrapServers": kafka_server.bootstrap, "topic": topic, **options}
    )
    return KafkaSink(job, settings)


def committed(kafka_server, topic: str, isolation: str = "read_committed") -> list[Message]:
    """The topic's messages once no transaction's markers are still on their way."""
    wait_until_stable(kafka_server.bootstrap, topic)
    return read_all(kafka_server.bootstrap, topic, isolation)


def values(kafka_server, topic: str, isolation: str = "read_committed") -> list:
    return [json.loads(m.value()) for m in committed(kafka_server, topic, isolation)]


def test_each_batch_is_one_transaction_with_keys_and_its_time_in_a_header(sc, kafka_server):
    topic = new_topic(kafka_server)
    ssc = manual_context(sc)
    batches = [[("a", 1), ("b", 2)], [{"word": "c", "n": 3}]]
    ssc.queueStream(batches).foreachRDD(sink(kafka_server, topic, keyField="word"))
    run_batches(ssc, 2)
    messages = committed(kafka_server, topic)
    assert [(m.key(), json.loads(m.value())) for m in messages] == [
        (b"a", 1),
        (b"b", 2),
        (b"c", {"word": "c", "n": 3}),
    ]
    times = [dict(m.headers())[BATCH_TIME_HEADER].decode() for m in messages]
    assert times[0] == times[1] != times[2]
    assert datetime.fromisoformat(times[2]).tzinfo == UTC


def test_a_batch_run_again_after_its_commit_writes_nothing(kafka_server, sc):
    topic = new_topic(kafka_server)
    first = sink(kafka_server, topic)
    batch = sc.parallelize([f"r{i}" for i in range(100)], 4)
    first(datetime.fromtimestamp(1000), batch)
    # a restarted driver (a new sink, a new producer) runs the same batch, then the next one
    again = sink(kafka_server, topic)
    again(datetime.fromtimestamp(1000), batch)
    again(datetime.fromtimestamp(1001), sc.parallelize(["next"]))
    assert values(kafka_server, topic) == [f"r{i}" for i in range(100)] + ["next"]


def test_a_killed_writers_open_transaction_is_aborted_by_its_successor(kafka_server, sc):
    topic = new_topic(kafka_server)
    zombie_sink = sink(kafka_server, topic)
    zombie = zombie_sink.producer(transactional=True)
    zombie.begin_transaction()
    zombie.produce(topic, value=b'"half of a batch"')
    zombie.flush(30)  # on the broker, uncommitted: the driver dies here
    successor = sink(kafka_server, topic)
    successor(datetime.fromtimestamp(1000), sc.parallelize(["whole batch"]))
    assert values(kafka_server, topic) == ["whole batch"]
    assert values(kafka_server, topic, "read_uncommitted") == ["half of a batch", "whole batch"]
    with pytest.raises(Exception, match="(?i)fenced"):
        zombie.commit_transaction(30)


def test_a_deposed_drivers_late_batch_lands_nothing(kafka_server, sc, tmp_path):
    """Drivers of epochs 1 and 2 on one output, with no claim in the ledger: what refuses
    epoch 1 here is Kafka alone. Epoch 1 is frozen with a batch open when epoch 2 writes its
    first; thawed, its commit is fenced, and its retry (a new producer) finds epoch 2's commit
    record and stops; epoch 2's batches land."""
    topic = new_topic(kafka_server)
    ledger = EpochLedger(tmp_path)
    old, new = sink(kafka_server, topic), sink(kafka_server, topic)
    old.write_batch(datetime.fromtimestamp(1000), sc.parallelize(["old 1000"]), Fence(ledger, 1))
    frozen = old.producer(transactional=True)  # epoch 1 has begun batch 1001, and freezes
    frozen.begin_transaction()
    old.produce_all(frozen, 1_001_000, ["old 1001"], epoch=1)
    new.write_batch(datetime.fromtimestamp(1001), sc.parallelize(["new 1001"]), Fence(ledger, 2))
    with pytest.raises(KafkaException, match="(?i)fenced"):
        frozen.commit_transaction(30)  # thawed
    old.close()  # as its failed batch does before the retry
    with pytest.raises(DeposedError, match=r"epoch 2 was claimed by the commit records"):
        old.write_batch(
            datetime.fromtimestamp(1001), sc.parallelize(["old 1001"]), Fence(ledger, 1)
        )
    with pytest.raises(RuntimeError, match="(?i)fenced"):  # the retry's init fenced it once
        new.write_batch(
            datetime.fromtimestamp(1002), sc.parallelize(["new 1002"]), Fence(ledger, 2)
        )
    new.write_batch(
        datetime.fromtimestamp(1002), sc.parallelize(["new 1002"]), Fence(ledger, 2)
    )  # its own retry
    messages = committed(kafka_server, topic)
    assert [json.loads(m.value()) for m in messages] == ["old 1000", "new 1001", "new 1002"]
    assert [dict(m.headers())[EPOCH_HEADER] for m in messages] == [b"1", b"2", b"2"]
    assert "old 1001" in values(kafka_server, topic, "read_uncommitted")  # aborted, never seen
    commits = read_all(kafka_server.bootstrap, "dstream-commits")
    mine = [json.loads(m.value()) for m in commits if m.key() == new.commit_key]
    assert [(c["batchTimeMs"], c["epoch"]) for c in mine] == [
        (1_000_000, 1),
        (1_001_000, 2),
        (1_002_000, 2),
    ]


def test_a_driver_the_ledger_deposed_stops_before_touching_the_successors_producer(
    kafka_server, sc, tmp_path
):
    """With epoch 2 claimed in the checkpoint, epoch 1 stops at its ledger check, before its
    init_transactions could fence epoch 2's producer: epoch 2 goes on undisturbed."""
    topic = new_topic(kafka_server)
    ledger = EpochLedger(tmp_path)
    assert ledger.claim(1) and ledger.claim(2)
    old, new = sink(kafka_server, topic), sink(kafka_server, topic)
    new.write_batch(datetime.fromtimestamp(1000), sc.parallelize(["new 1000"]), Fence(ledger, 2))
    with pytest.raises(DeposedError, match=r"epoch 2 was claimed .* held epoch 1"):
        old.write_batch(
            datetime.fromtimestamp(1001), sc.parallelize(["old 1001"]), Fence(ledger, 1)
        )
    new.write_batch(datetime.fromtimestamp(1001), sc.parallelize(["new 1001"]), Fence(ledger, 2))
    assert values(kafka_server, topic, "read_uncommitted") == ["new 1000", "new 1001"]


def test_outputs_and_jobs_keep_their_commits_apart(kafka_server, sc):
    topic = new_topic(kafka_server)
    sink(kafka_server, topic, job="one")(datetime.fromtimestamp(1000), sc.parallelize(["one"]))
    sink(kafka_server, topic, job="two")(datetime.fromtimestamp(1000), sc.parallelize(["two"]))
    assert values(kafka_server, topic) == ["one", "two"]


def test_at_least_once_writes_a_rerun_again_and_text_format(kafka_server, sc):
    topic = new_topic(kafka_server)
    writer = sink(kafka_server, topic, delivery="atLeastOnce", format="text")
    batch = sc.parallelize(["x", "y"], 1)
    writer(datetime.fromtimestamp(1000), batch)
    writer(datetime.fromtimestamp(1000), batch)
    found = [m.value() for m in committed(kafka_server, topic)]
    assert found == [b"x", b"y", b"x", b"y"]


def test_a_broker_restart_between_batches_is_ridden_out(kafka_server, sc):
    topic = new_topic(kafka_server)
    writer = sink(kafka_server, topic)
    writer(datetime.fromtimestamp(1000), sc.parallelize(["before"]))
    kafka_server.restart()
    writer(datetime.fromtimestamp(1001), sc.parallelize(["after"]))
    writer(datetime.fromtimestamp(1001), sc.parallelize(["after"]))  # the retry of a success
    assert values(kafka_server, topic) == ["before", "after"]


@pytest.mark.parametrize(
    ("kafka", "problem"),
    [
        ({"bootstrapServers": "h:9092"}, "spec.sink.kafka.topic: Field required"),
        ({"bootstrapServers": "h:9092", "topic": "a b"}, "spec.sink.kafka.topic: String should"),
        (
            {"bootstrapServers": "h:9092", "topic": "t", "delivery": "exactly-once"},
            "delivery: Input should be 'exactlyOnce' or 'atLeastOnce'",
        ),
        (
            {
                "bootstrapServers": "h:9092",
                "topic": "t",
                "clientProperties": {"transactional.id": "x"},
            },
            "clientProperties: Value error, 'transactional.id' is set by the connector",
        ),
    ],
)
def test_every_sink_spec_error_names_its_field(kafka, problem):
    job = kafka_job({"type": "rate", "rate": {"recordsPerSecond": 10}}, kafka)
    with pytest.raises(SpecError) as raised:
        parse_job(job)
    assert any(problem in p for p in raised.value.problems), raised.value.problems


def test_source_and_sink_cannot_name_two_password_secrets():
    login = {"securityProtocol": "SASL_SSL", "saslMechanism": "PLAIN", "username": "u"}
    source = {"bootstrapServers": "h:9092", "topics": ["in"], **login}
    sink = {"bootstrapServers": "h:9092", "topic": "out", **login}
    job = kafka_job(
        {"type": "kafka", "kafka": {**source, "passwordSecret": {"name": "a", "key": "p"}}},
        {**sink, "passwordSecret": {"name": "b", "key": "p"}},
    )
    with pytest.raises(SpecError, match="different passwordSecrets.*DSTREAM_KAFKA_PASSWORD"):
        parse_job(job)


def kafka_job(source: dict, sink_kafka: dict) -> dict:
    spec = {"batchInterval": "1s", "app": {"builtin": "wordcount"}, "source": source}
    return manifest("kafka-out", {**spec, "sink": {"type": "kafka", "kafka": sink_kafka}})
