"""The operator as it ships (`dstream-operator`, a process of its own) against a real API server.

Watches, schema validation, ownerReferences, garbage collection, graceful pod deletion, RBAC and
the status subresource behave differently for real than in kmock; these tests run the operator
against the local Kubernetes 1.20 control plane (e2e/cluster/local.sh) as `helm install` would:
the chart's CRDs, its ServiceAccount with its ClusterRole, and the arguments of its Deployment
(a Lease elects the leader; only the process runs on this machine instead of in a pod).

What the hollow node (kubemark) does to a driver pod, and so what the tests can see:
- The pod is scheduled and reaches Running, but nothing executes: the readiness probe on the
  driver API never passes. The operator reports such a driver as `Starting` (`Recovering` after a
  restart) with condition DriverReady=False/PodNotReady, exactly as for a driver still replaying
  its checkpoint. `Running` is shown by patching the pod's Ready condition, which the hollow
  kubelet reverts within seconds: the operator follows both ways.
- A crash is simulated by patching the pod's status to Failed with a container exit code; the
  hollow kubelet keeps that.
- No executors are ever created (Spark does not run), so ExecutorsReady stays False.
- The node has one CPU: one driver pod (1 core) at a time, so tests run one job at a time and
  each one's teardown removes its pods.
- Graceful deletion of a Running pod takes the hollow kubelet several seconds (the bulk of
  these tests' time): spec changes, suspends and restarts wait for the old pod to go.

Not exercised here: a driver that really runs (its API's report in the status: last batch,
delays, rate limit -- test_platform.py serves the driver API at a pod's IP to show a committed
batch; executors; a graceful stop on SIGTERM; recovery from the checkpoint; probe failures) and the checkpoint cleanup pod really deleting files -- drivers run for real only in
the e2e suite, on a real kubelet; the operator in a pod (in-cluster config, DNS to the driver Service); Kubernetes
1.20 has no CEL validation rules, no server-side field validation (an unknown spec field is
silently pruned, not rejected) and no PodSecurity admission.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import helm_python as helm
import pytest
import yaml
from conditions import eventually
from dstream_operator.handlers import POD_SELECTOR
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families
from servers import free_port

from tests.k8s.conftest import REPO_ROOT, LocalCluster

pytestmark = pytest.mark.k8s

CHART = REPO_ROOT / "helm" / "dstream"
CHART_CRDS = CHART / "crds"
GROUP, VERSION, PLURAL = "dstream.dev", "v1alpha1", "streamingjobs"
JOB_LABEL = "dstream.dev/job"
SPEC_HASH = "dstream.dev/spec-hash"

WAIT_SECONDS = 60.0  # any single expected change; generous for a loaded 2-core machine
POLL_SECONDS = 0.25
OPERATOR_START_SECONDS = 60.0
OPERATOR_STOP_SECONDS = 30.0
NOTICE_SECONDS = 10.0  # a driver is lost -> the operator has counted the loss
RESTART_SLACK_SECONDS = 3.5  # a backoff ends -> the new driver pod exists (watch + one step)

T = TypeVar("T")


@dataclasses.dataclass
class OperatorProcess:
    """`dstream-operator` with the chart Deployment's arguments and a kubeconfig for the chart's
    ServiceAccount, in its own session so that it is stopped by its PID only; restartable (a
    test stops and starts it mid-way). Liveness and metrics listen on free loopback ports."""

    args: list[str]
    kubeconfig: Path
    log_path: Path
    metrics_port: int = dataclasses.field(default_factory=free_port)
    liveness_port: int = dataclasses.field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it, unless it runs."""
        if self.running():
            return
        executable = Path(sys.executable).with_name("dstream-operator")
        ports = ("--liveness", "--metrics-port")
        command = [
            str(executable),
            *(arg for arg in self.args if not arg.startswith(ports)),
            f"--metrics-port={self.metrics_port}",
            f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                env=os.environ | {"KUBECONFIG": str(self.kubeconfig)},
                cwd=self.log_path.parent,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def live() -> bool:
            assert self.process is not None
            assert self.process.poll() is None, f"dstream-operator exited:\n{self.log_tail()}"
            return self._live()

        eventually(
            live,
            OPERATOR_START_SECONDS,
            interval=POLL_SECONDS,
            message=lambda: f"dstream-operator live:\n{self.log_tail()}",
        )

    def stop(self) -> None:
        """SIGTERM, so that the operator releases its Lease (a killed operator's Lease holds
        its successor back until it expires); SIGKILL only if it hangs."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(OPERATOR_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(OPERATOR_STOP_SECONDS)
        self.process = None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _live(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.liveness_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the operator's own /metrics (0 when absent)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return sample.value
        return 0.0

    def log_tail(self, lines: int = 40) -> str:
        """The end of the operator's log without kopf's per-event "succeeded" lines."""
        if not self.log_path.exists():
            return "(no operator log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join([line for line in text if "' succeeded." not in line][-lines:])


@dataclasses.dataclass
class Harness:
    """One test's view: the namespace, the operator, and the jobs' objects."""

    cluster: LocalCluster
    namespace: str
    operator: OperatorProcess

    @property
    def core(self) -> client.CoreV1Api:
        return self.cluster.core

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.cluster.api_client)

    def create_job(self, name: str, **spec: Any) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, job_manifest(name, **spec)
        )

    def patch_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec}
        )

    def job(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        return (self.job(name) or {}).get("status") or {}

    def delete_job(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def pods(self, job: str) -> list[client.V1Pod]:
        selector = f"{JOB_LABEL}={job}"
        return self.core.list_namespaced_pod(self.namespace, label_selector=selector).items

    def driver(self, job: str) -> client.V1Pod | None:
        """The job's driver pod, found by its labels, unless it is on its way out: the newest
        attempt's (the operator names them `<job>-driver-<n>`)."""
        live = [
            p
            for p in self.pods(job)
            if p.metadata.labels.get("dstream.dev/role") == "driver"
            and not p.metadata.deletion_timestamp
        ]
        return max(live, key=lambda p: int(p.metadata.name.rsplit("-", 1)[1]), default=None)

    def children(self, job: str) -> dict[str, Any]:
        """The job's ConfigMap and Service, read by name."""
        ns = self.namespace
        return {
            "ConfigMap": self.core.read_namespaced_config_map(f"{job}-job", ns),
            "Service": self.core.read_namespaced_service(f"{job}-driver", ns),
        }

    def driver_identity(self) -> dict[str, Any]:
        """The namespace's driver ServiceAccount, Role and RoleBinding, read by name."""
        rbac = client.RbacAuthorizationV1Api(self.cluster.api_client)
        ns, name = self.namespace, "dstream-driver"
        return {
            "ServiceAccount": self.core.read_namespaced_service_account(name, ns),
            "Role": rbac.read_namespaced_role(name, ns),
            "RoleBinding": rbac.read_namespaced_role_binding(name, ns),
        }

    def patch_pod_status(self, name: str, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(
            name, self.namespace, {"status": status}, _content_type="application/merge-patch+json"
        )

    def event_reasons(self, job: str) -> set[str]:
        """Reasons of the Events about the StreamingJob (their timestamps are whole seconds,
        too coarse to order them)."""
        events = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={job}"
        ).items
        return {e.reason for e in events if e.involved_object.kind == "StreamingJob"}

    def wait_for(self, what: str, condition: Callable[[], T], timeout: float = WAIT_SECONDS) -> T:
        """`eventually`, with the operator's log in its error."""
        return eventually(
            condition,
            timeout,
            interval=POLL_SECONDS,
            message=lambda: f"{what}\n--- operator log ---\n{self.operator.log_tail()}",
        )

    def holds_for(self, what: str, condition: Callable[[], bool], seconds: float) -> None:
        """Poll `condition` for `seconds`; fail the moment it is false (something that must
        not happen, e.g. a second driver pod)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert condition(), f"{what} stopped holding\n{self.operator.log_tail()}"
            time.sleep(POLL_SECONDS)

    def phase_is(self, job: str, phase: str) -> Callable[[], dict[str, Any] | None]:
        """A condition for `wait_for` that returns the status in which the phase was seen."""

        def check() -> dict[str, Any] | None:
            status = self.status(job)
            return status if status.get("phase") == phase else None

        return check

    def running_driver(self, job: str) -> client.V1Pod:
        return self.wait_for(
            f"{job}: driver pod Running on the hollow node",
            lambda: (pod := self.driver(job)) and pod.status.phase == "Running" and pod,
        )


def job_manifest(name: str, **spec: Any) -> dict[str, Any]:
    """A small valid job: one 1-core driver fits the hollow node's single CPU."""
    base = {
        "batchInterval": "1s",
        "app": {"builtin": "wordcount"},
        "source": {"type": "rate", "rate": {"recordsPerSecond": 100}},
        "driver": {"cores": 1, "memory": "512m"},
        "executor": {"instances": 1},
        "restartPolicy": {"type": "Always", "maxRestarts": 5, "backoffSeconds": 1},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StreamingJob",
        "metadata": {"name": name},
        "spec": base | spec,
    }


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def timestamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@pytest.fixture(scope="module")
def chart_crds(k8s_cluster: LocalCluster) -> list[str]:
    """The chart's crds/ folder (StreamingJob, and kopf's peering CRDs), as Helm installs it."""
    return [
        name for path in sorted(CHART_CRDS.glob("*.yaml")) for name in k8s_cluster.apply_crds(path)
    ]


@pytest.fixture(scope="module")
def namespace(k8s_cluster: LocalCluster, chart_crds: list[str]) -> Iterator[str]:
    with k8s_cluster.namespace("dstream-op") as name:
        yield name


@dataclasses.dataclass(frozen=True)
class Release:
    """What the operator runs with after `helm install`: its Deployment's arguments, and a
    kubeconfig with its ServiceAccount's token (so the chart's ClusterRole is what it may do)."""

    args: list[str]
    kubeconfig: Path


def render_chart(
    release: str, namespace: str, values: dict[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """The chart's templates for `helm install RELEASE -n NS --set watchNamespaces={NS}`,
    with more `values` if given."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(
            {"watchNamespaces": [namespace], **(values or {})}, name=release, namespace=namespace
        )
    documents = [
        document
        for name, text in manifests.items()
        if name.endswith(".yaml")
        for document in yaml.safe_load_all(text)
        if document
    ]
    return {document["kind"]: document for document in documents}


def _service_account_token(core: client.CoreV1Api, namespace: str, name: str) -> str:
    """Kubernetes 1.20 puts a ServiceAccount's token in a Secret it creates shortly after."""
    secrets = eventually(
        lambda: core.read_namespaced_service_account(name, namespace).secrets,
        WAIT_SECONDS,
        interval=POLL_SECONDS,
        message=f"a token for ServiceAccount {name}",
    )
    secret = core.read_namespaced_secret(secrets[0].name, namespace)
    return base64.b64decode(secret.data["token"]).decode()


@pytest.fixture(scope="module")
def chart_release(
    k8s_cluster: LocalCluster, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    """The chart's ServiceAccount, ClusterRole and ClusterRoleBinding; the cluster-wide ones
    are named after the namespace and deleted afterwards. The operator runs with the chart's
    arguments, so it elects itself leader through a Lease in the namespace."""
    objects = render_chart(release=namespace, namespace=namespace)
    core = k8s_cluster.core
    rbac = client.RbacAuthorizationV1Api(k8s_cluster.api_client)
    account, role, binding = (
        objects["ServiceAccount"],
        objects["ClusterRole"],
        objects["ClusterRoleBinding"],
    )
    core.create_namespaced_service_account(namespace, account)
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(binding)
    assert "KopfPeering" not in objects  # the chart elects a leader through a Lease instead
    try:
        token = _service_account_token(core, namespace, account["metadata"]["name"])
        kubeconfig = yaml.safe_load(k8s_cluster.kubeconfig.read_text())
        kubeconfig["users"] = [{"name": "operator", "user": {"token": token}}]
        for context in kubeconfig["contexts"]:
            context["context"]["user"] = "operator"
        path = tmp_path_factory.mktemp("release") / "operator.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["dstream-operator"]
        yield Release(args=container["args"], kubeconfig=path)
    finally:
        rbac.delete_cluster_role_binding(binding["metadata"]["name"])
        rbac.delete_cluster_role(role["metadata"]["name"])


@pytest.fixture(scope="module")
def operator_process(
    chart_release: Release, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        args=chart_release.args,
        kubeconfig=chart_release.kubeconfig,
        log_path=tmp_path_factory.mktemp("operator") / "operator.log",
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def k8s(
    k8s_cluster: LocalCluster, namespace: str, operator_process: OperatorProcess
) -> Iterator[Harness]:
    """The running operator (started again if a test left it stopped); afterwards every job and
    pod in the namespace is removed, so the next test has the node's one CPU."""
    if not operator_process.running():
        operator_process.start()
    harness = Harness(k8s_cluster, namespace, operator_process)
    try:
        yield harness
        assert operator_process.running(), f"the operator died:\n{operator_process.log_tail()}"
        assert operator_process.metric("dstream_operator_errors_total") == 0, (
            f"the operator counted errors:\n{operator_process.log_tail()}"
        )
    finally:
        _remove_jobs(harness)


def _remove_jobs(harness: Harness) -> None:
    custom, core, ns = harness.custom, harness.core, harness.namespace
    for job in custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]:
        if job["metadata"].get("finalizers"):  # a cleanup the test did not finish
            custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                ns,
                PLURAL,
                job["metadata"]["name"],
                {"metadata": {"finalizers": None}},
            )
        harness.delete_job(job["metadata"]["name"])
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    harness.wait_for(
        "no pods and no jobs left",
        lambda: (
            not core.list_namespaced_pod(ns).items
            and not custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
        ),
    )


def test_job_gets_owned_children_and_status_follows_the_driver_pod(k8s: Harness):
    job = k8s.create_job("children")
    uid = job["metadata"]["uid"]
    pod = k8s.running_driver("children")

    owned = k8s.children("children") | {"Pod": pod}
    for kind, obj in owned.items():
        (ref,) = obj.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid) == ("StreamingJob", "children", uid), kind
        assert ref.controller and ref.block_owner_deletion, kind
        assert obj.metadata.labels[JOB_LABEL] == "children", kind
    assert pod.spec.service_account_name == "dstream-driver"  # the namespace's, owned by none
    assert not [o for o in k8s.driver_identity().values() if o.metadata.owner_references]
    assert owned["Service"].spec.cluster_ip == "None"
    manifest = yaml.safe_load(owned["ConfigMap"].data["job.yaml"])
    assert manifest["spec"]["source"] == job["spec"]["source"]

    # Running but never ready on the hollow node: the driver API's readiness probe cannot pass.
    status = k8s.wait_for("phase Starting", k8s.phase_is("children", "Starting"))
    assert status["driverPod"] == "children-driver-1" and status["observedGeneration"] == 1
    driver_ready = condition(status, "DriverReady")
    assert (driver_ready["status"], driver_ready["reason"]) == ("False", "PodNotReady")
    assert condition(status, "ExecutorsReady")["message"] == "0 of 1 executors ready"
    assert status["executors"] == {"ready": 0, "desired": 1} and status["restarts"] == 0
    assert {"SetUp", "DriverCreated"} <= k8s.event_reasons("children")

    running = _see_running_while_ready(k8s, "children")
    driver_ready = condition(running, "DriverReady")
    assert (driver_ready["status"], driver_ready["reason"]) == ("True", "PodReady")
    # the hollow kubelet's failing probe takes readiness away again, and the phase follows
    status = k8s.wait_for("back to Starting", k8s.phase_is("children", "Starting"))
    assert condition(status, "DriverReady")["status"] == "False"


def _see_running_while_ready(k8s: Harness, job: str) -> dict[str, Any]:
    """Mark the driver pod Ready the way a passing readiness probe would. The hollow kubelet
    reverts it within seconds, so try a few times until the operator reported Running."""
    for _attempt in range(5):
        pod = k8s.driver(job)
        conditions = [
            {
                "type": c.type,
                "status": "True" if c.type in ("Ready", "ContainersReady") else c.status,
            }
            for c in pod.status.conditions
        ]
        k8s.patch_pod_status(pod.metadata.name, {"conditions": conditions})
        with contextlib.suppress(AssertionError):  # reverted first: patch it again
            return eventually(k8s.phase_is(job, "Running"), 3, interval=POLL_SECONDS)
    pytest.fail(
        f"the operator never reported Running for a Ready driver\n{k8s.operator.log_tail()}"
    )


def test_unschedulable_driver_is_pending_until_a_spec_change_fixes_it(k8s: Harness):
    k8s.create_job("pending", driver={"cores": 2, "memory": "512m"})  # the node has 1 CPU
    status = k8s.wait_for("phase Pending", k8s.phase_is("pending", "Pending"))
    assert condition(status, "DriverReady")["message"] == "driver pod pending-driver-1 is Pending"
    stuck = k8s.driver("pending")
    assert stuck is not None and not stuck.spec.node_name

    k8s.patch_spec("pending", {"driver": {"cores": 1, "memory": "512m"}})
    pod = k8s.running_driver("pending")
    assert pod.metadata.uid != stuck.metadata.uid
    assert pod.metadata.annotations[SPEC_HASH] != stuck.metadata.annotations[SPEC_HASH]
    status = k8s.wait_for("phase Starting", k8s.phase_is("pending", "Starting"))
    assert status["observedGeneration"] == 2 and status["restarts"] == 0
    assert "SpecChanged" in k8s.event_reasons("pending")


def test_spec_change_restarts_the_driver_and_operator_only_fields_do_not(k8s: Harness):
    k8s.create_job("upgrade")
    first = k8s.running_driver("upgrade")

    k8s.patch_spec("upgrade", {"restartPolicy": {"maxRestarts": 7}})  # read by the operator only
    k8s.wait_for(
        "observedGeneration 2", lambda: k8s.status("upgrade").get("observedGeneration") == 2
    )
    k8s.holds_for(
        "the same driver pod",
        lambda: (
            (pod := k8s.driver("upgrade")) is not None and pod.metadata.uid == first.metadata.uid
        ),
        seconds=3,
    )

    k8s.patch_spec("upgrade", {"source": {"type": "rate", "rate": {"recordsPerSecond": 500}}})
    second = k8s.wait_for(
        "a new driver pod for the new spec",
        lambda: (pod := k8s.driver("upgrade")) and pod.metadata.uid != first.metadata.uid and pod,
    )
    assert second.metadata.annotations[SPEC_HASH] != first.metadata.annotations[SPEC_HASH]
    config = k8s.core.read_namespaced_config_map("upgrade-job", k8s.namespace)
    assert (
        yaml.safe_load(config.data["job.yaml"])["spec"]["source"]["rate"]["recordsPerSecond"] == 500
    )
    status = k8s.wait_for("phase Starting", k8s.phase_is("upgrade", "Starting"))
    assert status["observedGeneration"] == 3 and status["restarts"] == 0  # an upgrade, not a loss
    reasons = k8s.event_reasons("upgrade")
    assert "Restarting" in reasons and "DriverLost" not in reasons
    assert len([p for p in k8s.pods("upgrade") if not p.metadata.deletion_timestamp]) == 1


def _lose_driver_and_see_it_replaced(
    k8s: Harness,
    job: str,
    lose: Callable[[Harness, client.V1Pod], None],
    restarts: int,
    backoff: int,
) -> client.V1Pod:
    """Lose the driver; the restart is counted once, planned `backoff` seconds after the
    operator noticed (0: the first restart is immediate), and the next driver pod appears when
    (not before) that time comes."""
    old = k8s.running_driver(job)
    lost_at = time.time()
    lose(k8s, old)
    status = k8s.wait_for(
        f"restarts == {restarts}", lambda: (s := k8s.status(job)).get("restarts") == restarts and s
    )
    assert status["phase"] == "Recovering"
    when = f"in {backoff}s" if backoff else "now"
    lost = k8s.core.list_namespaced_event(
        k8s.namespace, field_selector=f"involvedObject.name={job},reason=DriverLost"
    ).items
    assert any(f"restart {restarts}/" in e.message and when in e.message for e in lost)
    # an immediate restart may be done (and its due time cleared) by the time the status is read
    due = timestamp(status["nextRestartTime"]) if backoff else lost_at
    assert lost_at + backoff - 0.5 <= due <= lost_at + backoff + NOTICE_SECONDS

    # no checkpoint fences the two drivers: the next is created once the old pod is gone
    k8s.wait_for(
        "the old driver pod gone",
        lambda: all(p.metadata.uid != old.metadata.uid for p in k8s.pods(job)),
    )
    gone_at = time.time()
    new = k8s.wait_for(
        "the next driver pod",
        lambda: (pod := k8s.driver(job)) and pod,
        timeout=backoff + WAIT_SECONDS,
    )
    seen_at = time.time()
    created = new.metadata.creation_timestamp.timestamp()  # whole seconds, rounded down
    assert created >= math.floor(due), "the driver was replaced before its backoff ended"
    assert seen_at <= max(due, gone_at) + RESTART_SLACK_SECONDS, "the restart came late"
    assert k8s.status(job)["restarts"] == restarts  # counted once, however many events it made
    assert (
        k8s.operator.metric(
            "dstream_operator_driver_restarts_total", namespace=k8s.namespace, job=job
        )
        == restarts
    )
    return new


def delete_pod(k8s: Harness, pod: client.V1Pod) -> None:
    """`kubectl delete pod`: graceful; the kubelet ends the pod before it goes."""
    k8s.core.delete_namespaced_pod(pod.metadata.name, k8s.namespace)


def crash_pod(k8s: Harness, pod: client.V1Pod) -> None:
    """The driver process exits with an error (the hollow kubelet keeps a Failed phase)."""
    terminated = {"exitCode": 3, "reason": "Error", "message": "simulated crash"}
    container = {
        "name": "driver",
        "image": pod.spec.containers[0].image,
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": terminated},
    }
    k8s.patch_pod_status(pod.metadata.name, {"phase": "Failed", "containerStatuses": [container]})


def vanish_pod(k8s: Harness, pod: client.V1Pod) -> None:
    """A node lost with its pods: gone at once, never seen ending."""
    k8s.core.delete_namespaced_pod(pod.metadata.name, k8s.namespace, grace_period_seconds=0)


def test_lost_drivers_are_replaced_with_backoff_until_max_restarts(k8s: Harness):
    k8s.create_job(
        "crashy",
        restartPolicy={
            "type": "Always",
            "maxRestarts": 3,
            "backoffSeconds": 2,
            "maxBackoffSeconds": 3,
        },
    )

    _lose_driver_and_see_it_replaced(k8s, "crashy", delete_pod, restarts=1, backoff=0)
    _lose_driver_and_see_it_replaced(k8s, "crashy", crash_pod, restarts=2, backoff=2)
    lost = k8s.core.list_namespaced_event(
        k8s.namespace, field_selector="involvedObject.name=crashy,reason=DriverLost"
    ).items
    assert any("exit code 3: simulated crash" in event.message for event in lost)
    _lose_driver_and_see_it_replaced(k8s, "crashy", vanish_pod, restarts=3, backoff=3)  # 4, capped

    vanish_pod(k8s, k8s.running_driver("crashy"))
    status = k8s.wait_for("phase Failed", k8s.phase_is("crashy", "Failed"))
    assert "maxRestarts (3) reached" in status["message"] and status["restarts"] == 3
    assert "nextRestartTime" not in status
    assert condition(status, "DriverReady")["reason"] == "NoDriverPod"
    assert "JobFailed" in k8s.event_reasons("crashy")
    k8s.holds_for("no new driver for a Failed job", lambda: not k8s.pods("crashy"), seconds=3)


CHECKPOINT_VOLUME = {"name": "state", "mountPath": "/state", "hostPath": {"path": "/srv/dstream"}}
HOLD = "dstream.dev/test-hold"  # a finalizer that keeps a deleted pod in its graceful stop


@contextlib.contextmanager
def held_in_its_stop(k8s: Harness, pod: client.V1Pod) -> Iterator[None]:
    """Keep `pod`, once deleted, on its way out (deletionTimestamp set) until the block ends,
    as a real driver finishing its last batch keeps its pod: the hollow kubelet ends pods at
    once."""
    k8s.core.patch_namespaced_pod(
        pod.metadata.name, k8s.namespace, {"metadata": {"finalizers": [HOLD]}}
    )
    try:
        yield
    finally:
        k8s.core.patch_namespaced_pod(
            pod.metadata.name, k8s.namespace, {"metadata": {"finalizers": None}}
        )


def test_a_lost_drivers_replacement_is_created_while_the_old_pod_still_stops(k8s: Harness):
    """Driver pods have a name per attempt: a lost driver's replacement does not wait for the
    old pod to go when the checkpoint's epoch fences the two (docs/fault-tolerance.md); without
    a checkpoint it still does. Two 250m drivers fit the hollow node's one CPU at once."""
    driver = {"cores": 1, "coresRequest": "250m", "memory": "512m"}
    checkpoint = {"path": "/state/overlap"}
    k8s.create_job("overlap", driver=driver, volumes=[CHECKPOINT_VOLUME], checkpoint=checkpoint)
    old = k8s.running_driver("overlap")
    assert old.metadata.name == "overlap-driver-1"
    with held_in_its_stop(k8s, old):
        deleted_at = time.time()
        k8s.core.delete_namespaced_pod(old.metadata.name, k8s.namespace)
        new = k8s.wait_for(
            "the replacement driver pod",
            lambda: (pod := k8s.driver("overlap")) and pod.metadata.uid != old.metadata.uid and pod,
        )
        created_after = time.time() - deleted_at
        stopping = k8s.core.read_namespaced_pod(old.metadata.name, k8s.namespace)
        assert stopping.metadata.deletion_timestamp is not None  # still on its way out
        assert stopping.metadata.annotations["dstream.dev/stop-reason"] == "ended"
        assert new.metadata.name == "overlap-driver-2"
        status = k8s.wait_for(  # written after the step's pod was created
            "the loss counted", lambda: (s := k8s.status("overlap")).get("restarts") == 1 and s
        )
        assert status["driverAttempts"] == 2
        k8s.running_driver("overlap")  # both pods on the node, the old one still stopping
        print(f"\nreplacement created {created_after:.1f} s after the deletion, old pod held")
    k8s.wait_for("the old pod gone", lambda: len(k8s.pods("overlap")) == 1)

    k8s.create_job("waits", driver=driver)  # no checkpoint
    old = k8s.running_driver("waits")
    with held_in_its_stop(k8s, old):
        k8s.core.delete_namespaced_pod(old.metadata.name, k8s.namespace)
        k8s.wait_for("the loss counted", lambda: k8s.status("waits").get("restarts") == 1)
        k8s.holds_for("no replacement beside the old pod", lambda: not k8s.driver("waits"), 3)
    new = k8s.wait_for("the replacement, once the old pod is gone", lambda: k8s.driver("waits"))
    assert new.metadata.name == "waits-driver-2"


def test_suspend_keeps_the_checkpoint_and_resume_starts_a_driver(k8s: Harness):
    k8s.create_job(
        "pausable",
        volumes=[CHECKPOINT_VOLUME],
        checkpoint={"path": "/state/pausable", "deleteOnJobDeletion": True},
    )
    first = k8s.running_driver("pausable")

    k8s.patch_spec("pausable", {"suspend": True})
    status = k8s.wait_for("phase Suspended", k8s.phase_is("pausable", "Suspended"))
    assert "checkpoint is kept" in status["message"]
    k8s.wait_for("the driver pod gone", lambda: not k8s.pods("pausable"))
    status = k8s.status("pausable")
    assert status["phase"] == "Suspended" and status["restarts"] == 0 and "driverPod" not in status
    assert "Suspending" in k8s.event_reasons("pausable")
    # the checkpoint is only ever deleted by a cleanup pod, on job deletion
    k8s.holds_for("no driver and no cleanup pod", lambda: not k8s.pods("pausable"), seconds=3)

    k8s.patch_spec("pausable", {"suspend": False})
    resumed = k8s.running_driver("pausable")
    assert resumed.metadata.uid != first.metadata.uid
    assert resumed.metadata.annotations[SPEC_HASH] == first.metadata.annotations[SPEC_HASH]
    status = k8s.wait_for("phase Starting", k8s.phase_is("pausable", "Starting"))
    assert status["restarts"] == 0

    # asked for: deleting the job stops the driver, then a pod deletes the checkpoint
    k8s.delete_job("pausable")
    cleanup = k8s.wait_for(
        "a checkpoint cleanup pod",
        lambda: (
            k8s.core.list_namespaced_pod(
                k8s.namespace, field_selector="metadata.name=pausable-checkpoint-cleanup"
            ).items
        ),
    )[0]
    assert cleanup.spec.containers[0].command == ["rm", "-rf", "--", "/state/pausable"]
    assert k8s.driver("pausable") is None
    assert k8s.job("pausable") is not None  # held by the finalizer until the cleanup ends
    k8s.wait_for(
        "the cleanup pod Running",
        lambda: (
            k8s.core.read_namespaced_pod(cleanup.metadata.name, k8s.namespace).status.phase
            == "Running"
        ),
    )
    k8s.patch_pod_status(cleanup.metadata.name, {"phase": "Succeeded"})  # nothing runs here
    k8s.wait_for("the job gone", lambda: k8s.job("pausable") is None)
    k8s.wait_for("its pods gone", lambda: not k8s.pods("pausable"))


def test_deleting_a_job_garbage_collects_everything_it_owns(k8s: Harness):
    k8s.create_job("doomed")
    k8s.running_driver("doomed")
    selector = f"{JOB_LABEL}=doomed"

    def owned() -> dict[str, int]:
        ns = k8s.namespace
        listed = {
            "ConfigMap": k8s.core.list_namespaced_config_map(ns, label_selector=selector),
            "Service": k8s.core.list_namespaced_service(ns, label_selector=selector),
            "Pod": k8s.core.list_namespaced_pod(ns, label_selector=selector),
        }
        return {kind: len(result.items) for kind, result in listed.items() if result.items}

    assert owned() == {kind: 1 for kind in ("ConfigMap", "Service", "Pod")}
    job = k8s.job("doomed")
    assert not job["metadata"].get("finalizers")  # no checkpoint to delete: no finalizer
    k8s.delete_job("doomed")
    k8s.wait_for("the job gone", lambda: k8s.job("doomed") is None, timeout=10)
    k8s.wait_for("the garbage collector removed its objects", lambda: not owned())
    assert k8s.driver_identity()  # the namespace's other jobs still run as it


def test_a_deleted_jobs_driver_pod_is_deleted_by_the_operator(k8s: Harness):
    """Not left to the garbage collector alone, which works through every object of every
    deleted job at the controller-manager's client rate (docs/operator-scale.md): here the
    driver pod has lost its ownerReference, so only the operator can delete it."""
    k8s.create_job("orphan")
    pod = k8s.running_driver("orphan")
    unowned = {"metadata": {"ownerReferences": None}}
    k8s.core.patch_namespaced_pod(pod.metadata.name, k8s.namespace, unowned)
    k8s.delete_job("orphan")
    k8s.wait_for("the job gone", lambda: k8s.job("orphan") is None)
    k8s.wait_for("its driver pod gone", lambda: not k8s.pods("orphan"))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"batchInterval": "fast"}, "spec.batchInterval"),
        ({"executor": {"instances": 0}}, "spec.executor.instances"),
        ({"source": {"type": "carrier-pigeon"}}, "spec.source.type"),
        ({"restartPolicy": {"type": "Sometimes"}}, "spec.restartPolicy.type"),
        ({"app": None}, "spec.app"),
    ],
)
def test_invalid_job_is_rejected_by_the_api_servers_schema(k8s: Harness, spec, field):
    manifest = job_manifest("invalid", **spec)
    manifest["spec"] = {k: v for k, v in manifest["spec"].items() if v is not None}
    with pytest.raises(ApiException) as rejected:
        k8s.custom.create_namespaced_custom_object(GROUP, VERSION, k8s.namespace, PLURAL, manifest)
    assert rejected.value.status == 422
    assert field in rejected.value.body
    assert k8s.job("invalid") is None


def test_a_restarted_operator_adopts_its_jobs_without_a_second_driver(k8s: Harness):
    k8s.create_job("adopted")
    pod = k8s.running_driver("adopted")
    k8s.wait_for("phase Starting", k8s.phase_is("adopted", "Starting"))

    k8s.operator.stop()
    # while it is down: an operator-only change that it must still notice
    k8s.patch_spec(
        "adopted", {"restartPolicy": {"type": "Always", "maxRestarts": 4, "backoffSeconds": 1}}
    )
    k8s.operator.start()

    k8s.wait_for(
        "observedGeneration 2", lambda: k8s.status("adopted").get("observedGeneration") == 2
    )
    k8s.wait_for(
        "the new operator has supervised the job a few times",
        lambda: (
            k8s.operator.metric("dstream_operator_reconciliations_total", handler="supervise") >= 3
        ),
    )
    k8s.wait_for(  # the gauge is counted once a second, not after each step
        "the phase gauge counts the adopted job",
        lambda: k8s.operator.metric("dstream_operator_jobs", phase="Starting") == 1,
    )
    k8s.holds_for(
        "the one driver pod, adopted",
        lambda: [p.metadata.uid for p in k8s.pods("adopted")] == [pod.metadata.uid],
        seconds=3,
    )
    assert k8s.status("adopted")["restarts"] == 0

    k8s.operator.stop()
    crash_pod(k8s, pod)  # while it is down: seen once it is back, counted once
    k8s.operator.start()
    replacement = k8s.wait_for(
        "a replacement driver",
        lambda: (new := k8s.driver("adopted")) and new.metadata.uid != pod.metadata.uid and new,
    )
    k8s.holds_for(
        "one restart, one driver pod",
        lambda: (
            k8s.status("adopted")["restarts"] == 1
            and [p.metadata.uid for p in k8s.pods("adopted")] == [replacement.metadata.uid]
        ),
        seconds=3,
    )


def test_a_child_of_the_jobs_name_owned_by_another_is_replaced_not_adopted(k8s: Harness):
    """A deleted job's ConfigMap that the garbage collector has yet to remove, when a job of
    the same name is created (here owned by a live stand-in, so the collector leaves it): the
    operator deletes it and creates the job's own. Patched, it kept its identity, which the
    collector could already have marked for deletion; the new job's driver then had no job
    file (seen in CI in the test below)."""
    ns = k8s.namespace
    stand_in = k8s.core.create_namespaced_config_map(ns, {"metadata": {"name": "heir-before"}})
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "heir-before"}
    stale = k8s.core.create_namespaced_config_map(
        ns,
        {
            "metadata": {
                "name": "heir-job",
                "ownerReferences": [{**owner, "uid": stand_in.metadata.uid}],
            }
        },
    )
    uid = k8s.create_job("heir")["metadata"]["uid"]

    def own_config_map() -> Any:
        try:
            found = k8s.core.read_namespaced_config_map("heir-job", ns)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found if found.metadata.uid != stale.metadata.uid else None

    replaced = k8s.wait_for("the job's own ConfigMap", own_config_map)
    assert [ref.uid for ref in replaced.metadata.owner_references] == [uid]
    assert "job.yaml" in (replaced.data or {})


def test_a_job_deleted_and_created_again_starts_afresh(k8s: Harness):
    """`kubectl delete` then `kubectl apply` of the same name: the old driver, still being
    garbage-collected, is no driver of the new job, and its end is no restart. The garbage
    collector watches a newly installed CRD's objects only from its next discovery sync (every
    30 s), so in a fresh cluster the old driver can outlive the old job by that much more."""
    k8s.create_job("again")
    old = k8s.running_driver("again")
    k8s.delete_job("again")
    k8s.wait_for("the old job gone", lambda: k8s.job("again") is None)
    uid = k8s.create_job("again")["metadata"]["uid"]
    assert old.metadata.uid in [p.metadata.uid for p in k8s.pods("again")], "GC was too quick"

    new = k8s.wait_for(
        "the new job's driver",
        lambda: (pod := k8s.driver("again")) and pod.metadata.uid != old.metadata.uid and pod,
        timeout=WAIT_SECONDS + 30,
    )
    assert new.metadata.owner_references[0].uid == uid
    status = k8s.wait_for("phase Starting", k8s.phase_is("again", "Starting"))
    assert status["restarts"] == 0 and "DriverLost" not in k8s.event_reasons("again")
    for kind, child in k8s.children("again").items():
        assert child.metadata.owner_references[0].uid == uid, kind


def test_a_connector_password_reaches_the_driver_pod_from_a_secret(k8s: Harness):
    """The schema keeps `passwordSecret` (Kubernetes 1.20 silently prunes unknown fields), and
    the driver pod takes the password from the Secret: no password in the job, none in RBAC."""
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="pg-credentials"), string_data={"password": "pw"}
    )
    k8s.core.create_namespaced_secret(k8s.namespace, secret)
    try:
        ref = {"name": "pg-credentials", "key": "password"}
        sink = {
            "type": "postgres",
            "postgres": {"dsn": "host=db user=app", "table": "counts", "passwordSecret": ref},
        }
        job = k8s.create_job("secretive", sink=sink)
        assert job["spec"]["sink"]["postgres"]["passwordSecret"] == ref
        pod = k8s.running_driver("secretive")
        (container,) = pod.spec.containers
        env = {e.name: e for e in container.env}
        from_secret = env["DSTREAM_POSTGRES_PASSWORD"].value_from.secret_key_ref
        assert (from_secret.name, from_secret.key) == ("pg-credentials", "password")
        executor_conf = "spark.kubernetes.executor.secretKeyRef.DSTREAM_POSTGRES_PASSWORD"
        assert f"{executor_conf}=pg-credentials:password" in container.args
    finally:
        k8s.core.delete_namespaced_secret("pg-credentials", k8s.namespace)


def audited(cluster: LocalCluster, resource: str, user: str) -> list[dict[str, Any]]:
    """The API server's audit events (list and watch requests, local.sh's policy) about
    `resource` by `user`, one per request. Kubernetes 1.20 logs a watch when it ends."""
    events = [json.loads(line) for line in cluster.audit_log.read_text().splitlines() if line]
    return [
        event
        for event in events
        if (event.get("objectRef") or {}).get("resource") == resource
        and event["user"]["username"] == user
        and event["stage"] == "ResponseComplete"
    ]


def label_selector(event: dict[str, Any]) -> list[str] | None:
    return parse_qs(urlsplit(event["requestURI"]).query).get("labelSelector")


def test_the_operator_asks_the_api_server_for_its_pods_only(k8s: Harness):
    """Seen by the API server itself (its audit log): every pod list and watch the operator
    made, as the chart's ServiceAccount, selected pods by their job label on the server: kopf's
    watch the driver and executor pods of any job, the operator's own lists one job's drivers.
    So the server sent it no other pod. The operator is stopped to end its watches (the log has
    a watch once it ends). The same log has the scheduler's pod list without a label selector:
    an unfiltered request of the operator's would be there too."""
    k8s.create_job("watched")
    k8s.running_driver("watched")
    account = render_chart(release=k8s.namespace, namespace=k8s.namespace)["ServiceAccount"]
    user = f"system:serviceaccount:{k8s.namespace}:{account['metadata']['name']}"
    k8s.operator.stop()
    try:
        requests = k8s.wait_for(
            "the operator's pod watch in the audit log",
            lambda: (
                (found := audited(k8s.cluster, "pods", user))
                and any(e["verb"] == "watch" for e in found)
                and found
            ),
        )
    finally:
        k8s.operator.start()
    for event in requests:
        (selector,) = label_selector(event) or [""]
        assert selector.startswith(JOB_LABEL), event["requestURI"]
        if event["verb"] == "watch":
            assert selector == POD_SELECTOR, event["requestURI"]
    scheduler = audited(k8s.cluster, "pods", "system:kube-scheduler")
    assert [e for e in scheduler if e["verb"] == "list" and label_selector(e) is None]
