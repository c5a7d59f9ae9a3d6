"""The chaos suite's Kafka scenario: what it applies is the example, and how it counts."""

from collections import Counter
from pathlib import Path

import yaml

from e2e.chaos.kafka import EXAMPLE, compare, job_manifest, line
from e2e.chaos.storage import CHECKPOINT, HostPathStorage


def test_the_applied_job_is_the_example_with_only_the_cluster_settings_changed():
    example = yaml.safe_load(EXAMPLE.read_text())
    storage = HostPathStorage("/node/data", Path("/node/data"), run="run-1")
    pods = {"image": "dstream:e2e", "executor": {"instances": 2, "cores": 1, "memory": "512m"}}
    applied = job_manifest("10.244.0.1:9999", "ns", storage, pods)
    spec, original = applied["spec"], example["spec"]
    assert applied["metadata"] == {**example["metadata"], "namespace": "ns"}
    for side in ("source", "sink"):
        assert spec[side]["kafka"].pop("bootstrapServers") == "10.244.0.1:9999"
        original[side]["kafka"].pop("bootstrapServers")
        assert spec[side] == original[side]
    assert spec["app"] == original["app"]
    assert spec["checkpoint"]["path"] == CHECKPOINT
    assert spec["volumes"] == [storage.volume()]
    assert spec["image"] == "dstream:e2e"


def test_a_lost_and_a_doubled_line_are_counted_by_their_own_words():
    fed = [line(n) for n in range(3)]
    found = Counter(word for text in fed for word in text.split())
    assert compare(fed, found) == (0, 0, [])
    found.subtract(fed[0].split())  # line 0's count lost
    found.update(fed[2].split() * 2)  # line 2's counted three times
    assert compare(fed, +found) == (1, 2, sorted({"w0", "w2", "kafka", "to", "be", "or", "not"}))
