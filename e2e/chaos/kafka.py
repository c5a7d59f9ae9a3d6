"""The chaos suite's Kafka scenario: examples/kafka-wordcount.yaml on the cluster, Kafka in and out.

A real broker runs on this machine (tests/kafka_server.py: the jars of .ci/install-kafka, KRaft,
free ports) with one listener on the pod bridge's address, which the pods reach. A feeder writes
numbered lines into the example's input topic for the whole run; the example's StreamingJob
reads them and writes its word counts to its output topic in Kafka transactions while an executor
pod and the driver pod are deleted. Each line ends with a word of its own (`seqN`), so the
committed counts, read back with read_committed, tell record by record what was lost or doubled,
and every other word's total must equal its count in what the feeder had acknowledged.

The job is the example file as written, applied with `kubectl apply --namespace`; the suite
gives it what its comments ask of a cluster, in the job's namespace:
- the Service `kafka`, without a selector, its Endpoints the broker's pod-facing listener: a pod
  finds `kafka` through the cluster DNS (CoreDNS, e2e/cluster/real-node.sh) and kube-proxy
  forwards its port to the listener (the list's other address, 127.0.0.1:9092, is the pod
  itself: refused at once);
- the claim `dstream-checkpoints`, bound to a hostPath PersistentVolume on a directory that this
  machine reads, so the suite follows the checkpoint's batch log;
- no image: the example names none, so it runs the operator's, the suite's image.
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
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from dstream.spec import duration_ms

from e2e.chaos.cluster import Cluster, driver_selector, show_kubectl, wait_for
from e2e.chaos.faults import Chaos, Target
from e2e.chaos.observer import Observer
from e2e.chaos.storage import HostPathStorage

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kafka-wordcount.yaml"
sys.path.insert(0, str(ROOT / "tests"))  # the tests' broker fixture and its client helpers
from kafka_server import KafkaServer, produce, word_totals  # noqa: E402

SERVICE = "kafka"  # the example's cluster name of the brokers
FEED_LINES_PER_SECOND = 20
PARTITIONS = 3  # of both topics, as the example's comment asks
DRAIN_TIMEOUT_S = 180
CLAIM_SIZE = "1Gi"


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
    figures: dict[str, list[float | None]] = field(default_factory=dict)  # null: never back
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems and self.lost == 0 and self.duplicated == 0


@dataclass(frozen=True)
class Example:
    """What the suite reads of the example: the names it must provide and follow."""

    spec: dict[str, Any]
    job: str

    @classmethod
    def load(cls) -> Example:
        document = yaml.safe_load(EXAMPLE.read_text())
        return cls(document["spec"], document["metadata"]["name"])

    @property
    def topics(self) -> tuple[str, str]:
        (source,) = self.spec["source"]["kafka"]["topics"]
        return source, self.spec["sink"]["kafka"]["topic"]

    @property
    def batch_seconds(self) -> float:
        return duration_ms(self.spec["batchInterval"]) / 1000

    @property
    def service_port(self) -> int:
        """The port of `kafka:PORT` in the bootstrap lists (both must name it)."""
        ports = set()
        for side in (self.spec["source"]["kafka"], self.spec["sink"]["kafka"]):
            named = [a for a in side["bootstrapServers"].split(",") if a.startswith(f"{SERVICE}:")]
            if not named:
                raise ValueError(f"{EXAMPLE.name}: no {SERVICE}:PORT in {side['bootstrapServers']}")
            ports |= {int(a.split(":")[1]) for a in named}
        (port,) = ports
        return port

    @property
    def checkpoint_volume(self) -> tuple[str, str]:
        """The claim of the volume holding the checkpoint, and the checkpoint's directory in it."""
        checkpoint = PurePosixPath(self.spec["checkpoint"]["path"])
        for volume in self.spec.get("volumes", []):
            mount = PurePosixPath(volume["mountPath"])
            if "persistentVolumeClaim" in volume and checkpoint.is_relative_to(mount):
                claim = volume["persistentVolumeClaim"]["claimName"]
                return claim, str(checkpoint.relative_to(mount))
        raise ValueError(f"{EXAMPLE.name}: the checkpoint {checkpoint} is on no claimed volume")


def broker_service(namespace: str, port: int, host: str, broker_port: int) -> list[dict[str, Any]]:
    """The Service SERVICE without a selector, and its Endpoints: the broker at host:broker_port."""
    meta = {"name": SERVICE, "namespace": namespace}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {"ports": [{"port": port, "protocol": "TCP"}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": meta,
            "subsets": [
                {"addresses": [{"ip": host}], "ports": [{"port": broker_port, "protocol": "TCP"}]}
            ],
        },
    ]


def checkpoint_claim(namespace: str, claim: str, node_path: str) -> list[dict[str, Any]]:
    """A ReadWriteMany hostPath PersistentVolume on node_path, bound to `claim` in namespace,
    and the claim (no storage class: the volume is made here, not provisioned)."""
    volume = f"{namespace}-{claim}"
    access = {"accessModes": ["ReadWriteMany"], "storageClassName": ""}
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                **access,
                "capacity": {"storage": CLAIM_SIZE},
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": node_path},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                **access,
                "resources": {"requests": {"storage": CLAIM_SIZE}},
                "volumeName": volume,
            },
        },
    ]


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
        example = Example.load()
        claim, checkpoint = example.checkpoint_volume
        storage = HostPathStorage(
            f"{self.node_root.rstrip('/')}/kafka", self.local_root / "kafka", checkpoint=checkpoint
        )
        storage.prepare()
        provided = broker_service(
            self.namespace, example.service_port, self.host, broker.outside_port
        ) + checkpoint_claim(self.namespace, claim, storage.node_path)
        say(f"kafka: Service {SERVICE} -> {broker.outside_bootstrap}, claim {claim} (hostPath)")
        self.cluster.apply(provided)
        source_topic, sink_topic = example.topics
        for topic in (source_topic, sink_topic):
            broker.create_topic(topic, PARTITIONS)
        feeder = Feeder(broker.bootstrap, source_topic)
        feeder.start()
        job = example.job
        observer = Observer(storage, self.cluster, self.namespace, job, every_s=1.0)
        observer.start()
        say(f"kafka: kubectl apply --namespace {self.namespace} -f examples/{EXAMPLE.name}")
        self.cluster.run_kubectl("apply", "--namespace", self.namespace, "-f", str(EXAMPLE))
        target = Target(
            self.namespace,
            job,
            example.spec["executor"]["instances"],
            example.batch_seconds,
            self.operator_namespace,
            self.release,
            self.lease,
        )
        chaos = Chaos(self.cluster, observer, target)
        verdict = KafkaVerdict()
        try:
            self._faults(chaos, say)
        except Exception as error:
            verdict.problems.append(f"the Kafka run stopped early: {error}")
            self._diagnose(job, say)
        feeder.stop()
        observer.stop()
        chaos.figures_for_good(observer.snapshot())
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
        verdict.faults, verdict.figures = chaos.faults, chaos.figures.as_json()
        for figure in chaos.figures.summary():
            say(f"kafka: {figure}")
        faults = ", ".join(f"{kind}={n}" for kind, n in chaos.faults.items())
        say(f"kafka: faults {faults or 'none'}; driver epochs in the output {verdict.epochs}")
        for problem in verdict.problems:
            say(f"kafka: PROBLEM: {problem}")
        say(f"kafka: records={verdict.records} lost={verdict.lost} duplicated={verdict.duplicated}")
        self.cluster.run_kubectl(
            "delete",
            "--namespace",
            self.namespace,
            "--ignore-not-found",
            "--wait=false",
            "-f",
            str(EXAMPLE),
        )
        self.cluster.delete(provided)
        return verdict

    def _diagnose(self, job: str, say) -> None:
        """For a post-mortem: the namespace's pods and the job's last driver log lines."""
        commands = [
            ["get", "pods", "--namespace", self.namespace, "-o", "wide"],
            ["logs", "-n", self.namespace, "-l", driver_selector(job), "--tail", "60", "--prefix"],
        ]
        show_kubectl(self.cluster, commands, say)

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
