"""Whether a job's checkpoint is on storage its pods share, as its status and events say."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dstream.spec import parse_job
from dstream_operator import reconcile
from dstream_operator.checkpoint_storage import checkpoint_storage
from dstream_operator.resources import spec_hash
from dstream_operator.status import SPEC_HASH_ANNOTATION, JobStatus, PodFacts, pod_facts

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CLAIM = {"name": "ck", "mountPath": "/ck", "persistentVolumeClaim": {"claimName": "shared"}}
HOST = {"name": "node", "mountPath": "/node", "hostPath": {"path": "/srv/ck"}}


def job(checkpoint: str | None = "/ck/wc", volumes: tuple[dict, ...] = (CLAIM,)):
    spec = {
        "batchInterval": "1s",
        "app": {"builtin": "wordcount"},
        "source": {"type": "rate", "rate": {"recordsPerSecond": 10}},
        "volumes": list(volumes),
    }
    if checkpoint is not None:
        spec["checkpoint"] = {"path": checkpoint}
    return parse_job(
        {
            "apiVersion": "dstream.dev/v1alpha1",
            "kind": "StreamingJob",
            "metadata": {"name": "wc"},
            "spec": spec,
        }
    )


@pytest.mark.parametrize(
    ("spec_job", "reason"),
    [
        (job(), "SharedVolume"),
        (job("/ck"), "SharedVolume"),  # the mount itself
        (job("/ck/./a/../wc"), "SharedVolume"),
        (job("/tmp/dstream/checkpoints/wc"), "PodLocal"),
        (job("/ckpt/wc"), "PodLocal"),  # a sibling of the mount, not inside it
        (job("/ck/../tmp/wc"), "PodLocal"),
        (job(None), "NoCheckpoint"),
        (job("/node/wc", (CLAIM, HOST)), "NodeLocalVolume"),
        (job("/ck/node/wc", (CLAIM, HOST | {"mountPath": "/ck/node"})), "NodeLocalVolume"),
        (
            job(
                "/ck/wc",
                (CLAIM | {"persistentVolumeClaim": {"claimName": "shared", "readOnly": True}},),
            ),
            "ReadOnlyVolume",
        ),
    ],
)
def test_shared_means_a_writable_claim_holding_the_checkpoint(spec_job, reason):
    storage = checkpoint_storage(spec_job)
    assert storage.reason == reason
    assert storage.shared == (reason == "SharedVolume")


def test_the_message_names_what_is_given_up():
    pod_local = checkpoint_storage(job("/tmp/wc")).message
    assert pod_local.startswith("checkpoint /tmp/wc is on no volume of spec.volumes")
    for lost in ("starts from nothing", "not replayed", "standby", "state checkpoints"):
        assert lost in pod_local
    node_local = checkpoint_storage(job("/node/wc", (HOST,))).message
    assert (
        "hostPath volume node" in node_local and "on another node starts from nothing" in node_local
    )
    shared = checkpoint_storage(job()).message
    assert "claim shared" in shared and "ReadWriteMany" in shared


def seen(spec_job, current: JobStatus, **kw) -> reconcile.Observation:
    return reconcile.Observation(
        job=spec_job,
        job_uid="uid-wc",
        problems=(),
        status=current,
        driver=kw.pop("driver", None),
        vanished=None,
        executors_ready=0,
        report=None,
        spec_hash=spec_hash(spec_job),
        now=kw.pop("now", NOW),
        **kw,
    )


def driver(spec_job) -> PodFacts:
    """The job's driver pod, running."""
    return pod_facts(
        {
            "metadata": {
                "name": "wc-driver-1",
                "uid": "p1",
                "annotations": {SPEC_HASH_ANNOTATION: spec_hash(spec_job)},
                "ownerReferences": [{"uid": "uid-wc", "controller": True}],
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
            },
        }
    )


def condition(step: reconcile.Plan):
    (found,) = [c for c in step.status.conditions if c.type == reconcile.CHECKPOINT_SHARED]
    return found


def test_every_driver_created_without_a_shared_checkpoint_is_warned_about():
    pod_local = job("/tmp/wc")
    first = reconcile.plan(seen(pod_local, JobStatus()))
    assert first.create_driver
    (warning,) = [e for e in first.events if e.reason == "CheckpointNotShared"]
    assert warning.type == "Warning" and warning.message == condition(first).message
    assert (condition(first).status, condition(first).reason) == ("False", "PodLocal")
    later = NOW + timedelta(seconds=5)
    running = reconcile.plan(seen(pod_local, first.status, now=later, driver=driver(pod_local)))
    assert not running.create_driver and not running.events
    assert condition(running).last_transition_time == NOW  # the condition stays, unchanged


def test_a_shared_checkpoint_is_a_true_condition_and_no_warning():
    step = reconcile.plan(seen(job(), JobStatus()))
    assert step.create_driver and "CheckpointNotShared" not in [e.reason for e in step.events]
    assert (condition(step).status, condition(step).reason) == ("True", "SharedVolume")
    unshared = reconcile.plan(seen(job("/tmp/wc"), step.status, now=NOW + timedelta(seconds=5)))
    assert condition(unshared).status == "False"
    assert condition(unshared).last_transition_time == NOW + timedelta(seconds=5)


def test_an_invalid_spec_keeps_the_last_judgement():
    judged = reconcile.plan(seen(job(), JobStatus())).status
    invalid = reconcile.Observation(
        **{**seen(job(), judged).__dict__, "job": None, "problems": ("x",)}
    )
    assert condition(reconcile.plan(invalid)).status == "True"
