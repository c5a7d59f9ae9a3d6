"""An in-process operator against kmock's Kubernetes API emulator.

`cluster` is kmock's emulator with the resources the operator uses declared for discovery;
`driver_api` answers `GET /v1/status` for every `*.svc` host (kmock intercepts aiohttp's name
resolution), standing in for the drivers; `operator` runs kopf with our handlers against them.
"""

from __future__ import annotations

import asyncio
import copy
import re
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import kopf
import pytest
import pytest_asyncio
from conditions import eventually_async
from dstream_operator import handlers
from dstream_operator.kube import Kube
from dstream_operator.supervisor import SupervisorSettings
from kubernetes.client import Configuration

NS = "jobs"
JOBS = "dstream.dev/v1alpha1/streamingjobs"
PODS = "v1/pods"

RESOURCES: dict[str, dict[str, Any]] = {
    JOBS: {
        "kind": "StreamingJob",
        "singular": "streamingjob",
        "namespaced": True,
        "subresources": {"status"},
    },
    PODS: {"kind": "Pod", "singular": "pod", "namespaced": True},
    "v1/services": {"kind": "Service", "singular": "service", "namespaced": True},
    "v1/configmaps": {"kind": "ConfigMap", "singular": "configmap", "namespaced": True},
    "v1/serviceaccounts": {
        "kind": "ServiceAccount",
        "singular": "serviceaccount",
        "namespaced": True,
    },
    "rbac.authorization.k8s.io/v1/roles": {"kind": "Role", "singular": "role", "namespaced": True},
    "rbac.authorization.k8s.io/v1/rolebindings": {
        "kind": "RoleBinding",
        "singular": "rolebinding",
        "namespaced": True,
    },
    "v1/events": {"kind": "Event", "singular": "event", "namespaced": True},
    "policy/v1/poddisruptionbudgets": {
        "kind": "PodDisruptionBudget",
        "singular": "poddisruptionbudget",
        "namespaced": True,
    },
    "networking.k8s.io/v1/ingresses": {
        "kind": "Ingress",
        "singular": "ingress",
        "namespaced": True,
    },
    # kopf waits for these two in discovery before it starts watching
    "v1/namespaces": {"kind": "Namespace", "singular": "namespace", "namespaced": False},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition",
        "singular": "customresourcedefinition",
        "namespaced": False,
    },
}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


def job_manifest(name: str = "wc", **spec: Any) -> dict[str, Any]:
    """A valid StreamingJob as the API server would hand it out (uid, generation, and a
    resourceVersion that kopf's finalizer patches test for; kmock never changes it)."""
    body = {
        "apiVersion": "dstream.dev/v1alpha1",
        "kind": "StreamingJob",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": {
            "batchInterval": "1s",
            "app": {"builtin": "wordcount"},
            "source": {"type": "rate", "rate": {"recordsPerSecond": 100}},
            "executor": {"instances": 2},
            "restartPolicy": {"type": "Always", "maxRestarts": 2, "backoffSeconds": 1},
        },
    }
    body["spec"].update(spec)
    return body


@pytest.fixture
def cluster(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    for resource, info in RESOURCES.items():
        kmock.resources[resource] = kmock.ResourceInfo(verbs=VERBS, **info)
    return kmock


@pytest_asyncio.fixture
async def driver_api() -> AsyncIterator[dict[str, Any]]:
    """The document every driver answers with; tests change it in place."""
    document: dict[str, Any] = {
        "job": "wc",
        "state": "running",
        "batchIntervalSeconds": 1.0,
        "lastBatch": None,
        "rateLimit": {},
        "pendingBatches": 0,
        "recoveries": {},
    }
    async with (
        kmock.RawHandler() as handler,
        kmock.Server(handler, hostnames=re.compile(r".*\.svc")),
    ):
        handler["get /v1/status"] << (lambda: copy.deepcopy(document))
        yield document


@pytest_asyncio.fixture
async def operator(cluster, driver_api) -> AsyncIterator[kmock.KubernetesEmulator]:
    """kopf with the dstream handlers, standalone, watching NS, polling drivers often.

    kopf runs in a thread with its own event loop (as kopf's own KopfRunner does): on exit it
    cancels every task created while it ran, which in the test's loop would include pytest's.
    """
    assert handlers.JOBS  # the import registered the handlers in kopf's default registry
    url = str(cluster.url).rstrip("/")
    stop = threading.Event()
    thread = threading.Thread(target=asyncio.run, args=(run_operator(url, stop),))
    thread.start()
    await wait_for(lambda: any("watch" in str(r.url) for r in cluster["get"]))
    yield cluster
    stop.set()
    await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive()


@kopf.on.login()
def login_to_kmock(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """Tests only: the operator talks to this test's kmock (replaces kopf's kubeconfig logins)."""
    return kopf.ConnectionInfo(server=memo.kmock_url)


async def run_operator(url: str, stop: threading.Event) -> None:
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    memo = kopf.Memo(
        kmock_url=url,
        kube=Kube(Configuration(host=url)),
        supervision=SupervisorSettings(interval_seconds=0.2, poll_timeout_seconds=1.0),
    )
    await kopf.operator(
        registry=kopf.get_default_registry(),
        settings=settings,
        namespaces=[NS],
        standalone=True,
        memo=memo,
        stop_flag=stop,
    )


async def wait_for(condition: Callable[[], Any], timeout: float = 20.0) -> Any:
    """`eventually_async` with the operator tests' timeout."""
    return await eventually_async(condition, timeout)


def current(cluster: kmock.KubernetesEmulator, resource: str, name: str) -> dict | None:
    """The object as stored now, or None if it does not exist (or was deleted)."""
    key = (kmock.resource(resource), NS, name)
    if key not in cluster.objects or cluster.objects[key].deleted:
        return None
    return copy.deepcopy(cluster.objects[key].raw)


def driver(cluster: kmock.KubernetesEmulator, job: str = "wc") -> dict | None:
    """The job's newest driver pod that exists now, found by its labels (the operator names
    each attempt's pod `<job>-driver-<n>`: the highest n)."""
    pods = [
        obj.raw
        for (resource, namespace, _), obj in cluster.objects.items()
        if resource == kmock.resource(PODS) and namespace == NS and not obj.deleted
    ]
    labels = {"dstream.dev/job": job, "dstream.dev/role": "driver"}
    ours = [p for p in pods if labels.items() <= (p["metadata"].get("labels") or {}).items()]
    newest = max(ours, key=lambda p: int(p["metadata"]["name"].rsplit("-", 1)[1]), default=None)
    return copy.deepcopy(newest)


def events(cluster: kmock.KubernetesEmulator) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every Event posted so far."""
    return [
        (r.data["type"], r.data["reason"], r.data["message"])
        for r in cluster["post"]
        if str(r.url.path).endswith("/events")
    ]


def path(resource: str, name: str | None = None, sub: str | None = None) -> str:
    group_version, plural = resource.rsplit("/", 1)
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    result = f"{base}/namespaces/{NS}/{plural}"
    return "/".join(p for p in (result, name, sub) if p)
