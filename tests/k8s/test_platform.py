"""What platform teams need from the operator, against the real Kubernetes 1.20 API server: pod
customisation the API server accepts and keeps, disruption budgets the disruption controller
can count, a job that says why when the API server rejects its driver pod, a changed spec that
never commits rolled back, and an Ingress to each job's Spark UI.

The last two need the operator configured as the chart's values set it up (`configured`): the
UI Ingress, and the driver API read at the pod IP, which is how the operator here can read a
driver's report at all. A hollow pod runs nothing (tests/k8s/test_operator.py); to show a
driver that committed a batch, the test serves the driver's REST API (the engine's own app, over
a job that has completed one batch) on a loopback address and gives the pod that IP.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from conditions import eventually
from dstream_api.app import app_for
from dstream_operator.resources import API_PORT, UI_PORT
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from tests.api.fakejob import BATCH_MS, ZERO_MS, FakeJob
from tests.k8s import test_operator
from tests.k8s.conftest import LocalCluster
from tests.k8s.test_operator import (
    CHECKPOINT_VOLUME,
    POLL_SECONDS,
    SPEC_HASH,
    WAIT_SECONDS,
    Harness,
    OperatorProcess,
    Release,
    crash_pod,
    render_chart,
)

# The operator harness's module fixtures: this file gets an operator of its own.
chart_crds = test_operator.chart_crds
namespace = test_operator.namespace
chart_release = test_operator.chart_release
operator_process = test_operator.operator_process
k8s = test_operator.k8s

pytestmark = pytest.mark.k8s

SIDECAR = {"name": "log-shipper", "image": "busybox:1.36", "args": ["sleep", "3600"]}


def budgets(k8s: Harness) -> Any:
    """PodDisruptionBudgets through policy/v1beta1, all that Kubernetes 1.20 serves."""
    dynamic = DynamicClient(k8s.cluster.api_client)
    return dynamic.resources.get(api_version="policy/v1beta1", kind="PodDisruptionBudget")


def budget(k8s: Harness, name: str) -> dict[str, Any] | None:
    """The PodDisruptionBudget, or None before the operator has written it (after the pod)."""
    try:
        return budgets(k8s).get(name=name, namespace=k8s.namespace).to_dict()
    except NotFoundError:
        return None


def budget_status(k8s: Harness, name: str) -> dict[str, Any]:
    return (budget(k8s, name) or {}).get("status") or {}


def warnings_about(k8s: Harness, kind: str, name: str) -> list[client.CoreV1Event]:
    events = k8s.core.list_namespaced_event(
        k8s.namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return [e for e in events if e.involved_object.kind == kind and e.type == "Warning"]


def test_pod_customisation_reaches_the_driver_pod_and_the_executor_template(k8s: Harness):
    node = k8s.cluster.node_name
    driver = {
        "cores": 1,
        "memory": "512m",
        "coresLimit": "1",
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "streaming"}],
        "labels": {"team": "analytics"},
        "annotations": {"cost-center": "4711"},
        "env": [{"name": "TZ", "value": "UTC"}],
        "envFrom": [{"configMapRef": {"name": "tuning", "optional": True}}],
        "podTemplate": {
            "spec": {"containers": [{"name": "driver", "command": ["sh"]}, SIDECAR]},
        },
    }
    executor = {"instances": 1, "nodeSelector": {"pool": "streaming"}}
    job = k8s.create_job("placed", driver=driver, executor=executor)
    # the CRD schema keeps every field (Kubernetes 1.20 silently prunes unknown ones)
    assert job["spec"]["driver"] == driver

    pod = k8s.running_driver("placed")
    assert pod.spec.node_selector == {"kubernetes.io/hostname": node}
    assert [c.name for c in pod.spec.containers] == ["driver", "log-shipper"]
    main = pod.spec.containers[0]
    assert main.command[:2] == ["python", "-m"]  # the operator's, not the template's ["sh"]
    assert main.resources.limits["cpu"] == "1"
    assert {e.name for e in main.env} >= {"TZ", "POD_IP"}
    assert main.env_from[0].config_map_ref.name == "tuning"
    assert ("dedicated", "streaming") in [(t.key, t.value) for t in pod.spec.tolerations]
    assert pod.metadata.labels["team"] == "analytics"
    assert pod.metadata.annotations["cost-center"] == "4711"
    assert "4040" in str([p.container_port for p in main.ports])

    warning = k8s.wait_for(
        "a PodTemplateOverridden warning",
        lambda: [
            w
            for w in warnings_about(k8s, "StreamingJob", "placed")
            if w.reason == "PodTemplateOverridden"
        ],
    )
    assert "spec.containers[driver].command" in warning[0].message

    config = k8s.core.read_namespaced_config_map("placed-job", k8s.namespace)
    template = yaml.safe_load(config.data["executor-pod-template.yaml"])
    assert template["spec"]["nodeSelector"] == {"pool": "streaming"}
    assert "spark.kubernetes.executor.podTemplateFile=/etc/dstream/executor-pod-template.yaml" in (
        main.args
    )


def test_disruption_budgets_are_counted_by_the_disruption_controller(k8s: Harness):
    """minAvailable budgets over the job's pods are evaluated (expectedPods is known); a
    maxUnavailable budget over the same pods is not, which is why the operator writes the
    former: the disruption controller cannot scale a StreamingJob."""
    k8s.create_job(
        "budget", driver={"cores": 1, "memory": "512m", "disruptionBudget": {"maxUnavailable": 0}}
    )
    k8s.running_driver("budget")
    status = k8s.wait_for(
        "the driver budget evaluated",
        lambda: (s := budget_status(k8s, "budget-driver")).get("expectedPods") == 1 and s,
    )
    assert status["desiredHealthy"] == 1  # maxUnavailable 0: a drain waits for the driver
    assert status["disruptionsAllowed"] == 0

    k8s.patch_spec("budget", {"driver": {"disruptionBudget": {"maxUnavailable": 1}}})
    k8s.wait_for(
        "the driver budget follows the spec",
        lambda: budget_status(k8s, "budget-driver").get("desiredHealthy") == 0,
    )

    by_max_unavailable = {
        "apiVersion": "policy/v1beta1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "by-max-unavailable"},
        "spec": {
            "maxUnavailable": 1,
            "selector": {
                "matchLabels": {"dstream.dev/job": "budget", "dstream.dev/role": "driver"}
            },
        },
    }
    budgets(k8s).create(body=by_max_unavailable, namespace=k8s.namespace)
    k8s.wait_for(
        "the disruption controller gives up on the maxUnavailable budget",
        lambda: any(
            w.reason == "CalculateExpectedPodCountFailed"
            for w in warnings_about(k8s, "PodDisruptionBudget", "by-max-unavailable")
        ),
    )
    assert budget_status(k8s, "by-max-unavailable").get("disruptionsAllowed", 0) == 0


def test_a_driver_pod_the_api_server_rejects_fails_the_job_until_the_spec_is_fixed(
    k8s: Harness,
):
    imageless = {"name": "log-shipper", "args": ["sleep", "3600"]}
    template = {"spec": {"containers": [imageless]}}
    driver = {"cores": 1, "memory": "512m", "podTemplate": template}
    k8s.create_job("rejected", driver=driver)
    status = k8s.wait_for("phase Failed", k8s.phase_is("rejected", "Failed"))
    assert "rejected the driver pod" in status["message"]
    assert "image" in status["message"]
    assert "DriverPodRejected" in k8s.event_reasons("rejected")
    assert k8s.driver("rejected") is None

    template["spec"]["containers"][0]["image"] = "busybox:1.36"
    k8s.patch_spec("rejected", {"driver": driver})
    pod = k8s.running_driver("rejected")
    assert [c.name for c in pod.spec.containers] == ["driver", "log-shipper"]


# What a platform team sets in the chart's values: the UI Ingress, and the driver API read at
# the pod IP (polled every second, so that a test sees a report soon).
UI_HOST = "{job}.{namespace}.spark.example.test"
UI_ANNOTATIONS = {"nginx.ingress.kubernetes.io/proxy-read-timeout": "60"}
CONFIGURED_VALUES = {
    "operator": {"driverHost": "pod-ip", "pollSeconds": 1},
    "sparkUI": {
        "ingress": {
            "enabled": True,
            "host": UI_HOST,
            "className": "nginx",
            "annotations": UI_ANNOTATIONS,
        }
    },
}


@pytest.fixture
def configured(k8s: Harness, chart_release: Release, tmp_path: Path) -> Iterator[Harness]:
    """For one test, instead of the module's operator: the operator with the arguments the
    chart's Deployment gets from CONFIGURED_VALUES, as the same ServiceAccount (the values do
    not change the ClusterRole, which already grants Ingresses). The module's operator stops
    first (releasing the Lease) and starts again afterwards (a test may stop this one and
    start the module's itself)."""
    ns = k8s.namespace
    objects = render_chart(release=ns, namespace=ns, values=CONFIGURED_VALUES)
    assert objects["ClusterRole"] == render_chart(release=ns, namespace=ns)["ClusterRole"]
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    process = OperatorProcess(
        args=container["args"],
        kubeconfig=chart_release.kubeconfig,
        log_path=tmp_path / "operator.log",
    )
    k8s.operator.stop()
    try:
        process.start()
        yield dataclasses.replace(k8s, operator=process)
        if process.running():
            assert process.metric("dstream_operator_errors_total") == 0, (
                f"the operator counted errors:\n{process.log_tail()}"
            )
    finally:
        process.stop()
        k8s.operator.start()


def test_the_chart_with_the_ui_ingress_is_accepted_by_the_api_server(
    k8s_cluster: LocalCluster, namespace: str, tmp_path: Path
):
    """`helm template` with the Ingress values, checked by the API server itself (a server-side
    dry run: admission and schemas, nothing created). The chart has no Ingress of its own:
    the operator creates one per job (the next test)."""
    objects = render_chart(release="ui-chart", namespace=namespace, values=CONFIGURED_VALUES)
    path = tmp_path / "chart.yaml"
    path.write_text(yaml.safe_dump_all(objects.values()))
    applied = subprocess.run(
        [k8s_cluster.kubectl, "--kubeconfig", str(k8s_cluster.kubeconfig), "apply"]
        + ["--dry-run=server", "-n", namespace, "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    assert "deployment.apps/ui-chart-dstream created (server dry run)" in applied.stdout
    args = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--ui-ingress-host={UI_HOST}" in args and "--ui-ingress-class=nginx" in args


def ui_ingress(k8s: Harness, job: str) -> client.V1Ingress | None:
    networking = client.NetworkingV1Api(k8s.cluster.api_client)
    try:
        return networking.read_namespaced_ingress(f"{job}-driver", k8s.namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def test_each_job_gets_an_ingress_to_its_spark_ui_deleted_with_it(configured: Harness):
    k8s = configured
    uid = k8s.create_job("ui")["metadata"]["uid"]
    ingress = k8s.wait_for("the job's UI Ingress", lambda: ui_ingress(k8s, "ui"))

    (rule,) = ingress.spec.rules
    assert rule.host == f"ui.{k8s.namespace}.spark.example.test"
    assert ingress.spec.ingress_class_name == "nginx"
    assert UI_ANNOTATIONS.items() <= ingress.metadata.annotations.items()
    (path,) = rule.http.paths
    assert (path.path, path.path_type) == ("/", "Prefix")
    assert (path.backend.service.name, path.backend.service.port.number) == ("ui-driver", UI_PORT)
    (owner,) = ingress.metadata.owner_references
    assert (owner.kind, owner.uid, owner.controller) == ("StreamingJob", uid, True)

    service = k8s.core.read_namespaced_service("ui-driver", k8s.namespace)
    ports = {p.name: (p.port, p.target_port) for p in service.spec.ports}
    assert ports["http-spark-ui"] == (UI_PORT, UI_PORT)
    pod = k8s.running_driver("ui")
    assert UI_PORT in [p.container_port for p in pod.spec.containers[0].ports]

    k8s.delete_job("ui")
    # the garbage collector; on a fresh cluster it sees a new CRD's objects from its next
    # discovery sync (every 30 s)
    k8s.wait_for(
        "the Ingress deleted with its job",
        lambda: ui_ingress(k8s, "ui") is None,
        timeout=WAIT_SECONDS + 30,
    )


def test_an_operator_started_without_the_ui_ingress_deletes_those_it_made(
    configured: Harness, k8s: Harness
):
    """`helm upgrade` back to the default values (no Ingress): the operator that starts
    deletes the UI Ingresses its predecessor made, as the chart's ServiceAccount (the
    ClusterRole grants it), and keeps an Ingress of that name that the job does not own. The
    drivers are not touched. Two 250m drivers fit the hollow node's one CPU."""
    driver = {"cores": 1, "coresRequest": "250m", "memory": "512m"}
    jobs = ("was-ui", "by-hand")
    for job in jobs:
        configured.create_job(job, driver=driver)
        configured.wait_for(f"{job}'s UI Ingress", lambda job=job: ui_ingress(configured, job))
    drivers = {job: configured.running_driver(job).metadata.uid for job in jobs}
    for job in jobs:  # run by an operator: it has a status
        configured.wait_for(f"{job} Starting", configured.phase_is(job, "Starting"))
    networking = client.NetworkingV1Api(k8s.cluster.api_client)
    unowned = {"metadata": {"ownerReferences": None}}
    networking.patch_namespaced_ingress("by-hand-driver", k8s.namespace, unowned)
    assert configured.operator.metric("dstream_operator_errors_total") == 0
    configured.operator.stop()

    k8s.operator.start()  # as the chart's defaults run it
    k8s.wait_for("the job's UI Ingress deleted", lambda: ui_ingress(k8s, "was-ui") is None)
    k8s.wait_for(
        "by-hand set up by the new operator",
        lambda: len(set_up_events(k8s, "by-hand")) == 2,
    )
    assert ui_ingress(k8s, "by-hand") is not None
    assert {job: k8s.driver(job).metadata.uid for job in jobs} == drivers


def set_up_events(k8s: Harness, job: str) -> list[client.CoreV1Event]:
    """The job's SetUp Events, one per operator that set it up."""
    return k8s.core.list_namespaced_event(
        k8s.namespace, field_selector=f"involvedObject.name={job},reason=SetUp"
    ).items


@dataclasses.dataclass
class DriverApi:
    """The driver's REST API (the engine's app over a job that has completed a batch) at
    HOST:API_PORT, a loopback address of its own: where the operator reads a driver pod whose
    IP is HOST."""

    host: str = dataclasses.field(
        default_factory=lambda: f"127.{random.randint(1, 254)}.{random.randint(0, 254)}.1"
    )

    def __post_init__(self) -> None:
        app = app_for(FakeJob(batches=1))
        self.server = uvicorn.Server(
            uvicorn.Config(app, host=self.host, port=API_PORT, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> DriverApi:
        self.thread.start()

        def started() -> bool:
            assert self.thread.is_alive(), f"the driver API could not listen on {self.host}"
            return self.server.started

        eventually(
            started,
            WAIT_SECONDS,
            interval=POLL_SECONDS,
            message=f"the driver API up on {self.host}",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_SECONDS)


def commit_a_batch(k8s: Harness, job: str) -> dict[str, Any]:
    """Make the job's driver report a completed batch until the operator has recorded its spec
    as the stable one; returns that status. The hollow kubelet puts the pod's own IP back
    within seconds, so the pod is given the driver API's IP again until then."""

    def stable_status() -> dict[str, Any] | None:
        status = k8s.status(job)
        return status if status.get("stableSpecHash") else None

    with DriverApi() as api:
        for _attempt in range(10):
            driver = k8s.driver(job)
            assert driver is not None, f"{job}: no driver pod"
            ip = {"podIP": api.host, "podIPs": [{"ip": api.host}]}
            k8s.patch_pod_status(driver.metadata.name, ip)
            with contextlib.suppress(AssertionError):  # its own IP back first: patch it again
                return eventually(stable_status, 3, interval=POLL_SECONDS)
    pytest.fail(f"the operator never read the driver's report\n{k8s.operator.log_tail()}")


def running_driver_of(k8s: Harness, job: str, spec_hash: str, same: bool) -> client.V1Pod:
    """The job's driver pod once Running with a spec of that hash (or of another one)."""
    return k8s.wait_for(
        f"{job}: a Running driver {'of' if same else 'not of'} spec {spec_hash}",
        lambda: (
            (pod := k8s.driver(job))
            and pod.status.phase == "Running"
            and (pod.metadata.annotations[SPEC_HASH] == spec_hash) == same
            and pod
        ),
    )


def rate_of(spec: dict[str, Any]) -> int:
    return spec["source"]["rate"]["recordsPerSecond"]


def test_a_changed_spec_that_never_commits_is_rolled_back(configured: Harness):
    """A spec that committed a batch becomes the stable one; a changed spec whose driver fails
    twice before committing is rolled back: the next driver runs the stable spec, from the same
    checkpoint, status and an Event say so; a further change gets its own chance."""
    k8s, job = configured, "rollback"
    checkpoint = {"path": "/state/rollback"}
    k8s.create_job(
        job,
        volumes=[CHECKPOINT_VOLUME],
        checkpoint=checkpoint,
        upgrade={"rollbackOnFailure": True, "rollbackAfterFailures": 2},
    )
    first = k8s.running_driver(job)
    committed = commit_a_batch(k8s, job)
    stable = committed["stableSpecHash"]
    assert stable == first.metadata.annotations[SPEC_HASH]
    # the report, as read from the driver API, in the status
    assert test_operator.timestamp(committed["lastBatchTime"]) * 1000 == ZERO_MS + BATCH_MS

    k8s.patch_spec(job, {"source": {"type": "rate", "rate": {"recordsPerSecond": 500}}})
    for failures in (1, 2):
        broken = running_driver_of(k8s, job, stable, same=False)
        crash_pod(k8s, broken)  # before any batch: no report at its (hollow) IP
        if failures == 1:
            k8s.wait_for("upgradeFailures 1", lambda: k8s.status(job).get("upgradeFailures") == 1)
    changed = broken.metadata.annotations[SPEC_HASH]

    status = k8s.wait_for("rolled back", lambda: (s := k8s.status(job)).get("rolledBackFrom") and s)
    assert (status["rolledBackFrom"], status["stableSpecHash"]) == (changed, stable)
    events = k8s.core.list_namespaced_event(
        k8s.namespace, field_selector=f"involvedObject.name={job},reason=RolledBack"
    ).items
    assert [e.type for e in events] == ["Warning"]
    assert "failed 2 times before committing a batch" in events[0].message
    rolled = running_driver_of(k8s, job, stable, same=True)
    config = k8s.core.read_namespaced_config_map(f"{job}-job", k8s.namespace)
    ran = yaml.safe_load(config.data["job.yaml"])["spec"]
    assert rate_of(ran) == 100 and ran["checkpoint"]["path"] == checkpoint["path"]
    assert rate_of(yaml.safe_load(status["stableSpec"])) == 100  # kept by the status schema
    assert rate_of(k8s.job(job)["spec"]) == 500  # the user's spec is kept as written
    k8s.wait_for(
        "the status says it runs the rolled-back spec",
        lambda: (k8s.status(job).get("message") or "").startswith("rolled back"),
    )

    # the decision is in the status, not in the operator's memory: one started again keeps it
    k8s.operator.stop()
    k8s.operator.start()
    k8s.wait_for(
        "the new operator has supervised the job a few times",
        lambda: (
            k8s.operator.metric("dstream_operator_reconciliations_total", handler="supervise") >= 3
        ),
    )
    k8s.holds_for(
        "the rolled-back driver kept",
        lambda: [p.metadata.uid for p in k8s.pods(job)] == [rolled.metadata.uid],
        seconds=3,
    )

    k8s.patch_spec(job, {"source": {"type": "rate", "rate": {"recordsPerSecond": 200}}})
    again = running_driver_of(k8s, job, stable, same=False)
    assert again.metadata.annotations[SPEC_HASH] != changed
    status = k8s.status(job)
    assert "rolledBackFrom" not in status and status["stableSpecHash"] == stable
