"""Kafka's security settings for real, through the shared test broker's listeners: SSL (the
fixture's own CA, trusted through `clientProperties: {ssl.ca.location}`), SASL_SSL with
SCRAM-SHA-512, and SASL_PLAINTEXT with SCRAM-SHA-512 (the credential stored as KRaft stores it,
`kafka-storage format --add-scram`). Through each, a source reads a topic and the exactly-once
sink writes it to another, the password coming from passwordSecret's variable; a wrong password
stops `dstream run` with exit 4 and the login error docs/sources-and-sinks.md promises."""

from __future__ import annotations

import uuid

import pytest
import yaml
from dstream.connectors.kafka_sink import KafkaSink
from dstream.connectors.kafka_source import KafkaInputDStream
from dstream.spec import KafkaSink as KafkaSinkSettings
from dstream.spec import KafkaSource, password_env
from kafka_server import SASL_PASSWORD, SASL_USER, produce, read_all, wait_until_stable
from running_driver import manifest, run_until_exit
from streams import manual_context, run_batches

SECRET = {"name": "kafka-login", "key": "password"}


def connection(kafka_server, protocol: str) -> dict:
    """The connection fields a user writes for the listener of `protocol`."""
    trust = {"clientProperties": {"ssl.ca.location": str(kafka_server.ca_file)}}
    scram = {"saslMechanism": "SCRAM-SHA-512", "username": SASL_USER, "passwordSecret": SECRET}
    return {
        "SSL": {"bootstrapServers": kafka_server.ssl_bootstrap, **trust},
        "SASL_SSL": {"bootstrapServers": kafka_server.sasl_ssl_bootstrap, **trust, **scram},
        "SASL_PLAINTEXT": {"bootstrapServers": kafka_server.sasl_bootstrap, **scram},
    }[protocol] | {"securityProtocol": protocol}


@pytest.fixture
def password(monkeypatch, sc):
    """The password where the operator puts it on Kubernetes: the driver's environment (for
    planning) and the executors' (sc.environment reaches the tasks' Python workers)."""
    monkeypatch.setenv(password_env("kafka"), SASL_PASSWORD)
    sc.environment[password_env("kafka")] = SASL_PASSWORD
    yield
    del sc.environment[password_env("kafka")]


def new_topic(kafka_server) -> str:
    name = f"secure-{uuid.uuid4().hex[:8]}"
    kafka_server.create_topic(name)
    return name


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL", "SASL_PLAINTEXT"])
def test_a_source_and_the_exactly_once_sink_work_through_the_listener(
    protocol, kafka_server, sc, password
):
    source_topic, sink_topic = new_topic(kafka_server), new_topic(kafka_server)
    produce(kafka_server.bootstrap, source_topic, ["a", "b", "c"])
    login = connection(kafka_server, protocol)
    ssc = manual_context(sc)
    source = KafkaInputDStream(ssc, KafkaSource.model_validate({**login, "topics": [source_topic]}))
    sink = KafkaSinkSettings.model_validate({**login, "topic": sink_topic, "format": "text"})
    source.foreachRDD(KafkaSink("securejob", sink))
    run_batches(ssc, 1)
    wait_until_stable(kafka_server.bootstrap, sink_topic)
    assert [m.value() for m in read_all(kafka_server.bootstrap, sink_topic)] == [b"a", b"b", b"c"]


def test_a_wrong_scram_password_stops_dstream_run_with_exit_4_naming_the_login(
    tmp_path, kafka_server, monkeypatch
):
    login = connection(kafka_server, "SASL_SSL")
    job = manifest(
        "kafka-login-job",
        {
            "batchInterval": "1s",
            "app": {"builtin": "wordcount"},
            "source": {"type": "kafka", "kafka": {**login, "topics": [new_topic(kafka_server)]}},
        },
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    monkeypatch.setenv(password_env("kafka"), "wrong-password")
    done = run_until_exit(path)
    assert done.returncode == 4, done.stderr[-2000:]
    assert f"error: kafka {kafka_server.sasl_ssl_bootstrap} refused the login" in done.stderr
    assert "the password comes from DSTREAM_KAFKA_PASSWORD (passwordSecret)" in done.stderr
    assert "wrong-password" not in done.stderr + done.stdout  # nor the password itself
