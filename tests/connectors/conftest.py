"""Real servers on loopback ports: one Redis and one NATS server per test module (Debian's
packages), one Kafka broker per test process (Maven Central's jars)."""

from __future__ import annotations

import pytest
from kafka_server import KafkaServer
from servers import NatsServer, RedisServer


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory):
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


# One broker per test process, not per module: it takes seconds to start, and the Kafka tests'
# topics, commit keys and groups are their own (a test that restarts it leaves it running).
@pytest.fixture(scope="session")
def kafka_server(tmp_path_factory):
    server = KafkaServer(tmp_path_factory.mktemp("kafka"))
    server.format()
    server.start()
    yield server
    server.stop()
