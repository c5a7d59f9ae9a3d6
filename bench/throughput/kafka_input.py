"""The Kafka input of the throughput trials (`python -m bench --source kafka`): one broker for
the run, a fresh topic per trial, and a feeder process writing the trial's records into it at
the trial's rate.

The feeder (`KafkaFeeder.java`, run by the JVM's source launcher on the broker's jars: it
shares the cores with the system under test, and Java's producer costs a fraction of a Python
call per record) writes record v of the rate schedule (`feed`) to partition v % P as its
offset v // P (a fresh topic, an idempotent producer: offset n of partition p is textgen's
record (p, n)), with the Kafka timestamp (CreateTime) `origin + v * 1000 // rate`, not before
that time (`timestamp_ms` and `records_by` are its arithmetic). So the records of interval k
(the rate source's) carry timestamps in [origin + (k - 1) s, origin + k s): an event-time
window over the Kafka timestamp holds exactly the intervals a batch window holds, and
`reference` checks either. A batch that reads "what has arrived" holds whatever offsets it
read; each system reports them (dstream its batch's recorded ranges, Structured Streaming its
progress's offsets) and the reference is computed from those.

Latency is the record's Kafka timestamp to its output being committed: dstream's source
measures it itself; for Structured Streaming `Fed.latency` computes it from the same
timestamps, which follow from the offsets.

The broker is the tests' (`tests/kafka_server.py`, loaded from its file, as `bench.common`
loads textgen): the same KRaft node the connector tests start, from the jars `.ci/install-kafka`
installs. Structured Streaming's connector jars come from `.ci/install-spark-kafka`.
"""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dstream.runtime.control import latency
from dstream.runtime.control.latency import BatchLatency

from bench.common import RECORD_BYTES, ROOT, SEED, textgen

CONNECTOR_INSTALLER = ROOT / ".ci" / "install-spark-kafka"
FEEDER = Path(__file__).resolve().with_name("KafkaFeeder.java")
# What the Kafka trials run: Grep's lines come from the broker for every system, so the
# rate trials' two Grep inputs (made in Python, made in the JVM) are one here.
WORKLOADS = ("wordcount", "topk", "grep")
# How far a record's timestamp may fall behind the newest one a micro-batch has seen and still
# count (Structured Streaming's watermark delay): the feeder's partitions are written within
# milliseconds of each other; under 1 s it adds no trigger to when a window is emitted, as
# triggers fire at whole seconds and windows end at whole seconds.
WATERMARK_DELAY = "500 milliseconds"


def kafka_server_module() -> ModuleType:
    """tests/kafka_server.py (with its own helpers, tests/servers.py, importable)."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    return importlib.import_module("kafka_server")


def start_broker(directory: Path) -> Any:
    """A single-node KRaft broker on free loopback ports, formatted and started; `.stop()` it."""
    broker = kafka_server_module()
    server = broker.KafkaServer(directory)
    server.format()
    server.start()
    # one idempotent write, acknowledged: a fresh broker makes a first producer wait seconds
    # for its producer id, which would make the first trial's records late
    server.create_topic("bench-warmup")
    broker.produce(server.bootstrap, "bench-warmup", [b"warm"])
    return server


def connector_jars() -> list[str]:
    """Structured Streaming's Kafka connector and the jars it needs beyond Spark's own."""
    done = subprocess.run(
        ["bash", str(CONNECTOR_INSTALLER)], check=True, stdout=subprocess.PIPE, text=True
    )
    jars = Path(done.stdout.strip().splitlines()[-1])
    return sorted(str(jar) for jar in jars.glob("*.jar"))


def timestamp_ms(origin_ms: int, rate: int, v: int) -> int:
    """Record v's Kafka timestamp: its time on the rate schedule, floored to the ms."""
    return origin_ms + v * 1000 // rate


def records_by(origin_ms: int, rate: int, at_ms: int) -> int:
    """How many records have a timestamp at or before at_ms."""
    elapsed = at_ms - origin_ms
    return 0 if elapsed < 0 else -(-(elapsed + 1) * rate // 1000)


@dataclass(frozen=True)
class Fed:
    """One trial's topic and its schedule."""

    bootstrap: str
    topic: str
    partitions: int
    rate: int
    origin_ms: int  # a whole second: event-time windows end at whole seconds

    def latency(self, slices: list[tuple[int, int, int]], end_ms: int) -> BatchLatency | None:
        """The latency of the records of `slices` committed at end_ms, from their timestamps."""
        slices = [s for s in slices if s[2] > s[1]]
        if not slices:
            return None
        rate, origin, parts = self.rate, self.origin_ms, self.partitions
        first = min(timestamp_ms(origin, rate, a * parts + p) for p, a, _b in slices)
        last = max(timestamp_ms(origin, rate, (b - 1) * parts + p) for p, _a, b in slices)

        def available_by(at_ms: int) -> int:
            newest = records_by(origin, rate, at_ms) - 1  # the highest v stamped by then
            total = 0
            for p, a, b in slices:
                below = (newest - p) // parts + 1 if newest >= p else 0  # offsets < below
                total += max(0, min(b, below) - a)
            return total

        ages = latency.ages_of_schedule(end_ms, first, last, available_by)
        return latency.summarize(ages, 0)


class KafkaFeed:
    """The broker a worker's trials use: a topic per trial, fed by a feeder process."""

    def __init__(self, bootstrap: str, partitions: int):
        self.bootstrap = bootstrap
        self.partitions = partitions
        self._feeder: subprocess.Popen[str] | None = None
        self.current: Fed | None = None
        self._libs = kafka_server_module().kafka_libs()  # the broker's, kafka-clients among them
        self._pool = Path(tempfile.mkdtemp(prefix="bench-feeder-")) / "pool.txt"
        self._pool.write_text(
            "".join(f"{line}\n" for line in textgen.line_pool(SEED, RECORD_BYTES))
        )

    def open(self, system: str, rate: int) -> Fed:
        """A fresh topic and its feeder, started."""
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = f"bench-{system.replace('.', '-')}-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = NewTopic(topic, num_partitions=self.partitions, replication_factor=1)
        admin.create_topics([new])[topic].result(30)
        self._feeder = subprocess.Popen(
            ["java", "-Xmx512m", "-XX:+UseSerialGC", "-cp", f"{self._libs}/*", str(FEEDER)]
            + [self.bootstrap, topic, str(rate), str(self.partitions), str(SEED), str(self._pool)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self._feeder.stdout is not None
        started = self._feeder.stdout.readline()  # its origin, once its producer is ready
        if not started.strip().isdigit():
            raise RuntimeError(f"the Kafka feeder did not start (exit {self._feeder.wait()})")
        self.current = Fed(self.bootstrap, topic, self.partitions, rate, int(started))
        return self.current

    def close(self) -> None:
        """Stop the feeder and delete the trial's topic (the broker keeps no old trials)."""
        from confluent_kafka.admin import AdminClient

        if self._feeder is not None:
            self._feeder.send_signal(signal.SIGTERM)
            self._feeder.wait(30)
            self._feeder = None
        if self.current is not None:
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            admin.delete_topics([self.current.topic])[self.current.topic].result(30)
            self.current = None
