"""The drivers' election through a real Kubernetes Lease (runtime/kube_lease.py), on the real API
server: first two candidates in this process (taking, renewing, expiry, release), then two real
`dstream run --standby` processes on this machine electing through the Lease as the two driver
pods of a `driver.standby` job do: the leader's process group is killed, the standby takes over
once the Lease expires, and every committed batch is exact (the checker of the local standby
test, fault/harness.py).

    lease: first batch +Xs (lead_taken=+Ys, state_restored=+Zs, ...)
    lease takeover: killed->first batch Xs (lease Ys) epochs=[...]
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from conditions import eventually
from dstream.runtime.leadership.kube_lease import KubeLease
from fault.harness import RateJob, verify
from fault.test_fault_standby import Takeovers, commits_by_epoch, settle, warm
from kubernetes import client
from running_driver import Driver
from servers import free_port

from tests.k8s.conftest import LocalCluster

pytestmark = pytest.mark.k8s

LEASE_S = 3
JOB = "faultapp"  # the name RateJob gives its job
STEP_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def lease_namespace(k8s_cluster: LocalCluster) -> Iterator[str]:
    with k8s_cluster.namespace("dstream-lease") as name:
        yield name


def candidate(
    cluster: LocalCluster, namespace: str, name: str, identity: str, duration_s: float = 2
) -> KubeLease:
    api = client.CoordinationV1Api(cluster.api_client)
    return KubeLease(api, namespace, name, identity, duration_s)


def holder(cluster: LocalCluster, namespace: str, name: str) -> client.V1LeaseSpec:
    api = client.CoordinationV1Api(cluster.api_client)
    return api.read_namespaced_lease(name, namespace).spec


def test_one_candidate_holds_the_lease_until_it_expires_or_is_released(
    k8s_cluster: LocalCluster, lease_namespace: str
):
    a = candidate(k8s_cluster, lease_namespace, "job-a", "driver-a")
    b = candidate(k8s_cluster, lease_namespace, "job-a", "driver-b")
    assert a.try_acquire() and not b.try_acquire()
    assert a.renew() is None and not b.try_acquire()  # renewed: not expired for b
    assert "held by driver-a" in b.describe()
    waited_from = time.monotonic()
    eventually(b.try_acquire, 15)  # a stops renewing, as a killed driver does
    assert time.monotonic() - waited_from >= 2 - 0.5  # not before the Lease's duration
    assert a.renew() == "the Lease is held by driver-b"
    spec = holder(k8s_cluster, lease_namespace, "job-a")
    assert (spec.holder_identity, spec.lease_transitions) == ("driver-b", 1)
    b.release()
    assert holder(k8s_cluster, lease_namespace, "job-a").holder_identity is None
    assert a.try_acquire()  # released: no need to wait for an expiry
    assert holder(k8s_cluster, lease_namespace, "job-a").lease_transitions == 2


def test_a_leader_cut_off_from_the_api_server_gives_up_before_another_may_take_over(
    k8s_cluster: LocalCluster, lease_namespace: str
):
    """Its renewals fail (a closed port stands for the lost API server): it goes on leading for
    two thirds of the duration, then gives up, a third of the duration before another driver
    may take the Lease."""
    a = candidate(k8s_cluster, lease_namespace, "job-b", "driver-a", duration_s=6)
    assert a.try_acquire()
    cut_off = client.Configuration()
    cut_off.host = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    a.api = client.CoordinationV1Api(client.ApiClient(cut_off))
    assert a.renew() is None  # within the deadline: still leading
    lost = eventually(a.renew, 20)
    assert lost == "the Lease could not be renewed for 4.0s"
    b = candidate(k8s_cluster, lease_namespace, "job-b", "driver-b", duration_s=6)
    assert not b.try_acquire()  # the Lease has not expired yet for anyone else


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_standby_driver_takes_over_through_the_lease_when_the_leader_is_killed(
    k8s_cluster: LocalCluster, lease_namespace: str, tmp_path
):
    job = RateJob(tmp_path, batch_s=2, window_s=6, checkpoint_interval_s=4)
    job.write()
    lease = f"{lease_namespace}/{JOB}-driver"
    conf = (
        *("--conf", f"spark.dstream.lease.kubernetes={lease}"),
        *("--conf", f"spark.dstream.lease.durationSeconds={LEASE_S}"),
    )
    env = {"KUBECONFIG": str(k8s_cluster.kubeconfig)}
    drivers = [
        Driver(job.manifest, "--standby", *conf, env=env, log=tmp_path / f"{n}.log").start()
        for n in ("first", "second")
    ]
    try:
        leader = eventually(lambda: next((d for d in drivers if d.batch_lines()), None), 240)
        standby = drivers[1 - drivers.index(leader)]
        standby.wait_for_line(warm, STEP_TIMEOUT_S)
        spec = holder(k8s_cluster, lease_namespace, f"{JOB}-driver")
        assert spec.holder_identity.endswith(f":{leader.pid}"), spec
        assert not standby.batch_lines()  # the standby commits nothing while the Lease is held
        settle(leader)
        killed_at = time.time()
        leader.kill()
        takeovers = Takeovers()
        takeovers.timed("lease", standby, killed_at)
        (took,) = takeovers.seconds["lease"]
        # the Lease had to expire first (the holder never let go), counted from its last
        # renewal, at most a quarter of the duration before the kill
        assert took >= LEASE_S * 3 / 4
        settle(standby)
        assert standby.terminate(timeout_s=120) == 0
        released = holder(k8s_cluster, lease_namespace, f"{JOB}-driver")
        assert released.holder_identity is None  # a clean stop hands the Lease on at once
    finally:
        for driver in drivers:
            driver.kill()
    verdict = verify(job)
    epochs = sorted(set(commits_by_epoch(job).values()))
    print(f"\n{takeovers.lines[0]}")
    print(f"lease takeover: killed->first batch {took:.1f}s (lease {LEASE_S}s) epochs={epochs}")
    print(f"batches={verdict.batches} lost={verdict.lost} duplicated={verdict.duplicated}")
    assert epochs == [1, 2]  # one epoch per leader, claimed in the checkpoint
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert verdict.lost == 0 and verdict.duplicated == 0
