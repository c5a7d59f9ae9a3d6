"""A job with `driver.standby` under the operator as it ships, on the real API server: two driver
pods with their own names (one per attempt) and executors, both electing through the job's Lease; the status
names the Lease holder as leader; a lost pod is replaced at once without counting a restart; a
spec change replaces both. On the hollow node nothing runs (see test_operator.py), so the
Lease is written here as the drivers write it (their own election is tested for real in
test_driver_lease.py); and the node's one CPU fits one 1-core driver, so the second pod may stay
Pending, which changes nothing the operator decides.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.k8s import test_operator
from tests.k8s.test_operator import Harness
from tests.k8s.test_platform import budgets

pytestmark = pytest.mark.k8s

chart_crds = test_operator.chart_crds
namespace = test_operator.namespace
chart_release = test_operator.chart_release
operator_process = test_operator.operator_process
k8s = test_operator.k8s

JOB = "pair"
FIRST, SECOND, THIRD = (f"{JOB}-driver-{n}" for n in (1, 2, 3))  # a pod name per attempt
LEASE = f"{JOB}-driver"  # the job's Lease, like its Service and its drivers' budget


def live_pods(k8s: Harness) -> dict[str, client.V1Pod]:
    return {
        p.metadata.name: p
        for p in k8s.pods(JOB)
        if p.metadata.labels.get("dstream.dev/role") == "driver"
        and not p.metadata.deletion_timestamp
    }


def hold_lease(k8s: Harness, holder: client.V1Pod) -> None:
    """Write the job's Lease as the driver pod `holder` does when it takes the lead."""
    api = client.CoordinationV1Api(k8s.cluster.api_client)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    identity = f"{holder.metadata.name}/{holder.metadata.uid}"  # kube_lease.identity
    spec = {"holderIdentity": identity, "leaseDurationSeconds": 10, "renewTime": now}
    try:
        api.patch_namespaced_lease(
            LEASE, k8s.namespace, {"spec": spec}, _content_type="application/merge-patch+json"
        )
    except ApiException as error:
        if error.status != 404:
            raise
        body = {"metadata": {"name": LEASE}, "spec": spec}
        api.create_namespaced_lease(k8s.namespace, body)


def roles(k8s: Harness) -> dict[str, str]:
    """status.driver's leader and standby (its replacement count is checked apart)."""
    driver = k8s.status(JOB).get("driver") or {}
    return {role: driver[role] for role in ("leader", "standby") if role in driver}


def test_a_standby_job_runs_two_drivers_and_replaces_a_lost_one_at_once(k8s: Harness):
    k8s.create_job(JOB, driver={"cores": 1, "memory": "512m", "standby": True})
    pods = k8s.wait_for("two driver pods", lambda: len(p := live_pods(k8s)) == 2 and p)
    assert set(pods) == {FIRST, SECOND}
    args = {name: pod.spec.containers[0].args for name, pod in pods.items()}
    assert all("--standby" in a for a in args.values())
    lease_conf = f"spark.dstream.lease.kubernetes={k8s.namespace}/{LEASE}"
    assert all(lease_conf in a for a in args.values())
    assert f"spark.kubernetes.executor.podNamePrefix={SECOND}" in args[SECOND]

    budget = budgets(k8s).get(name=LEASE, namespace=k8s.namespace).to_dict()
    assert budget["spec"]["minAvailable"] == 1  # one of the two drivers at a time
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
    k8s.wait_for(f"{FIRST} replaced by {THIRD}", lambda: live_pods(k8s).keys() == {SECOND, THIRD})
    status = k8s.wait_for(
        "the replacement counted",
        lambda: (s := k8s.status(JOB))["driver"].get("replacements") == 1 and s,
    )
    assert status["restarts"] == 0 and "DriverLost" in k8s.event_reasons(JOB)
    lost_events = k8s.core.list_namespaced_event(
        k8s.namespace, field_selector=f"involvedObject.name={JOB},reason=DriverLost"
    ).items
    assert any(f"{SECOND} leads; replacing {FIRST}" in e.message for e in lost_events)

    k8s.patch_spec(JOB, {"batchInterval": "2s"})
    k8s.wait_for(
        "both drivers replaced for the spec change",
        lambda: live_pods(k8s).keys() == {f"{JOB}-driver-4", f"{JOB}-driver-5"},
        timeout=2 * test_operator.WAIT_SECONDS,
    )
