"""The kopf handlers and the supervisor against kmock: create, run, fail, restart, suspend,
change, delete."""

from __future__ import annotations

import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from tests.operator.conftest import (
    JOBS,
    PODS,
    current,
    driver,
    events,
    job_manifest,
    path,
    wait_for,
)

pytestmark = pytest.mark.asyncio


def status_of(cluster, name="wc") -> dict:
    return (current(cluster, JOBS, name) or {}).get("status") or {}


async def create(cluster, body) -> None:
    response = await cluster.post(path(JOBS), json=body)
    assert response.status == 200, await response.text()


async def set_driver_status(cluster, phase, ready=False, terminated=None) -> None:
    """On the job's newest driver pod (see `driver`)."""
    name = driver(cluster)["metadata"]["name"]
    await set_pod_status(cluster, name, phase, ready, terminated)


async def set_pod_status(cluster, name, phase, ready=False, terminated=None) -> None:
    conditions = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False"},
    ]
    state = {"terminated": terminated} if terminated else {"running": {}}
    status = {
        "phase": phase,
        "conditions": conditions,
        "containerStatuses": [{"name": "driver", "state": state}],
    }
    response = await cluster.patch(path(PODS, name), json={"status": status})
    assert response.status == 200, await response.text()


async def test_create_sets_up_children_and_driver(operator):
    await create(operator, job_manifest())
    pod = await wait_for(lambda: driver(operator))
    # the rest of the children follow the pod, before the step writes the status
    status = await wait_for(lambda: status_of(operator).get("driverPod") and status_of(operator))
    for resource, name in [
        ("v1/configmaps", "wc-job"),
        ("v1/services", "wc-driver"),
        ("policy/v1/poddisruptionbudgets", "wc-driver"),
        ("policy/v1/poddisruptionbudgets", "wc-executor"),
        (PODS, "wc-driver-1"),  # the first attempt's
    ]:
        child = current(operator, resource, name)
        assert child is not None, (resource, name)
        assert child["metadata"]["ownerReferences"][0]["uid"] == "uid-wc"
        assert child["metadata"]["labels"]["dstream.dev/job"] == "wc"
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "dstream.service.driver"]
    assert pod["spec"]["serviceAccountName"] == "dstream-driver"
    for resource in IDENTITY:  # the namespace's, owned by no job
        assert not current(operator, resource, "dstream-driver")["metadata"].get("ownerReferences")
    assert status["phase"] == "Pending"  # not scheduled yet
    assert status["executors"] == {"ready": 0, "desired": 2}
    assert status["observedGeneration"] == 1 and status["driverAttempts"] == 1
    assert not current(operator, JOBS, "wc")["metadata"].get("finalizers")
    await wait_for(lambda: {"SetUp", "DriverCreated"} <= {r for _, r, _ in events(operator)})


IDENTITY = (
    "v1/serviceaccounts",
    "rbac.authorization.k8s.io/v1/roles",
    "rbac.authorization.k8s.io/v1/rolebindings",
)


def writes(cluster, resource: str) -> int:
    """Creates and patches sent so far for objects of `resource`."""
    group_version, plural = resource.rsplit("/", 1)
    return sum(
        1
        for verb in ("post", "patch")
        for r in cluster[verb]
        if f"{group_version}/namespaces/" in str(r.url.path) and f"/{plural}" in str(r.url.path)
    )


async def test_jobs_of_a_namespace_share_one_driver_identity(operator):
    """Written once, by the namespace's first job: its later jobs' drivers wait for no new
    ServiceAccount token."""
    names = [f"job-{i}" for i in range(5)]
    for name in names:
        await create(operator, job_manifest(name))
    for name in names:
        pod = await wait_for(lambda name=name: driver(operator, name))
        assert pod["spec"]["serviceAccountName"] == "dstream-driver"
    assert {resource: writes(operator, resource) for resource in IDENTITY} == dict.fromkeys(
        IDENTITY, 1
    )
    binding = current(operator, "rbac.authorization.k8s.io/v1/rolebindings", "dstream-driver")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dstream-driver", "namespace": "jobs"}
    ]


async def test_a_users_account_gets_a_binding_of_its_own(operator):
    await create(operator, job_manifest(driver={"serviceAccountName": "analytics"}))
    pod = await wait_for(lambda: driver(operator))
    assert pod["spec"]["serviceAccountName"] == "analytics"
    bindings = "rbac.authorization.k8s.io/v1/rolebindings"
    binding = await wait_for(lambda: current(operator, bindings, "wc-driver-account"))
    assert binding["roleRef"]["name"] == "dstream-driver"
    assert [s["name"] for s in binding["subjects"]] == ["analytics"]
    assert binding["metadata"]["ownerReferences"][0]["uid"] == "uid-wc"

    await operator.patch(path(JOBS, "wc"), json={"spec": {"driver": {"serviceAccountName": None}}})
    await wait_for(lambda: current(operator, bindings, "wc-driver-account") is None)


async def test_deleting_a_job_deletes_its_driver_pod_at_once(operator):
    """Not left to the garbage collector, which kmock, like a busy controller-manager, does
    not run."""
    await create(operator, job_manifest())
    await wait_for(lambda: driver(operator))
    await wait_for(lambda: status_of(operator).get("driverPod"))
    await operator.delete(path(JOBS, "wc"))
    await wait_for(lambda: driver(operator) is None)
    assert current(operator, "v1/configmaps", "wc-job") is not None  # the collector's


async def test_running_driver_reports_batches(operator, driver_api):
    driver_api["lastBatch"] = {
        "time": "2026-01-02T03:04:05+00:00",
        "processingSeconds": 0.4,
        "schedulingDelaySeconds": 0.1,
        "totalDelaySeconds": 0.5,
        "records": 100,
    }
    driver_api["rateLimit"] = {"rate": 1500.0}
    driver_api["backlog"] = {"rate": 4200}
    await create(operator, job_manifest())
    await wait_for(lambda: driver(operator))
    await set_driver_status(operator, "Running", ready=True)
    status = await wait_for(
        lambda: status_of(operator).get("phase") == "Running" and status_of(operator)
    )
    status = await wait_for(
        lambda: status_of(operator).get("lastBatchTime") and status_of(operator)
    )
    assert status["rateLimit"] == 1500.0
    assert status["lagRecords"] == 4200
    assert status["totalDelaySeconds"] == 0.5
    assert {c["type"]: c["status"] for c in status["conditions"]}["DriverReady"] == "True"
    driver_api["state"] = "recovering"
    await wait_for(lambda: status_of(operator).get("phase") == "Recovering")


def replacement_driver(cluster) -> dict | None:
    """The driver pod once a new one replaced the Failed one: the operator may delete and
    recreate it between two polls, so the gap without a pod is not waited for."""
    pod = driver(cluster)
    return pod if pod and (pod.get("status") or {}).get("phase") != "Failed" else None


def restarts_metric() -> float:
    labels = {"namespace": "jobs", "job": "wc"}
    return REGISTRY.get_sample_value("dstream_operator_driver_restarts_total", labels) or 0.0


async def test_failed_driver_is_replaced_with_backoff_then_job_fails(operator):
    restarts_before = restarts_metric()
    await create(operator, job_manifest())
    await wait_for(lambda: driver(operator))
    for attempt in (1, 2):
        await set_driver_status(operator, "Failed", terminated={"exitCode": 1, "reason": "Error"})
        await wait_for(lambda n=attempt: status_of(operator).get("restarts") == n)
        assert status_of(operator)["phase"] == "Recovering"
        await wait_for(lambda: replacement_driver(operator))  # after the backoff
    await set_driver_status(operator, "Failed", terminated={"exitCode": 1, "reason": "Error"})
    status = await wait_for(
        lambda: status_of(operator).get("phase") == "Failed" and status_of(operator)
    )
    assert "maxRestarts (2) reached" in status["message"]
    assert "exit code 1" in status["message"]
    assert status["restarts"] == 2
    kinds = [reason for _, reason, _ in events(operator)]
    assert kinds.count("DriverLost") == 2 and "JobFailed" in kinds and "DriverRestarted" in kinds
    assert restarts_metric() - restarts_before == 2
    jobs_failed = {"phase": "Failed"}
    await wait_for(lambda: REGISTRY.get_sample_value("dstream_operator_jobs", jobs_failed) == 1)
    assert REGISTRY.get_sample_value(
        "dstream_operator_reconciliations_total", {"handler": "create"}
    )


async def test_deleted_driver_is_replaced_and_counted(operator):
    await create(operator, job_manifest())
    await wait_for(lambda: driver(operator))
    await operator.delete(path(PODS, "wc-driver-1"))
    await wait_for(lambda: status_of(operator).get("restarts") == 1)
    (lost,) = [m for _, reason, m in events(operator) if reason == "DriverLost"]
    assert "was deleted" in lost and "restart 1/2 now" in lost  # the first restart: at once
    replacement = await wait_for(lambda: driver(operator))
    assert replacement["metadata"]["name"] == "wc-driver-2"  # the second attempt's
    await wait_for(lambda: status_of(operator).get("driverAttempts") == 2)


async def test_never_policy_fails_at_once(operator):
    await create(operator, job_manifest(restartPolicy={"type": "Never"}))
    await wait_for(lambda: driver(operator))
    await set_driver_status(operator, "Failed", terminated={"exitCode": 3})
    status = await wait_for(
        lambda: status_of(operator).get("phase") == "Failed" and status_of(operator)
    )
    assert "restartPolicy is Never" in status["message"]


async def test_suspend_stops_driver_and_resume_starts_it(operator):
    await create(operator, job_manifest())
    await wait_for(lambda: driver(operator))
    await operator.patch(
        path(JOBS, "wc"), json={"spec": {"suspend": True}, "metadata": {"generation": 2}}
    )
    await wait_for(lambda: driver(operator) is None)
    stopped = operator.objects[PODS, "jobs", "wc-driver-1", -2]
    assert stopped["metadata"]["annotations"]["dstream.dev/stop-reason"] == "suspend"
    status = await wait_for(
        lambda: status_of(operator).get("phase") == "Suspended" and status_of(operator)
    )
    assert status["restarts"] == 0
    await operator.patch(
        path(JOBS, "wc"), json={"spec": {"suspend": False}, "metadata": {"generation": 3}}
    )
    await wait_for(lambda: driver(operator))
    await set_driver_status(operator, "Running", ready=False)
    await wait_for(lambda: status_of(operator).get("phase") == "Starting")
    assert status_of(operator)["restarts"] == 0


async def test_spec_change_restarts_driver_only_when_needed(operator):
    await create(operator, job_manifest())
    first = await wait_for(lambda: driver(operator))
    await operator.patch(path(JOBS, "wc"), json={"spec": {"restartPolicy": {"maxRestarts": 5}}})
    await wait_for(lambda: any("without restarting" in m for _, _, m in events(operator)))
    assert driver(operator)["metadata"] == first["metadata"]

    services = writes(operator, "v1/services")
    await operator.patch(path(JOBS, "wc"), json={"spec": {"executor": {"instances": 3}}})
    await wait_for(lambda: "spark.executor.instances=3" in str(driver(operator)))
    assert writes(operator, "v1/services") == services  # only the children that changed
    assert "instances: 3" in current(operator, "v1/configmaps", "wc-job")["data"]["job.yaml"]
    budget = current(operator, "policy/v1/poddisruptionbudgets", "wc-executor")
    assert budget["spec"]["minAvailable"] == 2  # follows the instances

    no_budget = {"disruptionBudget": {"enabled": False}}
    await operator.patch(path(JOBS, "wc"), json={"spec": {"executor": no_budget}})
    await wait_for(lambda: not current(operator, "policy/v1/poddisruptionbudgets", "wc-executor"))
    assert status_of(operator)["restarts"] == 0
    reasons = [reason for _, reason, _ in events(operator)]
    assert "Restarting" in reasons


async def test_invalid_spec_fails_the_job(operator):
    await create(operator, job_manifest(app={"builtin": "wordcount", "module": "a.b:c"}))
    status = await wait_for(
        lambda: status_of(operator).get("phase") == "Failed" and status_of(operator)
    )
    assert "exactly one of builtin or module" in status["message"]
    assert driver(operator) is None


async def test_checkpoint_deletion_uses_a_finalizer_and_a_cleanup_pod(operator):
    await create(
        operator,
        job_manifest(
            checkpoint={"path": "/data/ckpt/wc", "deleteOnJobDeletion": True},
            volumes=[
                {
                    "name": "data",
                    "mountPath": "/data",
                    "persistentVolumeClaim": {"claimName": "data"},
                }
            ],
        ),
    )
    await wait_for(lambda: driver(operator))
    await wait_for(lambda: current(operator, JOBS, "wc")["metadata"].get("finalizers"))
    await operator.delete(path(JOBS, "wc"))
    cleanup = await wait_for(lambda: current(operator, PODS, "wc-checkpoint-cleanup"))
    assert driver(operator) is None
    assert cleanup["spec"]["containers"][0]["command"] == ["rm", "-rf", "--", "/data/ckpt/wc"]
    await set_pod_status(operator, "wc-checkpoint-cleanup", "Succeeded")
    await wait_for(lambda: current(operator, JOBS, "wc") is None)
    assert "CheckpointDeleted" in [reason for _, reason, _ in events(operator)]


async def test_pods_are_filtered_by_label_on_the_api_server(operator):
    """kopf's `labels=` on a handler filters on the client; the watch itself asks the API
    server for the job's driver and executor pods only (kopf's label_selectors setting)."""

    def pod_watches() -> list:
        return [r for r in operator["get"] if "/pods" in str(r.url) and "watch" in str(r.url)]

    for request in await wait_for(pod_watches):  # kopf starts its watches one by one
        assert request.url.query.get("labelSelector") == (
            "dstream.dev/job,dstream.dev/role in (driver,executor)"
        )


async def test_a_stable_run_resets_the_restart_count(operator):
    policy = {"type": "Always", "maxRestarts": 2, "backoffSeconds": 1, "resetAfterSeconds": 1}
    await create(operator, job_manifest(restartPolicy=policy))
    await wait_for(lambda: driver(operator))
    await set_driver_status(operator, "Failed", terminated={"exitCode": 1})
    await wait_for(lambda: status_of(operator).get("restarts") == 1)
    await wait_for(lambda: replacement_driver(operator))
    await set_driver_status(operator, "Running", ready=True)
    await wait_for(lambda: status_of(operator).get("restarts") == 0)
    ready = next(c for c in status_of(operator)["conditions"] if c["type"] == "DriverReady")
    assert ready["status"] == "True"
    (reset,) = [m for _, reason, m in events(operator) if reason == "RestartCountReset"]
    assert "ready for 1s" in reset


def spec_hash_of(pod: dict | None) -> str | None:
    return pod and pod["metadata"]["annotations"]["dstream.dev/spec-hash"]


def fresh_driver(cluster, spec_hash, same: bool):
    """The driver pod if it runs (or would run) a spec of that hash, or of another one."""
    pod = driver(cluster)
    phase = ((pod or {}).get("status") or {}).get("phase")
    return pod if pod and phase != "Failed" and (spec_hash_of(pod) == spec_hash) == same else None


async def test_a_changed_spec_that_never_commits_is_rolled_back(operator, driver_api):
    """The first spec commits a batch (the driver API reports one) and becomes the stable
    spec; a changed spec whose driver fails twice before any batch is rolled back: the next
    driver runs the first spec again, from the same ConfigMap and checkpoint."""
    driver_api["lastBatch"] = {"time": "2026-01-02T03:04:05+00:00", "records": 100}
    await create(operator, job_manifest())
    await wait_for(lambda: driver(operator))
    await set_driver_status(operator, "Running", ready=True)
    stable = await wait_for(lambda: status_of(operator).get("stableSpecHash"))
    assert spec_hash_of(driver(operator)) == stable

    driver_api["lastBatch"] = None  # the new spec's drivers never get that far
    await operator.patch(path(JOBS, "wc"), json={"spec": {"batchInterval": "2s"}})
    for failures in (1, 2):
        await wait_for(lambda: fresh_driver(operator, stable, same=False))
        await set_driver_status(operator, "Failed", terminated={"exitCode": 1})
        if failures == 1:
            await wait_for(lambda: status_of(operator).get("upgradeFailures") == 1)
    status = await wait_for(
        lambda: status_of(operator).get("rolledBackFrom") and status_of(operator)
    )
    assert status["rolledBackFrom"] != stable and status["stableSpecHash"] == stable
    (rolled,) = [m for _, reason, m in events(operator) if reason == "RolledBack"]
    assert "failed 2 times before committing a batch" in rolled
    await wait_for(lambda: fresh_driver(operator, stable, same=True))
    assert "batchInterval: 1s" in current(operator, "v1/configmaps", "wc-job")["data"]["job.yaml"]
    assert current(operator, JOBS, "wc")["spec"]["batchInterval"] == "2s"  # the user's, kept
    await set_driver_status(operator, "Running", ready=True)
    running = await wait_for(
        lambda: status_of(operator).get("phase") == "Running" and status_of(operator)
    )
    assert running["message"].startswith("rolled back")

    await operator.patch(path(JOBS, "wc"), json={"spec": {"batchInterval": "3s"}})
    await wait_for(lambda: fresh_driver(operator, stable, same=False))  # a new spec's chance
    assert "rolledBackFrom" not in status_of(operator)


@pytest_asyncio.fixture
async def failed_job_changed_while_away(cluster) -> None:
    """Before the operator starts: a Failed job whose spec changed after its status was
    written (generation 2, observedGeneration 1)."""
    body = job_manifest()
    body["metadata"]["generation"] = 2
    body["status"] = {"phase": "Failed", "observedGeneration": 1, "restarts": 2}
    await create(cluster, body)


async def test_a_change_made_while_no_operator_ran_is_found_by_generation(
    failed_job_changed_while_away, operator
):
    """kopf's diff base is in memory: a starting operator finds the change by the status's
    observedGeneration, and a Failed job starts again."""
    await wait_for(lambda: driver(operator))
    status = await wait_for(
        lambda: status_of(operator).get("phase") not in (None, "Failed") and status_of(operator)
    )
    assert status["restarts"] == 0 and status["observedGeneration"] == 2
    await wait_for(
        lambda: {"SetUp", "Retrying", "SpecChanged"} <= {r for _, r, _ in events(operator)}
    )
    assert not current(operator, JOBS, "wc")["metadata"].get("annotations")  # no kopf state


def owned_by(uid: str | None) -> dict:
    return {"ownerReferences": [{"kind": "StreamingJob", "name": "wc", "uid": uid}]} if uid else {}


@pytest_asyncio.fixture
async def leftovers_of_an_earlier_operator(cluster) -> None:
    """Before the operator starts: a job that ran (it has a status), whose executor budget was
    turned off since, with the UI Ingress an operator with `--ui-ingress-host` made; and a
    RoleBinding of the name the job would give one, made by hand (not owned by the job)."""
    body = job_manifest(executor={"instances": 2, "disruptionBudget": {"enabled": False}})
    body["status"] = {"phase": "Running", "observedGeneration": 1}
    await create(cluster, body)
    for resource, name, owner in [
        ("networking.k8s.io/v1/ingresses", "wc-driver", "uid-wc"),
        ("policy/v1/poddisruptionbudgets", "wc-executor", "uid-wc"),
        ("rbac.authorization.k8s.io/v1/rolebindings", "wc-driver-account", None),
    ]:
        metadata = {"name": name, "namespace": "jobs", "uid": f"uid-{name}"} | owned_by(owner)
        response = await cluster.post(path(resource), json={"metadata": metadata})
        assert response.status == 200, await response.text()


async def test_an_operator_deletes_the_children_an_earlier_one_left(
    leftovers_of_an_earlier_operator, operator
):
    """Started without the UI Ingress option, it deletes the job's Ingress, and the budget the
    spec no longer has; what the job does not own is kept."""
    await wait_for(lambda: "SetUp" in {r for _, r, _ in events(operator)})
    assert current(operator, "networking.k8s.io/v1/ingresses", "wc-driver") is None
    assert current(operator, "policy/v1/poddisruptionbudgets", "wc-executor") is None
    assert current(operator, "policy/v1/poddisruptionbudgets", "wc-driver") is not None
    kept = current(operator, "rbac.authorization.k8s.io/v1/rolebindings", "wc-driver-account")
    assert kept is not None
