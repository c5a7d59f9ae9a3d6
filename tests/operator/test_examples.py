"""The example manifests load as jobs, their extra objects are valid, and the user job works."""

from __future__ import annotations

import importlib
import sys
from collections import defaultdict
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from dstream.spec import load_job
from dstream_operator.checkpoint_storage import checkpoint_storage

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_example_loads(name):
    job = load_job(EXAMPLES / name)
    assert job.kind == "StreamingJob"


def test_topk_files_claims_the_volume_it_mounts():
    documents = list(yaml.safe_load_all((EXAMPLES / "topk-files.yaml").read_text()))
    (claim,) = [d for d in documents if d["kind"] == "PersistentVolumeClaim"]
    kubernetes_validate.validate(claim, "1.30", strict=True)
    job = load_job(EXAMPLES / "topk-files.yaml")
    (volume,) = job.spec.volumes
    assert volume.persistent_volume_claim.claim_name == claim["metadata"]["name"]
    for path in (job.spec.source.files.path, job.spec.checkpoint.path, job.spec.sink.files.path):
        assert path.startswith(volume.mount_path + "/")


@pytest.mark.parametrize("name", ["wordcount.yaml", "kafka-wordcount.yaml"])
def test_jobs_keep_their_checkpoint_on_the_examples_claim(name):
    """What the README's Kubernetes section applies: the claim, then a job whose checkpoint
    its driver and executors share through it."""
    claim = yaml.safe_load((EXAMPLES / "cluster" / "checkpoints.yaml").read_text())
    kubernetes_validate.validate(claim, "1.30", strict=True)
    job = load_job(EXAMPLES / name)
    (volume,) = job.spec.volumes
    assert volume.persistent_volume_claim.claim_name == claim["metadata"]["name"]
    storage = checkpoint_storage(job)
    assert storage.shared and storage.reason == "SharedVolume", storage.message


class ListStream:
    """Just enough of a DStream, over one batch in a list, to run a user job's logic."""

    def __init__(self, records):
        self.records = list(records)

    def flatMap(self, f):
        return ListStream(x for r in self.records for x in f(r))

    def filter(self, f):
        return ListStream(r for r in self.records if f(r))

    def map(self, f):
        return ListStream(f(r) for r in self.records)

    def reduceByKey(self, f):
        totals = defaultdict(list)
        for key, value in self.records:
            totals[key].append(value)
        result = {}
        for key, values in totals.items():
            acc = values[0]
            for value in values[1:]:
                acc = f(acc, value)
            result[key] = acc
        return ListStream(sorted(result.items()))


def test_user_module_builds_word_length_counts(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sys.modules.pop("jobs.wordlengths", None)
    job = load_job(EXAMPLES / "user-module.yaml")
    module_name, _, attribute = job.spec.app.module.partition(":")
    build = getattr(importlib.import_module(module_name), attribute)
    out = build(None, ListStream(["a bb ccc", "dddd ccc ee"]), job.spec.app.args)
    assert out.records == [(3, 2), (4, 1)]
