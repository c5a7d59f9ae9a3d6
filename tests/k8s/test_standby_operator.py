"""A job with `driver.standby` under the operator as it ships, on the real API server: two
driver pods with their own names (one per attempt) and executors, both electing through the
job's Lease; the status names the Lease holder as leader; a lost pod is replaced without
counting a restart once the survivor is ready (has completed a batch); a spec change replaces
both; a changed spec that fails before its first batch is rolled back for both; the drivers'
PodDisruptionBudget lets the Eviction API take one of the two at a time. On the hollow node
nothing runs (see test_operator.py), so the Lease is written here as the drivers write it
(their own election is tested for real in test_driver_lease.py); and the node's one CPU fits
one 1-core driver, so the second pod may stay Pending, which changes nothing the operator
decides (the later tests ask for 250m, and both run).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.k8s import test_operator, test_platform
from tests.k8s.test_operator import CHECKPOINT_VOLUME, SPEC_HASH, Harness, crash_pod
from tests.k8s.test_platform import budget, budget_status, commit_a_batch

pytestmark = pytest.mark.k8s

chart_crds = test_operator.chart_crds
namespace = test_operator.namespace
chart_release = test_operator.chart_release
operator_process = test_operator.operator_process
k8s = test_operator.k8s
configured = test_platform.configured

JOB = "pair"
FIRST, SECOND, THIRD = (f"{JOB}-driver-{n}" for n in (1, 2, 3))  # a pod name per attempt
LEASE = f"{JOB}-driver"  # the job's Lease, like its Service and its drivers' budget


def live_pods(k8s: Harness, job: str = JOB) -> dict[str, client.V1Pod]:
    return {
        p.metadata.name: p
        for p in k8s.pods(job)
        if p.metadata.labels.get("dstream.dev/role") == "driver"
        and not p.metadata.deletion_timestamp
    }


def hold_lease(k8s: Harness, holder: client.V1Pod, lease: str = LEASE) -> None:
    """Write the job's Lease as the driver pod `holder` does when it takes the lead."""
    api = client.CoordinationV1Api(k8s.cluster.api_client)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    identity = f"{holder.metadata.name}/{holder.metadata.uid}"  # kube_lease.identity
    spec = {"holderIdentity": identity, "leaseDurationSeconds": 10, "renewTime": now}
    try:
        api.patch_namespaced_lease(
            lease, k8s.namespace, {"spec": spec}, _content_type="application/merge-patch+json"
        )
    except ApiException as error:
        if error.status != 404:
            raise
        body = {"metadata": {"name": lease}, "spec": spec}
        api.create_namespaced_lease(k8s.namespace, body)


def lost_messages(k8s: Harness) -> list[str]:
    """The job's DriverLost events' messages."""
    selector = f"involvedObject.name={JOB},reason=DriverLost"
    return [
        e.message
        for e in k8s.core.list_namespaced_event(k8s.namespace, field_selector=selector).items
    ]


def roles(k8s: Harness, job: str = JOB) -> dict[str, str]:
    """status.driver's leader and standby (its replacement count is checked apart)."""
    driver = k8s.status(job).get("driver") or {}
    return {role: driver[role] for role in ("leader", "standby") if role in driver}


def test_a_standby_job_runs_two_drivers_and_replaces_a_lost_one_once_the_other_is_ready(
    k8s: Harness,
):
    k8s.create_job(JOB, driver={"cores": 1, "memory": "512m", "standby": True})
    pods = k8s.wait_for("two driver pods", lambda: len(p := live_pods(k8s)) == 2 and p)
    assert set(pods) == {FIRST, SECOND}
    args = {name: pod.spec.containers[0].args for name, pod in pods.items()}
    assert all("--standby" in a for a in args.values())
    lease_conf = f"spark.dstream.lease.kubernetes={k8s.namespace}/{LEASE}"
    assert all(lease_conf in a for a in args.values())
    assert f"spark.kubernetes.executor.podNamePrefix={SECOND}" in args[SECOND]

    pair_budget = k8s.wait_for("the drivers' budget", lambda: budget(k8s, LEASE))
    assert pair_budget["spec"]["minAvailable"] == 1  # one of the two drivers at a time
    children = k8s.children(JOB)
    assert not children["Service"].spec.publish_not_ready_addresses  # the ready leader only
    shared = client.RbacAuthorizationV1Api(k8s.cluster.api_client).read_namespaced_role(
        "dstream-driver", k8s.namespace
    )  # the namespace's drivers' Role
    lease_rules = [r for r in shared.rules if "leases" in r.resources]
    assert [sorted(r.verbs) for r in lease_rules] == [["create", "get", "patch"]]

    assert {e.name for e in pods[SECOND].spec.containers[0].env} >= {"POD_NAME", "POD_UID"}
    hold_lease(k8s, pods[SECOND])
    k8s.wait_for(
        "the Lease holder shown as leader",
        lambda: roles(k8s) == {"leader": SECOND, "standby": FIRST},
    )
    assert k8s.status(JOB)["driverPod"] == SECOND

    k8s.core.delete_namespaced_pod(FIRST, k8s.namespace, grace_period_seconds=0)
    waiting = f"{SECOND} leads; replacing {FIRST} once {SECOND} has completed a batch"
    k8s.wait_for("the loss reported", lambda: any(waiting in m for m in lost_messages(k8s)))
    assert THIRD not in live_pods(k8s)  # SECOND is not ready: nothing runs on the hollow node

    def replaced() -> bool:
        mark_ready(k8s, pods[SECOND])  # as its probe would after a batch (the node takes it back)
        return live_pods(k8s).keys() == {SECOND, THIRD}

    k8s.wait_for(f"{FIRST} replaced by {THIRD} once {SECOND} is ready", replaced)
    status = k8s.wait_for(
        "the replacement counted",
        lambda: (s := k8s.status(JOB))["driver"].get("replacements") == 1 and s,
    )
    assert status["restarts"] == 0

    k8s.patch_spec(JOB, {"batchInterval": "2s"})
    k8s.wait_for(
        "both drivers replaced for the spec change",
        lambda: live_pods(k8s).keys() == {f"{JOB}-driver-4", f"{JOB}-driver-5"},
        timeout=2 * test_operator.WAIT_SECONDS,
    )


# A job of its own name: the Lease and budget of a deleted job of the same name may outlive it
# (until the garbage collector's next pass).
DRAINED = "drained"
DRAINED_LEASE = f"{DRAINED}-driver"
# Two drivers of 250m fit the hollow node's one CPU: both run.
SMALL_PAIR = {"cores": 1, "coresRequest": "250m", "memory": "512m", "standby": True}


def running_pair(
    k8s: Harness, spec_hash: str, same: bool, job: str = JOB
) -> dict[str, client.V1Pod]:
    """The job's two driver pods once both Running, of a spec of that hash (or of another);
    failing, it says what the job's pods were."""
    try:
        return _running_pair(k8s, spec_hash, same, job)
    except pytest.fail.Exception as failure:
        pods = [
            (p.metadata.name, p.status.phase, p.metadata.deletion_timestamp) for p in k8s.pods(job)
        ]
        pytest.fail(f"{failure}\npods (name, phase, deleted): {pods}\nstatus: {k8s.status(job)}")


def _running_pair(k8s: Harness, spec_hash: str, same: bool, job: str) -> dict[str, client.V1Pod]:
    return k8s.wait_for(
        f"two Running drivers {'of' if same else 'not of'} spec {spec_hash}",
        lambda: (
            len(pods := live_pods(k8s, job)) == 2
            and all(
                p.status.phase == "Running"
                and (p.metadata.annotations[SPEC_HASH] == spec_hash) == same
                for p in pods.values()
            )
            and pods
        ),
        timeout=2 * test_operator.WAIT_SECONDS,
    )


def test_a_standby_jobs_changed_spec_that_never_commits_is_rolled_back(configured: Harness):
    """As for one driver (test_platform.py), with the pair: a changed spec's pod that fails
    before the first batch fails the job (its partner runs the same spec), both restart; after
    rollbackAfterFailures of them both drivers run the stable spec again. The failures are
    one pod at a time, as two drivers crash in practice."""
    k8s = configured
    k8s.create_job(
        JOB,
        driver=SMALL_PAIR,
        volumes=[CHECKPOINT_VOLUME],
        checkpoint={"path": "/state/pair"},
        upgrade={"rollbackOnFailure": True, "rollbackAfterFailures": 2},
    )
    first = running_pair(k8s, "", same=False)
    hold_lease(k8s, newest(first))  # the leader: the pod commit_a_batch serves as
    stable = commit_a_batch(k8s, JOB)["stableSpecHash"]
    assert {p.metadata.annotations[SPEC_HASH] for p in first.values()} == {stable}

    k8s.patch_spec(JOB, {"source": {"type": "rate", "rate": {"recordsPerSecond": 500}}})
    for failures in (1, 2):
        broken = running_pair(k8s, stable, same=False)
        crash_pod(k8s, min(broken.values(), key=lambda p: p.metadata.name))  # one of the two
        if failures == 1:
            status = k8s.wait_for(
                "upgradeFailures 1",
                lambda: (s := k8s.status(JOB)).get("upgradeFailures") == 1 and s,
            )
            assert status["restarts"] == 1
    changed = next(iter(broken.values())).metadata.annotations[SPEC_HASH]

    status = k8s.wait_for("rolled back", lambda: (s := k8s.status(JOB)).get("rolledBackFrom") and s)
    assert (status["rolledBackFrom"], status["stableSpecHash"]) == (changed, stable)
    assert "RolledBack" in k8s.event_reasons(JOB)
    rolled = running_pair(k8s, stable, same=True)  # both drivers of the stable spec
    assert all("--standby" in p.spec.containers[0].args for p in rolled.values())


def newest(pods: dict[str, client.V1Pod]) -> client.V1Pod:
    """The pod of the latest attempt (`<job>-driver-<n>`)."""
    return max(pods.values(), key=lambda p: int(p.metadata.name.rsplit("-", 1)[1]))


def evict(k8s: Harness, pod: client.V1Pod) -> None:
    """The Eviction API (policy/v1beta1 on Kubernetes 1.20), as `kubectl drain` calls it."""
    body = client.V1Eviction(
        api_version="policy/v1beta1",
        kind="Eviction",
        metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=k8s.namespace),
    )
    k8s.core.create_namespaced_pod_eviction(pod.metadata.name, k8s.namespace, body)


def mark_ready(k8s: Harness, pod: client.V1Pod) -> None:
    """The pod's Ready condition as a passing readiness probe sets it (the hollow kubelet
    takes it back within seconds; a pod still Pending has none yet)."""
    current = k8s.core.read_namespaced_pod(pod.metadata.name, k8s.namespace)
    ready = ("Ready", "ContainersReady")
    conditions = [
        {"type": c.type, "status": c.status}
        for c in current.status.conditions or []
        if c.type not in ready
    ] + [{"type": kind, "status": "True"} for kind in ready]
    k8s.patch_pod_status(pod.metadata.name, {"conditions": conditions})


def evict_the_standby(k8s: Harness, leader: client.V1Pod, standby: client.V1Pod) -> None:
    """Evict the standby while the leader is Ready, as in a running job: the not-ready standby
    may go while the budget has its healthy pod. The hollow kubelet takes the leader's
    readiness back within seconds; a refusal that says so (0 healthy) is tried again."""
    for _attempt in range(5):
        mark_ready(k8s, leader)
        k8s.wait_for(
            "the disruption controller counts the Ready leader",
            lambda: budget_status(k8s, DRAINED_LEASE).get("currentHealthy") == 1,
        )
        try:
            evict(k8s, standby)
            return
        except ApiException as error:
            if error.status != 429 or "has 0 currently" not in error.body:
                raise
    pytest.fail("the standby's eviction was refused every time")


def test_the_pair_budget_lets_a_drain_evict_one_driver_at_a_time(k8s: Harness):
    """The drivers' PodDisruptionBudget (minAvailable 1 of 2), enforced by the API server's
    Eviction API with the status the disruption controller keeps: the standby may be evicted;
    the leader then may not, while the standby's replacement is not ready."""
    k8s.create_job(DRAINED, driver=SMALL_PAIR)
    pods = running_pair(k8s, "", same=False, job=DRAINED)
    leader = newest(pods)
    (standby,) = [p for p in pods.values() if p is not leader]
    hold_lease(k8s, leader, DRAINED_LEASE)
    k8s.wait_for(
        "the leader shown", lambda: roles(k8s, DRAINED).get("leader") == leader.metadata.name
    )
    k8s.wait_for(  # minAvailable 1: the disruption controller has counted the budget
        "the budget evaluated",
        lambda: budget_status(k8s, DRAINED_LEASE).get("desiredHealthy") == 1,
    )

    evict_the_standby(k8s, leader, standby)
    assert standby.metadata.name not in live_pods(k8s, DRAINED)  # on its way out, or gone
    with pytest.raises(ApiException) as refused:
        evict(k8s, leader)
    assert refused.value.status == 429
    assert "disruption budget" in refused.value.body
    assert leader.metadata.name in live_pods(k8s, DRAINED)  # not deleted
