"""The chaos suite's Kafka scenario: what it applies is the example, and how it counts."""

from collections import Counter

import pytest
import yaml

from e2e.chaos.kafka import (
    EXAMPLE,
    SERVICE,
    Example,
    broker_service,
    checkpoint_claim,
    compare,
    line,
)
from e2e.chaos.storage import HostPathStorage


def test_the_suite_provides_what_the_example_names():
    """The example is applied as written: the Service, claim and checkpoint directory the suite
    makes are the ones the file names."""
    example = Example.load()
    assert example.job == yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    assert example.service_port == 9092
    assert example.checkpoint_volume == ("dstream-checkpoints", "checkpoints/kafka-wordcount")
    assert example.topics == ("lines", "word-counts")
    service, endpoints = broker_service("ns", 9092, "10.244.0.1", 40123)
    assert service["metadata"] == endpoints["metadata"] == {"name": SERVICE, "namespace": "ns"}
    assert "selector" not in service["spec"]
    assert endpoints["subsets"] == [
        {"addresses": [{"ip": "10.244.0.1"}], "ports": [{"port": 40123, "protocol": "TCP"}]}
    ]
    volume, claim = checkpoint_claim("ns", "dstream-checkpoints", "/node/kafka/run-1")
    assert volume["spec"]["claimRef"] == {"namespace": "ns", "name": "dstream-checkpoints"}
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert volume["spec"]["hostPath"] == {"path": "/node/kafka/run-1"}


def test_the_checkpoint_log_is_read_where_the_example_puts_it(tmp_path):
    storage = HostPathStorage("/node", tmp_path, run="run-1", checkpoint="checkpoints/job")
    log = tmp_path / "run-1" / "checkpoints" / "job" / "log"
    log.mkdir(parents=True)
    (log / "batch-1000.json").write_text("{}")
    assert list(storage.log_entries()) == ["batch-1000.json"]
    assert storage.node_path == "/node/run-1"


def test_an_example_without_the_service_address_is_named():
    example = Example.load()
    spec = {**example.spec, "source": {"kafka": {"bootstrapServers": "10.0.0.1:9092"}}}
    with pytest.raises(ValueError, match="no kafka:PORT in 10.0.0.1:9092"):
        _ = Example(spec, example.job).service_port


def test_a_lost_and_a_doubled_line_are_counted_by_their_own_words():
    fed = [line(n) for n in range(3)]
    found = Counter(word for text in fed for word in text.split())
    assert compare(fed, found) == (0, 0, [])
    found.subtract(fed[0].split())  # line 0's count lost
    found.update(fed[2].split() * 2)  # line 2's counted three times
    assert compare(fed, +found) == (1, 2, sorted({"w0", "w2", "kafka", "to", "be", "or", "not"}))
