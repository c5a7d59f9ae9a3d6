"""examples/kafka-wordcount.yaml runs with `dstream run` against a real broker. Only the port
of 127.0.0.1:9092 in its two `bootstrapServers` lists is the test broker's (a port the test
cannot count on), and `--checkpoint` puts the checkpoint under the test's directory; everything
else is the example as written, including the list's first address, `kafka:9092`, which only a
cluster's DNS resolves: here it does not, and the job must not mind. Its counts, read back from
its output topic with read_committed, are the reference's; the CRD accepts it
(tests/operator/test_crd.py checks every example). On Kubernetes, the chaos e2e applies the
file unchanged (e2e/chaos/kafka.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml
from conditions import eventually
from kafka_server import produce, word_totals
from running_driver import Driver

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kafka-wordcount.yaml"
LINES = [f"to be or not to be {n % 7}" for n in range(300)]
LOCAL_BROKER = "127.0.0.1:9092"  # the example's address of a broker on this machine
DRAIN_TIMEOUT_S = 180


def pointed_at(bootstrap: str, root: Path) -> tuple[Path, dict]:
    """The example with LOCAL_BROKER replaced by `bootstrap` in its bootstrapServers lists,
    written under `root`; and its spec."""
    document = yaml.safe_load(EXAMPLE.read_text())
    spec = document["spec"]
    for side in (spec["source"]["kafka"], spec["sink"]["kafka"]):
        servers = side["bootstrapServers"].split(",")
        assert LOCAL_BROKER in servers and len(servers) > 1, servers
        side["bootstrapServers"] = ",".join(bootstrap if s == LOCAL_BROKER else s for s in servers)
    manifest = root / EXAMPLE.name
    manifest.write_text(yaml.safe_dump(document))
    return manifest, spec


def test_the_kafka_wordcount_example_runs_with_dstream_run(kafka_server, tmp_path):
    manifest, spec = pointed_at(kafka_server.bootstrap, tmp_path)
    (source_topic,) = spec["source"]["kafka"]["topics"]
    sink_topic = spec["sink"]["kafka"]["topic"]
    for topic in (source_topic, sink_topic):  # as the example's comment asks
        kafka_server.create_topic(topic, 3)
    produce(kafka_server.bootstrap, source_topic, LINES)
    reference = Counter(word for line in LINES for word in line.split())
    checkpoint = tmp_path / "checkpoint"
    driver = Driver(manifest, "--checkpoint", str(checkpoint), log=tmp_path / "driver.log")

    def every_word() -> tuple[Counter[str], set[str]] | None:
        assert driver.alive(), f"dstream run exited:\n{driver.output()}"
        found, epochs = word_totals(kafka_server.bootstrap, sink_topic)
        return (found, epochs) if found.total() >= reference.total() else None

    driver.start()
    try:
        found, epochs = eventually(
            every_word,
            DRAIN_TIMEOUT_S,
            interval=0.5,
            message=f"all {reference.total()} words in the sink",
        )
    finally:
        if driver.alive():
            assert driver.terminate(60) == 0
    assert found == reference
    assert epochs == {"1"}  # a fresh checkpoint's first driver
    assert (checkpoint / "epochs" / "epoch-1.json").exists()
