"""Kafka client settings shared by the source (kafka_source.py) and the sink (kafka_sink.py):
connecting, logging in, and naming what went wrong.

Client: confluent-kafka (librdkafka), chosen because its wheel carries librdkafka (no JVM in the
Python workers, no system library), and it has transactions, assign/seek and ListOffsets with an
isolation level. Its defaults differ from the Java client's, so the settings that carry the
guarantees are always set by the connector: `isolation.level` (librdkafka's default is
read_committed, the Java client's read_uncommitted), `enable.auto.commit=false` and
`auto.offset.reset=error` for the source, `enable.idempotence=true` for every producer (off by
default in librdkafka).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from confluent_kafka import KafkaError

from dstream.sources import SourceError
from dstream.spec import KafkaConnection, password_env

# librdkafka's own log lines go through Python logging, critical ones only: it logs every refused
# connection while a broker restarts, and the errors that matter reach the job as its own.
CLIENT_LOG = logging.getLogger("dstream.connectors.kafka.librdkafka")

REQUEST_TIMEOUT_S = 10.0


def client_config(settings: KafkaConnection) -> dict[str, Any]:
    """librdkafka settings for connecting and logging in; the password (passwordSecret) comes
    from the environment, on the driver as in tasks, and never travels in a task closure."""
    config: dict[str, Any] = {
        **settings.client_properties,
        "logger": CLIENT_LOG,
        "log_level": 2,
        "bootstrap.servers": settings.bootstrap_servers,
        "security.protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism is not None:
        config["sasl.mechanism"] = settings.sasl_mechanism
        config["sasl.username"] = settings.username
    password = os.environ.get(password_env("kafka"))
    if settings.password_secret is not None and password is None:
        raise SourceError(
            f"kafka: passwordSecret is set but {password_env('kafka')} is not in the "
            "environment (the operator sets it on Kubernetes; export it for dstream run)"
        )
    if password is not None and settings.sasl_mechanism is not None:
        config["sasl.password"] = password
    return config


class LoginWatch:
    """librdkafka reports a refused login through its error callback, not through the request
    that then times out; this keeps the last such error so the timeout can name the cause."""

    def __init__(self) -> None:
        self.refused: str | None = None

    def __call__(self, error: KafkaError) -> None:
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            self.refused = error.str()


def broker_error(servers: str, error: Exception, watch: LoginWatch) -> SourceError:
    """A failed request as the SourceError a user can act on."""
    if watch.refused is not None:
        return SourceError(
            f"kafka {servers} refused the login ({watch.refused}); the password comes from "
            f"{password_env('kafka')} (passwordSecret), the user from username"
        )
    return SourceError(f"kafka {servers} unreachable or not answering: {error}")
