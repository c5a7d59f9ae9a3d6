"""A driver's executor pods owned by its pod through their template (service/executor_owner.py),
on the real API server: a Spark driver on this machine, in client mode as in a driver pod, makes
its executor pod from the template with the owner reference on it, without first waiting for
its own pod (never ready here, as a dstream driver before its first batch) to turn ready; and
when the driver pod goes, Kubernetes' garbage collector takes the executor pod with it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conditions import eventually
from kubernetes import client

from tests.k8s.conftest import LocalCluster

pytestmark = pytest.mark.k8s

DRIVER = "wc-driver-1"
TEMPLATE_LABEL = {"dstream.dev/template": "executor"}
# Spark's own log line when it waited for the driver pod and it did not turn ready.
READINESS_WAIT = "Timed out waiting for"
START_TIMEOUT_S = 180

# The driver: its settings from the arguments, the owner from executor_owner, then one
# SparkContext until its standard input closes.
DRIVER_PROGRAM = """
import sys
from pyspark import SparkConf, SparkContext
from dstream.service import executor_owner

settings = dict(argument.split("=", 1) for argument in sys.argv[1:])
settings |= executor_owner.owner_settings(list(settings.items()))
sc = SparkContext(conf=SparkConf().setAll(list(settings.items())))
print("driver: up", flush=True)
sys.stdin.read()
sc.stop()
"""


@pytest.fixture(scope="module")
def namespace(k8s_cluster: LocalCluster) -> Iterator[str]:
    with k8s_cluster.namespace("dstream-owner") as name:
        yield name


def driver_pod(cluster: LocalCluster, namespace: str) -> client.V1Pod:
    """The driver's pod object, bound to a node that does not exist: it never turns ready."""
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=DRIVER),
        spec=client.V1PodSpec(
            node_name="nowhere",
            containers=[client.V1Container(name="driver", image="dstream:never-pulled")],
        ),
    )
    return cluster.core.create_namespaced_pod(namespace, pod)


def start_driver(
    cluster: LocalCluster, namespace: str, uid: str, template: Path
) -> subprocess.Popen[str]:
    server = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    settings = {
        "spark.master": f"k8s://{server}",
        "spark.submit.deployMode": "client",
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": "dstream:never-pulled",
        "spark.kubernetes.executor.podNamePrefix": DRIVER,
        "spark.kubernetes.executor.podTemplateFile": str(template),
        "spark.kubernetes.executor.podTemplateContainerName": "executor",
        "spark.kubernetes.executor.disableConfigMap": "true",
        "spark.executor.instances": "1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        # As dstream's drivers (service/job.py): no wait for executors, which never register here.
        "spark.scheduler.minRegisteredResourcesRatio": "0",
    }
    env = os.environ | {"POD_NAME": DRIVER, "POD_UID": uid, "KUBECONFIG": str(cluster.kubeconfig)}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER_PROGRAM, *(f"{k}={v}" for k, v in settings.items())],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_until_up(driver: subprocess.Popen[str]) -> list[str]:
    """The driver's output up to its SparkContext's start (the readiness wait happens inside)."""
    assert driver.stdout is not None
    lines = []
    for line in driver.stdout:
        lines.append(line)
        if line.startswith("driver: up"):
            return lines
    raise AssertionError(f"the driver exited before its SparkContext was up:\n{''.join(lines)}")


def executor_pods(cluster: LocalCluster, namespace: str) -> list[client.V1Pod]:
    pods = cluster.core.list_namespaced_pod(namespace).items
    return [p for p in pods if p.metadata.name.startswith(f"{DRIVER}-exec-")]


def test_executor_pods_are_owned_by_the_driver_pod_without_a_readiness_wait(
    k8s_cluster: LocalCluster, namespace: str, tmp_path: Path
):
    owner = driver_pod(k8s_cluster, namespace)
    template = tmp_path / "executor-pod-template.yaml"
    template.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"labels": TEMPLATE_LABEL},
                "spec": {"containers": [{"name": "executor"}]},  # as the operator's template
            }
        )
    )
    driver = start_driver(k8s_cluster, namespace, owner.metadata.uid, template)
    try:
        started = read_until_up(driver)
        assert not [line for line in started if READINESS_WAIT in line], "".join(started)
        executor = eventually(lambda: executor_pods(k8s_cluster, namespace), START_TIMEOUT_S)[0]
        (reference,) = executor.metadata.owner_references
        assert (reference.kind, reference.name, reference.uid) == (
            "Pod",
            DRIVER,
            owner.metadata.uid,
        )
        assert reference.controller is True
        assert executor.metadata.labels.items() >= TEMPLATE_LABEL.items()

        # The pod GC may have removed it already: it is bound to a node that does not exist.
        with contextlib.suppress(client.exceptions.NotFoundException):
            k8s_cluster.core.delete_namespaced_pod(DRIVER, namespace, grace_period_seconds=0)
        eventually(
            lambda: (
                executor.metadata.name
                not in {p.metadata.name for p in executor_pods(k8s_cluster, namespace)}
            ),
            START_TIMEOUT_S,
        )  # the garbage collector took it with its owner
    finally:
        driver.communicate(timeout=120)
