"""`dstream-operator` started by hand, against a real API server, where kopf's peering cannot
work: it refuses to start naming the fix instead of waiting silently, and the fix it names
works (the peering CRD and object from crds/ and the printed command, or --standalone)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conditions import eventually
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.k8s.conftest import REPO_ROOT, LocalCluster
from tests.k8s.test_operator import GROUP, PLURAL, VERSION, OperatorProcess, job_manifest

pytestmark = pytest.mark.k8s

PEERING_CRDS = REPO_ROOT / "crds" / "kopfpeerings.yaml"
STREAMINGJOB_CRD = REPO_ROOT / "crds" / "streamingjob.yaml"
PEERING_CRD_NAMES = ["clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"]
REFUSAL_SECONDS = 60
WAIT_SECONDS = 60


def refused_start(kubeconfig: Path, *args: str) -> str:
    """Runs the operator, which must exit with an error by itself; returns its stderr."""
    executable = Path(sys.executable).with_name("dstream-operator")
    done = subprocess.run(
        [str(executable), *args, "--metrics-port=0"],
        env=os.environ | {"KUBECONFIG": str(kubeconfig)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=REFUSAL_SECONDS,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr


def acts_on_a_job(cluster: LocalCluster, namespace: str, operator: OperatorProcess) -> None:
    """The running operator gives a new job its children, and lets it be deleted."""
    custom = client.CustomObjectsApi(cluster.api_client)
    name = f"job-{uuid.uuid4().hex[:6]}"
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, job_manifest(name, suspend=True)
    )

    def has_config_map() -> bool:
        try:
            cluster.core.read_namespaced_config_map(f"{name}-job", namespace)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def job_gone() -> bool:
        jobs = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        return not [j for j in jobs if j["metadata"]["name"] == name]

    try:
        eventually(
            has_config_map,
            WAIT_SECONDS,
            interval=0.25,
            message=lambda: f"the operator creates {name}'s ConfigMap\n{operator.log_tail()}",
        )
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        eventually(
            job_gone,
            WAIT_SECONDS,
            interval=0.25,
            message=f"{name} deleted (the operator removes its finalizer)",
        )


@pytest.fixture(scope="module")
def namespace(k8s_cluster: LocalCluster) -> Iterator[str]:
    k8s_cluster.apply_crds(STREAMINGJOB_CRD)
    with k8s_cluster.namespace("dstream-peer") as name:
        yield name


@pytest.fixture
def operator(k8s_cluster: LocalCluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    """An operator process, not started; stopped after the test."""
    process = OperatorProcess([], k8s_cluster.kubeconfig, tmp_path / "operator.log")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def without_peering_crds(k8s_cluster: LocalCluster) -> Iterator[None]:
    """kopf's peering CRDs removed (a cluster without the chart), installed again afterwards
    from crds/ for the tests that need them."""
    ext = client.ApiextensionsV1Api(k8s_cluster.api_client)
    custom = client.CustomObjectsApi(k8s_cluster.api_client)
    for name in PEERING_CRD_NAMES:
        try:
            ext.delete_custom_resource_definition(name)
        except ApiException as error:
            if error.status != 404:
                raise

    def not_served() -> bool:
        try:
            custom.get_api_resources("kopf.dev", "v1")
        except ApiException as error:
            return error.status == 404
        return False

    eventually(not_served, WAIT_SECONDS, interval=0.25, message="kopf.dev/v1 no longer served")
    try:
        yield
    finally:
        k8s_cluster.apply_crds(PEERING_CRDS)


def test_without_the_peering_crd_it_refuses_and_runs_standalone_when_told(
    k8s_cluster: LocalCluster, namespace: str, without_peering_crds: None, operator
):
    error = refused_start(k8s_cluster.kubeconfig, "--namespace", namespace)
    assert "the CRD kopfpeerings.kopf.dev is not installed" in error
    assert "kubectl apply -f crds/kopfpeerings.yaml" in error
    assert "pass --standalone" in error

    operator.args = ["--namespace", namespace, "--standalone"]
    operator.start()
    acts_on_a_job(k8s_cluster, namespace, operator)


def test_without_the_peering_object_it_refuses_and_the_command_it_prints_fixes_that(
    k8s_cluster: LocalCluster, namespace: str, operator
):
    k8s_cluster.apply_crds(PEERING_CRDS)  # as `kubectl apply -f crds/` would
    error = refused_start(k8s_cluster.kubeconfig, "--namespace", namespace)
    assert f"no peering object 'dstream' in {namespace}" in error
    assert "pass --standalone" in error
    command = re.search(r"Create it \((.*)\), as the chart does", error)
    assert command, error
    assert f"kubectl apply -n {namespace} -f -" in command.group(1)

    kubectl = Path(k8s_cluster.kubectl).parent
    created = subprocess.run(
        ["bash", "-c", command.group(1)],
        env=os.environ
        | {"KUBECONFIG": str(k8s_cluster.kubeconfig), "PATH": f"{kubectl}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    operator.args = ["--namespace", namespace]  # --peering dstream, the default
    operator.start()
    acts_on_a_job(k8s_cluster, namespace, operator)
