"""The cluster under test: the official client for reads and deletes, kubectl for applying
manifests, and bounded waits (every wait names what it waited for when it gives up)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import helm_python as helm
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

T = TypeVar("T")

KUBECTL_TIMEOUT_S = 120
JOB_LABEL = "dstream.dev/job"
ROLE_LABEL = "dstream.dev/role"


class WaitTimeoutError(Exception):
    """A bounded wait ran out."""


class Deadline:
    """The whole suite's time budget: no wait may run past it."""

    def __init__(self, seconds: float):
        self.start(seconds)

    def start(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())


DEADLINE = Deadline(3600)


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float, every_s: float = 1.0) -> T:
    """Poll `check` until it returns something truthy, for at most `timeout_s` (and never past
    the suite's deadline)."""
    limit = min(timeout_s, DEADLINE.remaining())
    give_up = time.monotonic() + limit
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() >= give_up:
            raise WaitTimeoutError(f"gave up after {limit:.0f} s waiting for {what}")
        time.sleep(every_s)


def pod_ready(pod: client.V1Pod) -> bool:
    if pod.metadata.deletion_timestamp or pod.status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def pod_alive(pod: client.V1Pod) -> bool:
    """Neither finished nor being deleted."""
    return not pod.metadata.deletion_timestamp and pod.status.phase not in ("Succeeded", "Failed")


@dataclass
class Cluster:
    kubeconfig: str
    kubectl: str = "kubectl"
    api: client.ApiClient = field(init=False)

    def __post_init__(self) -> None:
        self.api = config.new_client_from_config(config_file=self.kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.extensions = client.ApiextensionsV1Api(self.api)

    def run_kubectl(self, *args: str, stdin: bytes | None = None) -> bytes:
        command = [self.kubectl, "--kubeconfig", self.kubeconfig, *args]
        done = subprocess.run(command, input=stdin, capture_output=True, timeout=KUBECTL_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr.decode(errors='replace')}")
        return done.stdout

    def apply(self, objects: list[dict[str, Any]]) -> None:
        """`kubectl apply` (namespaced objects name their namespace)."""
        self.run_kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects).encode())

    def delete(self, objects: list[dict[str, Any]]) -> None:
        """Delete without waiting (the garbage collector takes the dependents)."""
        text = yaml.safe_dump_all(objects).encode()
        self.run_kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=text)

    def server_minor(self) -> int:
        version = client.VersionApi(self.api).get_code()
        return int("".join(ch for ch in version.minor if ch.isdigit()))

    def create_namespace(self, name: str, timeout_s: float = 120) -> None:
        """Create it and wait until pods can be created in it: before 1.24 that is once the
        `default` ServiceAccount has its token secret."""
        try:
            self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        except ApiException as error:
            if error.status != 409:
                raise
        needs_secret = self.server_minor() < 24

        def account_ready() -> bool:
            try:
                account = self.core.read_namespaced_service_account("default", name)
            except ApiException:
                return False
            return bool(account.secrets) or not needs_secret

        wait_for(f"the default ServiceAccount of namespace {name}", account_ready, timeout_s)

    def delete_namespace(self, name: str) -> None:
        try:
            self.core.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise

    def pods(self, namespace: str, selector: str) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(namespace, label_selector=selector).items

    def job_pods(self, namespace: str, job: str, role: str) -> list[client.V1Pod]:
        return self.pods(namespace, f"{JOB_LABEL}={job},{ROLE_LABEL}={role}")

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        """Delete with the pod's own grace period, as `kubectl delete pod` does, or with
        `grace_seconds` (0: killed at once, as a crash would end it)."""
        self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_seconds)

    def pod_log(self, namespace: str, name: str, timestamps: bool = False) -> str:
        """The pod's log so far (each line prefixed with its time, with `timestamps`); empty
        while it has none to give."""
        try:
            return self.core.read_namespaced_pod_log(name, namespace, timestamps=timestamps)
        except ApiException:
            return ""

    def streaming_job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            "dstream.dev", "v1alpha1", namespace, "streamingjobs", name
        )

    def lease_holder(self, namespace: str, lease: str) -> str | None:
        """The operator (its pod name, the chart's POD_ID) holding the leader Lease."""
        try:
            found = client.CoordinationV1Api(self.api).read_namespaced_lease(lease, namespace)
        except ApiException:
            return None
        return found.spec.holder_identity if found.spec else None

    def crd_established(self, name: str) -> bool:
        try:
            crd = self.extensions.read_custom_resource_definition(name)
        except ApiException:
            return False
        conditions = (crd.status and crd.status.conditions) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)


def render_chart(
    chart: Path, release: str, namespace: str, values: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The chart's CRDs and its rendered objects (Helm's Go SDK, no helm binary needed)."""
    with helm.Chart.load(chart) as loaded:
        loaded.validate_schema(values)
        crds = [doc for c in loaded.crds for doc in yaml.safe_load_all(c["data"]) if doc]
        manifests = loaded.render(values, name=release, namespace=namespace, is_install=True)
    objects = [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return crds, objects


def show_kubectl(cluster: Cluster, commands: list[list[str]], say: Callable[[str], None]) -> None:
    """Runs each kubectl command and prints its output (or its error): a failed run's
    post-mortem, which must not fail itself."""
    for command in commands:
        say("$ kubectl " + " ".join(command))
        try:
            print(cluster.run_kubectl(*command).decode(errors="replace"), flush=True)
        except Exception as error:
            print(f"  ({error})", flush=True)


def driver_selector(job: str) -> str:
    """The label selector of a job's driver pods (named per attempt, found by labels)."""
    return f"{JOB_LABEL}={job},{ROLE_LABEL}=driver"


def operator_selector(release: str) -> str:
    return f"app.kubernetes.io/component=operator,app.kubernetes.io/instance={release}"


def install_operator(
    cluster: Cluster, chart: Path, release: str, namespace: str, values: dict[str, Any]
) -> list[dict[str, Any]]:
    """Apply the chart (CRDs first, then the rest) and wait for the operator pod; returns the
    applied objects for uninstalling."""
    crds, objects = render_chart(chart, release, namespace, values)
    cluster.apply(crds)
    for crd in crds:
        name = crd["metadata"]["name"]
        wait_for(f"CRD {name} established", lambda n=name: cluster.crd_established(n), 60)
    cluster.apply(objects)
    wait_for(
        f"the operator pod in {namespace} ready",
        lambda: any(pod_ready(p) for p in cluster.pods(namespace, operator_selector(release))),
        300,
        every_s=2,
    )
    return objects
