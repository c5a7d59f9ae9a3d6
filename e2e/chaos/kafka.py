"""The chaos suite's Kafka scenario: examples/kafka-wordcount.yaml on the cluster, Kafka in and out.

A real broker runs on this machine (tests/kafka_server.py: the jars of .ci/install-kafka, KRaft,
free ports) with one listener on the pod bridge's address, which the pods reach. A feeder writes
numbered lines into the example's input topic for the whole run; the example's StreamingJob
reads them and writes its word counts to its output topic in Kafka transactions while an executor
pod and the driver pod are deleted. Each line ends with a word of its own (`seqN`), so the
committed counts, read back with read_committed, tell record by record what was lost or doubled,
and every other word's total must equal its count in what the feeder had acknowledged.

The job is the example file with only what this cluster needs changed: the brokers' address
(both `bootstrapServers`), the image, the checkpoint on the suite's shared volume, the suite's
small pods and restart policy, and a 3 s batch interval (the example's 1 s is more than a
2-core machine running the whole cluster keeps up with).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.chaos.cluster import Cluster, wait_for
from e2e.chaos.faults import Chaos, Target
from e2e.chaos.observer import Observer
from e2e.chaos.storage import CHECKPOINT, HostPathStorage

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kafka-wordcount.yaml"
sys.path.insert(0, str(ROOT / "tests"))  # the tests' broker fixture and its client helpers
from kafka_server import KafkaServer, produce, word_totals  # noqa: E402

BATCH_SECONDS = 3
FEED_LINES_PER_SECOND = 20
PARTITIONS = 3  # of both topics, as the example's comment asks
DRAIN_TIMEOUT_S = 180


def line(n: int) -> str:
    """Input line n: shared words (counted many times per batch) and one word of its own."""
    return f"kafka w{n % 13} to be or not seq{n}"


class Feeder(threading.Thread):
    """Writes FEED_LINES_PER_SECOND lines a second until stopped; `lines` are the acknowledged
    ones, the reference (a write that failed stops the feeder and is named in `failure`)."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(name="kafka-feeder", daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.lines: list[str] = []
        self.failure: str | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(1.0):
            start = len(self.lines)
            chunk = [line(n) for n in range(start, start + FEED_LINES_PER_SECOND)]
            try:
                produce(self.bootstrap, self.topic, list(chunk))
            except Exception as error:  # the reference would be unknown from here on
                self.failure = f"feeding {self.topic} failed: {error!r}"
                return
            self.lines.extend(chunk)

    def stop(self) -> None:
        self._stopping.set()
        self.join(60)


@dataclass
class KafkaVerdict:
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    epochs: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    figures: dict[str, list[float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems and self.lost == 0 and self.duplicated == 0


def job_manifest(
    address: str, namespace: str, storage: HostPathStorage, pods: dict[str, Any]
) -> dict[str, Any]:
    """The example, pointed at `address`, with the suite's pods (`pods`: image, driver,
    executor, sparkConf, restartPolicy of the main scenario's job) and shared checkpoint."""
    document = yaml.safe_load(EXAMPLE.read_text())
    document["metadata"]["namespace"] = namespace
    spec = document["spec"]
    for side in (spec["source"]["kafka"], spec["sink"]["kafka"]):
        side["bootstrapServers"] = address
    spec.update(pods)
    spec["batchInterval"] = f"{BATCH_SECONDS}s"
    spec["checkpoint"]["path"] = CHECKPOINT
    spec["volumes"] = [storage.volume()]
    return document


def compare(fed: list[str], found: Counter[str]) -> tuple[int, int, list[str]]:
    """Lost and duplicated records of the committed totals against the fed lines: a line whose
    own word (`seqN`) was counted 0 times is lost, n > 1 times is n - 1 duplicates. Also the
    other words whose totals differ from the fed ones (a shared word off, a line never fed)."""
    own = Counter(text.split()[-1] for text in fed)
    lost = sum(1 for word in own if found[word] == 0)
    duplicated = sum(max(0, found[word] - 1) for word in own)
    reference = Counter(word for text in fed for word in text.split()[:-1])
    wrong = sorted(w for w in (reference | found).keys() - own if found[w] != reference[w])
    return lost, duplicated, wrong


def drain(broker: KafkaServer, topic: str, fed: list[str]) -> tuple[Counter[str], set[str]]:
    """The committed totals once they hold as many words as were fed (or at the timeout)."""
    wanted = sum(len(text.split()) for text in fed)

    def complete() -> tuple[Counter[str], set[str]] | None:
        totals, epochs = word_totals(broker.bootstrap, topic)
        return (totals, epochs) if totals.total() >= wanted else None

    try:
        return wait_for(f"{wanted} words counted in {topic}", complete, DRAIN_TIMEOUT_S, 2)
    except Exception:
        return word_totals(broker.bootstrap, topic)  # compared as it is: the gap is `lost`


@dataclass
class KafkaScenario:
    cluster: Cluster
    namespace: str
    operator_namespace: str
    release: str
    lease: str
    host: str  # this machine's address that pods reach (the offline cluster's bridge)
    node_root: str  # the suite's hostPath root, and the same directory as seen here
    local_root: Path
    pods: dict[str, Any]

    def run(self, say) -> KafkaVerdict:
        directory = Path(tempfile.mkdtemp(prefix="dstream-e2e-kafka-"))
        broker = KafkaServer(directory, outside_host=self.host)
        broker.format()
        broker.start()
        say(f"kafka: broker on {broker.outside_bootstrap} (pods) and {broker.bootstrap}")
        try:
            return self._with_broker(broker, say)
        finally:
            broker.stop()
            shutil.rmtree(directory, ignore_errors=True)

    def _with_broker(self, broker: KafkaServer, say) -> KafkaVerdict:
        storage = HostPathStorage(f"{self.node_root.rstrip('/')}/kafka", self.local_root / "kafka")
        storage.prepare()
        manifest = job_manifest(broker.outside_bootstrap, self.namespace, storage, self.pods)
        spec, job = manifest["spec"], manifest["metadata"]["name"]
        (source_topic,) = spec["source"]["kafka"]["topics"]
        sink_topic = spec["sink"]["kafka"]["topic"]
        for topic in (source_topic, sink_topic):
            broker.create_topic(topic, PARTITIONS)
        feeder = Feeder(broker.bootstrap, source_topic)
        feeder.start()
        observer = Observer(storage, self.cluster, self.namespace, job, every_s=1.0)
        observer.start()
        say(f"kafka: applying StreamingJob {job} (examples/{EXAMPLE.name})")
        self.cluster.apply([manifest])
        target = Target(
            self.namespace, job, 2, BATCH_SECONDS, self.operator_namespace, self.release, self.lease
        )
        chaos = Chaos(self.cluster, observer, target)
        verdict = KafkaVerdict()
        try:
            self._faults(chaos, say)
        except Exception as error:
            verdict.problems.append(f"the Kafka run stopped early: {error}")
        feeder.stop()
        observer.stop()
        if feeder.failure:
            verdict.problems.append(feeder.failure)
        say(f"kafka: fed {len(feeder.lines)} lines; waiting for their counts in {sink_topic}")
        totals, epochs = drain(broker, sink_topic, feeder.lines)
        verdict.records = len(feeder.lines)
        verdict.lost, verdict.duplicated, wrong = compare(feeder.lines, totals)
        if wrong:
            verdict.problems.append(f"totals differing from the input's: {wrong[:10]}")
        verdict.epochs = sorted(epochs)
        if observer.snapshot().max_drivers > 1:
            verdict.problems.append(f"{observer.snapshot().max_drivers} live driver pods at once")
        verdict.faults, verdict.figures = chaos.faults, chaos.figures.values
        for figure in chaos.figures.summary():
            say(f"kafka: {figure}")
        faults = ", ".join(f"{kind}={n}" for kind, n in chaos.faults.items())
        say(f"kafka: faults {faults or 'none'}; driver epochs in the output {verdict.epochs}")
        for problem in verdict.problems:
            say(f"kafka: PROBLEM: {problem}")
        say(f"kafka: records={verdict.records} lost={verdict.lost} duplicated={verdict.duplicated}")
        self.cluster.delete([manifest])
        return verdict

    @staticmethod
    def _faults(chaos: Chaos, say) -> None:
        say("kafka: waiting for the job to run (phase Running, executors ready, a batch)")
        chaos.wait_until_running(600)
        chaos.measure_baseline(2, 300)
        say("kafka: executor loss")
        chaos.lose_executor(300)
        chaos.settle(1, 300)
        say("kafka: driver loss")
        chaos.lose_driver(600)  # then the drain waits for the rest of the input's counts


def write_report(verdict: KafkaVerdict, path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "records": verdict.records,
                "lost": verdict.lost,
                "duplicated": verdict.duplicated,
                "epochs": verdict.epochs,
                "faults": verdict.faults,
                "figures": verdict.figures,
                "problems": verdict.problems,
                "finishedAt": time.strftime("%Y-%m-%dT%H:%M:%S"),
            },
            indent=2,
        )
    )
