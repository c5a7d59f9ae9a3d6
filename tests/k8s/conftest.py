"""The `k8s_cluster` fixture: a real Kubernetes 1.20 control plane on loopback.

It runs `bash e2e/cluster/local.sh up`, which builds the binaries once (minutes when cold; kept
in /var/cache/dstream-k8s) and starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and a kubemark hollow node. If `up` fails, every test using the fixture errors
with the script's output. The cluster is brought down at the end of the session only if this
fixture started it; a cluster that was already up (say, started by CI before pytest) is left alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
import yaml
from conditions import eventually
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCAL_SH = REPO_ROOT / "e2e" / "cluster" / "local.sh"
STATE_DIR = pathlib.Path(os.environ.get("DSTREAM_K8S_STATE", "/tmp/dstream-k8s-state"))

# A cold `up` compiles Kubernetes; this bounds it (the script bounds each of its own waits too).
UP_TIMEOUT_SECONDS = 3600
DOWN_TIMEOUT_SECONDS = 120


@dataclasses.dataclass(frozen=True)
class LocalCluster:
    kubeconfig: pathlib.Path
    api_client: client.ApiClient
    node_name: str
    kubectl: str
    audit_log: pathlib.Path  # the API server's: every list and watch request (local.sh)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    def create_namespace(self, name: str, timeout_seconds: int = 60) -> str:
        """Creates a namespace and waits until pods can be created in it: Kubernetes 1.20 refuses
        pods (500 "No API token found for service account") until the controller-manager has
        given the namespace's `default` ServiceAccount its token secret."""
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        stream = watch.Watch().stream(
            self.core.list_namespaced_service_account,
            name,
            field_selector="metadata.name=default",
            timeout_seconds=timeout_seconds,
        )
        for event in stream:
            if event["type"] != "DELETED" and event["object"].secrets:
                return name
        raise TimeoutError(f"namespace {name}: no token for ServiceAccount default")

    @contextlib.contextmanager
    def namespace(self, prefix: str) -> Iterator[str]:
        """A namespace of its own (`<prefix>-<random>`) for a test or module, deleted after."""
        name = self.create_namespace(f"{prefix}-{uuid.uuid4().hex[:6]}")
        try:
            yield name
        finally:
            self.core.delete_namespace(name)

    def apply_crds(self, path: pathlib.Path, timeout_seconds: float = 60) -> list[str]:
        """Creates the CRDs of a YAML file, or replaces older copies left on a long-lived
        cluster, and waits until all are Established; returns their names."""
        ext = client.ApiextensionsV1Api(self.api_client)
        names = []
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                _create_or_replace_crd(ext, document)
                names.append(document["metadata"]["name"])
        eventually(
            lambda: all(_established(ext, name) for name in names),
            timeout_seconds,
            interval=0.25,
            message=f"CRDs Established: {names}",
        )
        return names


def _create_or_replace_crd(ext: client.ApiextensionsV1Api, document: dict) -> None:
    name = document["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(document)
    except ApiException as error:
        if error.status != 409:
            raise
        current = ext.read_custom_resource_definition(name)
        document["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, document)


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    conditions = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def pytest_collection_modifyitems(config, items):
    """Keep a cold build out of the per-test timeout: for tests that use `k8s_cluster` (and set
    no timeout of their own) the configured timeout covers the test function only, not the
    fixture set-up that may compile Kubernetes."""
    for item in items:
        if "k8s_cluster" in getattr(item, "fixturenames", ()):
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(func_only=True))


def _script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(LOCAL_SH), *args],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run_up_showing_progress(request) -> tuple[int, str]:
    """Runs `local.sh up`, echoing its lines live (a cold build is long) and returning them."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    lines: list[str] = []
    proc = subprocess.Popen(
        ["bash", str(LOCAL_SH), "up"],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if capture is not None:
            with capture.global_and_fixture_disabled():
                sys.stderr.write(line)
        else:
            sys.stderr.write(line)
    try:
        rc = proc.wait(timeout=UP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        lines.append(f"local.sh up did not finish within {UP_TIMEOUT_SECONDS}s\n")
    return rc, "".join(lines)


@pytest.fixture(scope="session")
def k8s_cluster(request):
    already_up = _script("status", timeout=60).returncode == 0
    rc, output = _run_up_showing_progress(request)
    if rc != 0:
        pytest.fail(f"`bash e2e/cluster/local.sh up` failed (exit {rc}):\n{output}", pytrace=False)

    # `up` ends with "api: ...", "node: ...", "kubeconfig: ...", "audit log: ...", "kubectl: ..."
    values = dict(
        line.split(": ", 1)
        for line in output.splitlines()
        if line.startswith(("node: ", "kubeconfig: ", "audit log: ", "kubectl: "))
    )
    kubeconfig = pathlib.Path(values.get("kubeconfig", str(STATE_DIR / "admin.kubeconfig")))
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield LocalCluster(
            kubeconfig=kubeconfig,
            api_client=api_client,
            node_name=values.get("node", "127.0.0.1"),
            kubectl=values.get("kubectl", "kubectl"),
            audit_log=pathlib.Path(values.get("audit log", str(STATE_DIR / "logs" / "audit.log"))),
        )
    finally:
        api_client.close()
        if not already_up:
            down = _script("down", timeout=DOWN_TIMEOUT_SECONDS)
            if down.returncode != 0:
                sys.stderr.write(f"local.sh down failed:\n{down.stdout}{down.stderr}")
