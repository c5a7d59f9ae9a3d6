"""A real Apache Kafka broker for the tests: single node, KRaft (broker and controller in one JVM).

The jars come from `.ci/install-kafka` (Maven Central, cached; `make test` runs it first, and the
fixture runs it again, which is instant once cached, to learn where they are). Storage is
formatted once under the test's directory and kept across `restart()`, which is how the tests
restart the broker mid-run. Client listeners: PLAINTEXT on `port`; for the security tests,
SASL_PLAINTEXT (PLAIN and SCRAM-SHA-512) on `sasl_port`, SSL on `ssl_port` and SASL_SSL
(SCRAM-SHA-512) on `sasl_ssl_port`, all with user `alice`, password `alice-secret`. `format()`
makes a CA and the broker's certificate for 127.0.0.1 with openssl (`ca_file` is the CA a client
trusts) and stores the SCRAM credential as KRaft does (`kafka-storage format --add-scram`). With
`outside_host` one more plaintext listener, OUTSIDE on `outside_port` of that address, serves
clients that cannot reach this machine's loopback (the chaos e2e's pods reach the host on the
pod bridge).
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections import Counter
from pathlib import Path

from conditions import eventually
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic, OffsetSpec
from servers import Server, accepts_connections, free_port

INSTALLER = Path(__file__).resolve().parents[1] / ".ci" / "install-kafka"
SASL_USER, SASL_PASSWORD = "alice", "alice-secret"
# Small heap, quick start: the broker holds a few MB of test data.
JVM_OPTIONS = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]


def kafka_libs() -> Path:
    """The broker's jar directory, installed by .ci/install-kafka when missing."""
    done = subprocess.run(
        ["bash", str(INSTALLER)], check=True, stdout=subprocess.PIPE, text=True, timeout=600
    )
    return Path(done.stdout.strip().splitlines()[-1])


def make_certificates(directory: Path) -> None:
    """A CA (ca.pem) and the broker's key and certificate for IP 127.0.0.1, signed by it, in
    one PEM file as Kafka's PEM keystore takes it (broker.pem: an unencrypted PKCS#8 key, then
    the certificate)."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    new_key = "-newkey rsa:2048 -nodes".split()
    openssl(
        "req",
        "-x509",
        *new_key,
        "-subj",
        "/CN=dstream test CA",
        "-days",
        "2",
        *"-keyout ca.key -out ca.pem".split(),
    )
    openssl(
        "req",
        "-new",
        *new_key,
        "-subj",
        "/CN=127.0.0.1",
        *"-keyout broker.key -out broker.csr".split(),
    )
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(
        *"x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2".split(),
        *"-extfile san.ext -out broker.crt".split(),
    )
    key, certificate = (directory / name for name in ("broker.key", "broker.crt"))
    (directory / "broker.pem").write_text(key.read_text() + certificate.read_text())


class KafkaServer(Server):
    """One KRaft node on free loopback ports; `format()` once before the first `start()`."""

    def __init__(self, directory: Path, outside_host: str | None = None):
        super().__init__(directory)
        self.controller_port = free_port()
        self.sasl_port = free_port()
        self.ssl_port = free_port()
        self.sasl_ssl_port = free_port()
        self.outside_host = outside_host
        self.outside_port = free_port()
        self.libs = kafka_libs()
        self.config = directory / "server.properties"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_ssl_port}"

    @property
    def ca_file(self) -> Path:
        return self.directory / "tls" / "ca.pem"

    @property
    def outside_bootstrap(self) -> str:
        return f"{self.outside_host}:{self.outside_port}"

    def client_listeners(self) -> dict[str, str]:
        """Listener name -> address, for `listeners` and `advertised.listeners` alike."""
        listeners = {
            "PLAINTEXT": self.bootstrap,
            "SASL_PLAINTEXT": self.sasl_bootstrap,
            "SSL": self.ssl_bootstrap,
            "SASL_SSL": self.sasl_ssl_bootstrap,
        }
        if self.outside_host is not None:
            listeners["OUTSIDE"] = self.outside_bootstrap
        return listeners

    def properties(self) -> dict[str, str]:
        clients = ",".join(
            f"{name}://{address}" for name, address in self.client_listeners().items()
        )
        plain = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{SASL_USER}="{SASL_PASSWORD}";'
        )
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"{clients},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": clients,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,"
            "SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT,"
            "OUTSIDE:PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain,
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": scram,
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
            # the key and its certificate chain in one PEM file (see make_certificates)
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.directory / "tls" / "broker.pem"),
            "log.dirs": str(self.directory / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            # a transaction left open by a killed producer is aborted quickly
            "transaction.max.timeout.ms": "60000",
        }

    def format(self) -> None:
        """Make the certificates, write the configuration and format the storage with the SCRAM
        credential (Kafka's `kafka-storage format --add-scram`)."""
        make_certificates(self.directory / "tls")
        self.config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        done = subprocess.run(
            # `=`: a random ID may start with "-", which would read as an option
            [*self.java(), "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}"]
            + ["--config", str(self.config)]
            + ["--add-scram", f"SCRAM-SHA-512=[name={SASL_USER},password={SASL_PASSWORD}]"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"kafka-storage format failed: {done.stdout}{done.stderr}"

    def java(self) -> list[str]:
        return ["java", *JVM_OPTIONS, "-cp", f"{self.libs}/*"]

    def command(self) -> list[str]:
        return [*self.java(), "kafka.Kafka", str(self.config)]

    def ready(self) -> bool:
        """The broker answers a metadata request (the port opens before it can serve)."""
        if not accepts_connections(self.port):
            return False
        try:
            metadata = self.admin().list_topics(timeout=1)
        except KafkaException:
            return False
        return bool(metadata.brokers)

    def start(self) -> None:
        super().start(timeout_s=90)

    def admin(self) -> AdminClient:
        # log_level 0: librdkafka would print every refused connection while the broker is down
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def create_topic(self, name: str, partitions: int = 1, **config: str) -> None:
        topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)
        admin = self.admin()  # kept until the result: a collected client cancels its requests
        admin.create_topics([topic])[name].result(30)

    def add_partitions(self, name: str, total: int) -> None:
        admin = self.admin()
        admin.create_partitions([NewPartitions(name, total)])[name].result(30)


def produce(
    bootstrap: str,
    topic: str,
    values: list[str | bytes],
    partition: int | None = None,
    keys: list[str] | None = None,
) -> None:
    """Write values (to one partition, or by key, or round-robin) and wait for every ack."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, value in enumerate(values):
        where = {} if partition is None else {"partition": partition}
        key = keys[i] if keys is not None else None
        producer.produce(topic, value=value, key=key, **where)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0, f"unacknowledged records to {topic}"


def transaction(bootstrap: str, topic: str, values: list[str], commit: bool, partition: int = 0):
    """One transaction of values into one partition, committed or aborted."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"test-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value, partition=partition)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)
        producer.abort_transaction(30)
    wait_until_stable(bootstrap, topic)


def wait_until_stable(bootstrap: str, topic: str, timeout_s: float = 30) -> None:
    """Wait for the last stable offset of each partition of the topic to reach its end. A
    transaction's end returns once the coordinator has decided; its markers, which move the
    LSO, follow."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}

    def ends(level: IsolationLevel) -> dict[int, int]:
        futures = admin.list_offsets(wanted, isolation_level=level)
        return {tp.partition: future.result(30).offset for tp, future in futures.items()}

    eventually(
        lambda: ends(IsolationLevel.READ_COMMITTED) == ends(IsolationLevel.READ_UNCOMMITTED),
        timeout_s,
        message=f"the last stable offsets of {topic} reaching its end",
    )


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Message]:
    """Every message of a topic as a consumer with `isolation` sees it, up to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    metadata = consumer.list_topics(topic, timeout=30)
    partitions = [
        TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.topics[topic].partitions
    ]
    consumer.assign(partitions)
    found, ended = [], set()
    while len(ended) < len(partitions):
        message = consumer.poll(10)
        assert message is not None, f"no end of {topic} within 10 s"
        if message.error() is None:
            found.append(message)
        elif message.error().code() == KafkaError._PARTITION_EOF:
            ended.add(message.partition())
        else:
            raise KafkaException(message.error())
    consumer.close()
    return found


def read_range(bootstrap: str, topic: str, partition: int, start: int, until: int) -> list[Message]:
    """The committed messages of offsets [start, until) of one partition, read back (a test's
    reference for what a recorded range holds)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-range-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, partition, start)])
    found: list[Message] = []
    try:
        while start < until:
            message = consumer.poll(10)
            assert message is not None, f"{topic}-{partition} not read to {until} within 10 s"
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                break
            if error is not None:
                raise KafkaException(error)
            if message.offset() >= until:
                break
            found.append(message)
    finally:
        consumer.close()
    return found


def word_totals(bootstrap: str, topic: str) -> tuple[Counter[str], set[str]]:
    """The per-word sums of a word-count job's committed output (a lost batch makes one smaller,
    a doubled one larger), and the driver epochs its messages carry."""
    messages = read_all(bootstrap, topic)
    totals: Counter[str] = Counter()
    for message in messages:
        totals[message.key().decode()] += json.loads(message.value())
    return totals, {dict(m.headers())["dstream-epoch"].decode() for m in messages}
