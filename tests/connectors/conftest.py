"""One real Redis, NATS and Kafka server per test module (Debian's packages and Maven Central's
Kafka jars, loopback ports)."""

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


@pytest.fixture(scope="module")
def kafka_server(tmp_path_factory):
    server = KafkaServer(tmp_path_factory.mktemp("kafka"))
    server.format()
    server.start()
    yield server
    server.stop()
