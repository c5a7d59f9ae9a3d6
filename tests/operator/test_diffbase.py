"""kopf's diff base in memory (`dstream_operator.diffbase`): the essence kopf compares, built
without copying what it drops, stored by uid, forgotten with the object."""

from __future__ import annotations

import kopf
from dstream_operator.diffbase import MemoryDiffBaseStorage, ProgressAnnotations

JOB = {
    "apiVersion": "dstream.dev/v1alpha1",
    "kind": "StreamingJob",
    "metadata": {
        "name": "wc",
        "namespace": "jobs",
        "uid": "uid-wc",
        "generation": 3,
        "labels": {"team": "a"},
        "annotations": {"note": "x", "dstream.dev/last-handled-configuration": "{}"},
        "managedFields": [{"manager": "kubectl"}],
    },
    "spec": {"executor": {"instances": 2}},
    "status": {"phase": "Running", "observedGeneration": 3},
}


def test_a_jobs_essence_is_its_spec_labels_and_annotations():
    essence = MemoryDiffBaseStorage().build(body=kopf.Body(JOB), extra_fields=[("spec",)])
    assert essence["spec"] == {"executor": {"instances": 2}}
    assert essence["metadata"]["labels"] == {"team": "a"}
    assert essence["metadata"]["annotations"]["note"] == "x"
    assert "status" not in essence and "managedFields" not in essence["metadata"]
    assert "uid" not in essence["metadata"] and "generation" not in essence["metadata"]


def test_the_essence_is_a_copy():
    essence = MemoryDiffBaseStorage().build(body=kopf.Body(JOB))
    essence["spec"]["executor"]["instances"] = 9
    assert JOB["spec"]["executor"]["instances"] == 2


def test_a_pods_essence_is_empty_as_nothing_compares_it():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"uid": "p"}, "spec": {"x": 1}}
    assert MemoryDiffBaseStorage().build(body=kopf.Body(pod)) == {}


def test_stored_by_uid_until_forgotten():
    storage = MemoryDiffBaseStorage()
    body = kopf.Body(JOB)
    assert storage.fetch(body=body) is None  # a job this operator never handled
    essence = storage.build(body=body)
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=essence)
    assert storage.fetch(body=body) == essence
    assert not patch  # nothing written to the object
    other = kopf.Body({**JOB, "metadata": {**JOB["metadata"], "uid": "uid-other"}})
    assert storage.fetch(body=other) is None
    storage.forget("uid-wc")
    assert storage.fetch(body=body) is None


def test_progress_is_stored_without_kopfs_marker():
    """So a handler that succeeds at once (progress stored, then purged) writes nothing."""
    storage = ProgressAnnotations(prefix="dstream.dev")
    patch = kopf.Patch()
    record = {"retries": 1, "success": True, "message": None}
    storage.store(key="set_up", record=record, body=kopf.Body(JOB), patch=patch)
    assert dict(patch) == {
        "metadata": {"annotations": {"dstream.dev/set_up": '{"retries":1,"success":true}'}}
    }
    storage.purge(key="set_up", body=kopf.Body(JOB), patch=patch)
    assert not patch
