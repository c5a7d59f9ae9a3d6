"""`driver.standby`: the two driver pods the operator builds, and the pure plans that keep two of
them running (reconcile._plan_pair); the drivers' own Lease election is tested on the real API
server (tests/k8s/test_driver_lease.py)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import yaml
from dstream.runtime.leadership import kube_lease
from dstream.runtime.leadership.lease import KUBE_LEASE_KEY
from dstream.spec import parse_job
from dstream_operator import reconcile, resources, status
from dstream_operator.resources import Owner, Platform, job_manifest
from dstream_operator.status import JobStatus, PodFacts

from tests.operator.test_status_and_restarts import NOW
from tests.operator.test_status_and_restarts import seen as seen_one

OWNER = Owner("wc", "jobs", "uid-wc")
FIRST, SECOND = "wc-driver-1", "wc-driver-2"  # the first two attempts


def job(standby: bool = True, **spec):
    base = {
        "batchInterval": "2s",
        "app": {"builtin": "wordcount"},
        "source": {"type": "rate", "rate": {"recordsPerSecond": 10}},
        "driver": {"standby": standby},
    }
    document = {
        "apiVersion": "dstream.dev/v1alpha1",
        "kind": "StreamingJob",
        "metadata": {"name": "wc", "namespace": "jobs"},
        "spec": base | spec,
    }
    return parse_job(document)


def conf_of(pod) -> dict[str, str]:
    args = pod["spec"]["containers"][0]["args"]
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")


def pod(name: str, spec_job=None, ready: bool = False, **kw) -> PodFacts:
    body = {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "annotations": {"dstream.dev/spec-hash": resources.spec_hash(spec_job or job())},
            "ownerReferences": [{"uid": "uid-wc", "controller": True}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }
    facts = status.pod_facts(body)
    return facts.__class__(**{**facts.__dict__, **kw})


def seen(spec_job=None, **kw) -> reconcile.Observation:
    """An observation of a standby job (test_status_and_restarts.seen, with this job)."""
    return seen_one(spec_job or job(), **kw)


def test_two_driver_pods_each_with_its_own_name_executors_and_the_jobs_lease():
    spec_job = job()
    assert resources.driver_pod_count(spec_job) == 2
    assert resources.driver_pod_count(job(standby=False)) == 1
    assert [resources.driver_name("wc", n) for n in (1, 2)] == [FIRST, SECOND]
    pods = [resources.driver_pod(spec_job, OWNER, pod=n) for n in (FIRST, SECOND)]
    assert [p["metadata"]["name"] for p in pods] == [FIRST, SECOND]
    confs = [conf_of(p) for p in pods]
    prefixes = [c["spark.kubernetes.executor.podNamePrefix"] for c in confs]
    assert prefixes == [FIRST, SECOND]  # the two drivers' executors run side by side
    assert {c[KUBE_LEASE_KEY] for c in confs} == {"jobs/wc-driver"}  # the driver's own key
    assert {c["spark.driver.host"] for c in confs} == {"$(POD_IP)"}  # not the leader's Service
    assert all("--standby" in p["spec"]["containers"][0]["args"] for p in pods)
    single = resources.driver_pod(job(standby=False), OWNER)
    assert "--standby" in single["spec"]["containers"][0]["args"]  # waits for the lead too
    assert KUBE_LEASE_KEY not in conf_of(single)  # by the checkpoint's lock and lease


def test_the_standby_changes_the_drivers_spec_hash():
    """Turning the standby on or off restarts the drivers: they run with other arguments."""
    assert resources.spec_hash(job()) != resources.spec_hash(job(standby=False))


def test_executors_are_counted_per_driver_pod():
    executors = {
        "wc-driver-1-exec-1": True,
        "wc-driver-1-exec-2": False,
        "wc-driver-2-exec-1": True,
    }
    first = {"wc-driver-1-exec-1": True, "wc-driver-1-exec-2": False}
    assert resources.executors_of(FIRST, executors) == first
    assert resources.executors_of(SECOND, executors) == {"wc-driver-2-exec-1": True}


@pytest.mark.parametrize("policy_version", resources.POLICY_VERSIONS)
def test_the_driver_budget_keeps_one_of_the_two(policy_version):
    budget = resources.disruption_budget(job(), OWNER, "driver", policy_version)
    assert budget["spec"]["minAvailable"] == 1


def test_the_service_points_at_the_ready_driver_only_and_the_role_grants_the_lease():
    children = {c["kind"]: c for c in resources.children(job(), OWNER, Platform())}
    assert children["Service"]["spec"]["publishNotReadyAddresses"] is False
    plain = {c["kind"]: c for c in resources.children(job(standby=False), OWNER, Platform())}
    assert plain["Service"]["spec"]["publishNotReadyAddresses"] is True
    _account, role, _binding = resources.driver_identity("jobs")  # shared by the namespace
    lease_rules = [r for r in role["rules"] if "leases" in r["resources"]]
    assert [(r["apiGroups"], r["verbs"]) for r in lease_rules] == [
        (["coordination.k8s.io"], ["get", "create", "patch"])
    ]


def test_a_new_standby_job_gets_both_drivers():
    step = reconcile.plan(seen(current=JobStatus()))
    assert step.create_driver and step.status.phase == "Starting"


def test_both_running_the_lease_holder_leads_and_the_other_stands_by():
    step = reconcile.plan(seen(driver=pod(FIRST), second=pod(SECOND, ready=True), leader=SECOND))
    assert not (step.create_driver or step.stop_driver or step.ended_pods or step.events)
    assert step.status.driver_pod == SECOND and step.status.phase == "Running"
    assert (step.status.driver.leader, step.status.driver.standby) == (SECOND, FIRST)
    unelected = reconcile.plan(seen(driver=pod(FIRST), second=pod(SECOND)))
    assert (unelected.status.driver.leader, unelected.status.driver.standby) == (None, None)


def test_a_killed_leader_is_replaced_at_once_without_counting_a_restart():
    killed = pod(FIRST, phase="Failed", exit_code=137)
    step = reconcile.plan(seen(driver=killed, second=pod(SECOND, ready=True), leader=SECOND))
    assert step.ended_pods == [FIRST] and step.stop_driver is None
    assert not step.restarted and step.status.restarts == 0
    assert not step.create_driver  # once it is marked: the next step
    (event,) = step.events
    assert event.reason == "DriverLost" and f"{SECOND} leads; replacing {FIRST}" in event.message
    marked = killed.__class__(
        **{**killed.__dict__, "stop_reason": reconcile.STOP_ENDED, "deleting": True}
    )
    after = reconcile.plan(  # not waiting for the marked pod to go: the new one has its own name
        seen(driver=pod(SECOND, ready=True), stopping=(marked,), leader=SECOND, current=step.status)
    )
    assert after.create_driver and not after.restarted
    assert [e.reason for e in after.events] == ["CheckpointNotShared"]  # the job has none
    assert (after.status.driver.leader, after.status.driver.standby) == (SECOND, None)


def test_a_lost_leaders_replacement_waits_for_the_standby_to_complete_a_batch():
    """A standby that takes over runs its first batches on executors new to the job's code; its
    replacement's driver and executors are not started beside them (issue 28)."""
    killed = pod(FIRST, phase="Failed", exit_code=137)
    step = reconcile.plan(seen(driver=killed, second=pod(SECOND), leader=SECOND))
    assert step.ended_pods == [FIRST] and not step.restarted
    assert step.events[0].message.endswith(f"replacing {FIRST} once {SECOND} has completed a batch")
    marked = killed.__class__(
        **{**killed.__dict__, "stop_reason": reconcile.STOP_ENDED, "deleting": True}
    )
    taking_over = reconcile.plan(
        seen(driver=pod(SECOND), stopping=(marked,), leader=SECOND, current=step.status)
    )
    assert not taking_over.create_driver and not taking_over.events
    assert taking_over.status.driver.replacements == 0 and taking_over.wake_at is None
    leading = reconcile.plan(
        seen(driver=pod(SECOND, ready=True), stopping=(marked,), leader=SECOND, current=step.status)
    )
    assert leading.create_driver and leading.status.driver.replacements == 1


def test_a_pod_of_the_two_that_keeps_dying_is_replaced_under_the_restart_backoff():
    """restartPolicy: backoffSeconds 10, resetAfterSeconds 600 (the defaults)."""
    lost = dict(second=pod(SECOND, ready=True), vanished=pod(FIRST), leader=SECOND)
    first = reconcile.plan(seen(**lost))
    assert first.create_driver and first.status.driver.replacements == 1
    soon = first.status
    assert soon.driver.last_replaced_time == NOW
    again = reconcile.plan(seen(**lost, current=soon))  # lost again at once: wait 10 s
    assert not again.create_driver and again.wake_at == NOW + timedelta(seconds=10)
    assert again.status.driver.replacements == 1
    killed = pod(FIRST, phase="Failed", exit_code=1)
    ended = reconcile.plan(seen(driver=killed, second=lost["second"], leader=SECOND, current=soon))
    assert ended.events[0].message.endswith(f"replacing {FIRST} in 10 s")
    later = soon.model_copy(
        update={
            "driver": soon.driver.model_copy(
                update={"last_replaced_time": NOW - timedelta(seconds=10)}
            )
        }
    )
    due = reconcile.plan(seen(**lost, current=later))
    assert due.create_driver and due.status.driver.replacements == 2
    stable = later.model_copy(
        update={
            "driver": later.driver.model_copy(
                update={"replacements": 5, "last_replaced_time": NOW - timedelta(seconds=600)}
            )
        }
    )
    reset = reconcile.plan(seen(**lost, current=stable))  # a long run since: at once again
    assert reset.create_driver and reset.status.driver.replacements == 1


def test_the_loss_of_the_lease_holder_says_the_other_takes_over():
    killed = pod(FIRST, phase="Failed", exit_code=137)
    step = reconcile.plan(seen(driver=killed, second=pod(SECOND), leader=FIRST))
    assert step.ended_pods == [FIRST] and not step.restarted
    assert f"{SECOND} takes over once the Lease is free" in step.events[0].message
    assert (step.status.driver.leader, step.status.driver.standby) == (None, None)


def test_a_deleted_standby_is_replaced_too():
    step = reconcile.plan(
        seen(driver=pod(FIRST, ready=True), second_vanished=pod(SECOND), leader=FIRST)
    )
    assert step.create_driver and not step.restarted
    assert f"driver pod {SECOND} was deleted; {FIRST} leads" in step.events[0].message


def test_both_lost_is_one_restart_under_the_restart_policy():
    first, second = pod(FIRST, phase="Failed"), pod(SECOND, phase="Failed")
    step = reconcile.plan(seen(driver=first, second=second))
    assert step.stop_driver == reconcile.STOP_ENDED and step.restarted
    assert step.status.restarts == 1 and step.status.phase == "Recovering"


def test_a_spec_change_restarts_both():
    old = job(batchInterval="4s")
    step = reconcile.plan(
        seen(driver=pod(FIRST, old), second=pod(SECOND, old, ready=True), leader=SECOND)
    )
    assert step.stop_driver == reconcile.STOP_SPEC_CHANGE and not step.create_driver


def test_suspending_stops_both():
    suspended = job(suspend=True)
    step = reconcile.plan(
        seen(suspended, driver=pod(FIRST, suspended), second=pod(SECOND, suspended))
    )
    assert step.stop_driver == reconcile.STOP_SUSPEND and not step.create_driver


def test_turning_the_standby_off_stops_the_pair_and_starts_one():
    single = job(standby=False)
    step = reconcile.plan(seen(single, driver=pod(FIRST), second=pod(SECOND), leader=FIRST))
    assert step.stop_driver == reconcile.STOP_SPEC_CHANGE


def test_a_lost_pod_of_an_unproven_changed_spec_fails_the_job_and_leads_to_a_rollback():
    """Its partner runs the same spec that never committed a batch: no safety net. Its loss
    restarts both and counts towards rollbackAfterFailures (2 by default); replaced one by one,
    a broken pair would never be rolled back."""
    changed = job(batchInterval="4s")
    stable_text = yaml.safe_dump(job_manifest(job())["spec"], sort_keys=True)
    proven = JobStatus(
        phase="Running", stable_spec=stable_text, stable_spec_hash=resources.spec_hash(job())
    )
    crashed = pod(FIRST, changed, phase="Failed", exit_code=1)
    pair = dict(driver=crashed, second=pod(SECOND, changed, ready=True), leader=SECOND)
    first = reconcile.plan(seen(changed, **pair, current=proven))
    assert first.stop_driver == reconcile.STOP_ENDED and first.restarted  # both go
    assert first.status.upgrade_failures == 1 and first.status.restarts == 1

    second = reconcile.plan(seen(changed, **pair, current=first.status))
    assert second.status.rolled_back_from == resources.spec_hash(changed)
    assert "RolledBack" in [e.reason for e in second.events]
    again = reconcile.plan(seen(changed, current=second.status))  # both pods gone
    assert again.create_driver and again.run_job.spec == job().spec

    replaced = reconcile.plan(seen(changed, **pair, current=JobStatus(phase="Running")))
    assert not replaced.restarted and replaced.ended_pods == [FIRST]  # nothing to go back to


def test_a_driver_pod_names_itself_in_the_lease_as_the_operator_reads_it(monkeypatch):
    """`<name>/<uid>`: a pod created again under a dead leader's name is not that leader."""
    env = resources.driver_pod(job(), OWNER)["spec"]["containers"][0]["env"]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in env if "valueFrom" in e}
    assert (fields["POD_NAME"], fields["POD_UID"]) == ("metadata.name", "metadata.uid")
    monkeypatch.setenv("POD_NAME", FIRST)
    monkeypatch.setenv("POD_UID", "uid-7")
    assert kube_lease.identity() == resources.lease_identity(FIRST, "uid-7")
    monkeypatch.delenv("POD_UID")
    assert kube_lease.identity().endswith(f":{os.getpid()}")  # outside a pod: host:pid
