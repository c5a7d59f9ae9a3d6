"""Many StreamingJobs at once on the real API server: every job gets its driver pod, a spec
change replaces every driver, and deleting the jobs removes every pod. `make test` runs 30 jobs;
`make operator-scale` runs the issue's 200 with one and with two operator replicas and prints the
figures docs/operator-scale.md publishes (never asserted: the machine is shared).

Times come from the objects' creationTimestamps (whole seconds), from this test's own clock (a
job's create call, a watch seeing its driver pod added: sub-second) and from polling the API
server every 0.25 s; the operator's CPU and memory from its process; API requests from the API
server's own `apiserver_request_total` (all clients, this test's polling included).
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
from conditions import eventually
from kubernetes import client, watch
from prometheus_client.parser import text_string_to_metric_families

from tests.k8s import test_operator
from tests.k8s.conftest import LocalCluster
from tests.k8s.test_operator import (
    GROUP,
    PLURAL,
    SPEC_HASH,
    VERSION,
    Harness,
    OperatorProcess,
    Release,
    job_manifest,
)

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(1800)]

chart_crds = test_operator.chart_crds
namespace = test_operator.namespace
chart_release = test_operator.chart_release

JOBS = int(os.environ.get("DSTREAM_SCALE_JOBS", "30"))
REPLICAS = int(os.environ.get("DSTREAM_SCALE_REPLICAS", "1"))
POLL_SECONDS = 0.25
CLIENTS = 8  # concurrent creates/patches/deletes: "applied at once"
DRIVERS = "dstream.dev/role=driver"
WATCH_SECONDS = 2  # each watch request's length: how soon the watch thread notices its stop


def seconds_per_job() -> float:
    """Waiting budget: generous, as the point is to measure, not to race."""
    return max(120.0, JOBS * 1.5)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


RequestKind = tuple[str, str]  # (verb, resource[/subresource])


def api_requests(api: client.ApiClient) -> Counter[RequestKind]:
    """Requests the API server has served so far (its own counter, every client), by verb and
    resource."""
    bearer = api.configuration.auth_settings().get("BearerToken")
    headers = {"Authorization": bearer["value"]} if bearer and bearer["value"] else {}
    response = api.rest_client.request("GET", f"{api.configuration.host}/metrics", headers=headers)
    counts: Counter[RequestKind] = Counter()
    for family in text_string_to_metric_families(response.read().decode()):
        for sample in family.samples:
            if sample.name == "apiserver_request_total":
                labels = sample.labels
                resource = "/".join(filter(None, (labels["resource"], labels["subresource"])))
                counts[labels["verb"], resource] += sample.value
    return counts


def writes_per_job(requests: Counter[RequestKind]) -> str:
    """The writes (and single-object reads) per job, by kind: what each new job costs the API
    server, whoever sent them (the operator, kopf, the scheduler, the hollow kubelet). The
    test's own creates are among them; lists and watches (the test's polling) are not."""
    return " ".join(
        f"{verb}:{resource}={count / JOBS:.2f}"
        for (verb, resource), count in sorted(requests.items(), key=lambda item: -item[1])
        if verb in ("GET", "POST", "PUT", "PATCH", "DELETE") and count / JOBS >= 0.05
    )


def in_parallel(action: Callable[[str], Any], names: list[str]) -> None:
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(action, names))


class DriversAdded:
    """When this test first sees each job's driver pod added, on its own clock: a watch from
    before the first job's creation, in a thread of its own. With the create calls timed on the
    same clock this gives apply -> pod to a fraction of a second, where creationTimestamps
    have whole seconds. Watching also spares the API server and this test's process a list of
    every pod four times a second while the operator creates them."""

    def __init__(self, core: client.CoreV1Api, namespace: str):
        self.seen: dict[str, float] = {}  # job -> when its first driver pod was seen added
        self._core, self._namespace = core, namespace
        listed = core.list_namespaced_pod(namespace, label_selector=DRIVERS)
        self._version = listed.metadata.resource_version
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="drivers-added", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        """Watch requests one after the other, each from the last version seen, until stopped."""
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                self._core.list_namespaced_pod,
                self._namespace,
                label_selector=DRIVERS,
                resource_version=self._version,
                timeout_seconds=WATCH_SECONDS,
                deserialize=False,
            )
            for event in stream:
                meta = event["object"]["metadata"]
                self._version = meta["resourceVersion"]
                if event["type"] == "ADDED":
                    self.seen.setdefault(meta["labels"]["dstream.dev/job"], time.time())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WATCH_SECONDS * 5)
        assert not self._thread.is_alive(), "the driver pod watch did not stop"


def stamp(obj_time: datetime) -> float:
    return obj_time.timestamp()


def until(what: str, condition: Callable[[], bool], timeout: float) -> float:
    """`eventually`, returning the wall-clock time the condition was first seen true."""
    eventually(condition, timeout, interval=POLL_SECONDS, message=what)
    return time.time()


def _where_the_time_goes(
    core: client.CoreV1Api,
    namespace: str,
    jobs: dict[str, dict[str, Any]],
    pods: dict[str, client.V1Pod],
) -> str:
    """p50/p99 of the two steps from a job's creation to its driver pod: waiting for a token of
    the driver's ServiceAccount (Kubernetes 1.20's token controller writes one for each new
    ServiceAccount, and the API server refuses a pod that runs as it until then; no wait if the
    token was there before the job), and the operator's work from then on."""
    tokens = {
        (s.metadata.annotations or {}).get("kubernetes.io/service-account.name"): s
        for s in core.list_namespaced_secret(namespace).items
        if s.type == "kubernetes.io/service-account-token"
    }
    steps: dict[str, list[float]] = {"to_token": [], "to_pod": []}
    for name, job in jobs.items():
        token = tokens.get(pods[name].spec.service_account_name)
        if token is None:
            continue
        job_created = datetime.fromisoformat(job["metadata"]["creationTimestamp"]).timestamp()
        ready = max(job_created, stamp(token.metadata.creation_timestamp))
        steps["to_token"].append(ready - job_created)
        steps["to_pod"].append(stamp(pods[name].metadata.creation_timestamp) - ready)
    return " ".join(
        f"{key}_p50={statistics.median(values):.0f}s {key}_p99={percentile(values, 0.99):.0f}s"
        for key, values in steps.items()
        if values
    )


def _apply_to_pod_seen(calls: dict[str, tuple[float, float]], seen: dict[str, float]) -> str:
    """p50/p99 of apply -> pod on this test's clock: from the start of the job's create call
    to its driver pod's ADDED event reaching the test's watch. That bounds the time from the
    job's creation to its pod's from above, by the create call's time before the API server
    stored the job (its whole length, `create_call_p99`, is at most that) and the watch's
    delivery."""
    waits = [seen[name] - called for name, (called, _) in calls.items()]
    lengths = [returned - called for called, returned in calls.values()]
    return (
        f"apply_to_pod_seen_p50={statistics.median(waits):.2f}s "
        f"apply_to_pod_seen_p99={percentile(waits, 0.99):.2f}s "
        f"apply_to_pod_seen_max={max(waits):.2f}s "
        f"create_call_p99={percentile(lengths, 0.99):.2f}s"
    )


def test_many_jobs_get_drivers_change_and_go(
    k8s_cluster: LocalCluster, namespace: str, chart_release: Release, tmp_path: Path
):
    operators = [
        OperatorProcess(chart_release.args, chart_release.kubeconfig, tmp_path / f"op{i}.log")
        for i in range(REPLICAS)
    ]
    k8s = Harness(k8s_cluster, namespace, operators[0])
    custom, core = k8s.custom, k8s.core
    names = [f"scale-{i:03d}" for i in range(JOBS)]
    added: DriversAdded | None = None
    try:
        for operator in operators:
            operator.start()
        leader = next(
            o
            for o in k8s.wait_for(
                "a leader", lambda: [o for o in operators if o.metric("dstream_operator_leader")]
            )
        )
        k8s.operator = leader
        process = psutil.Process(leader.process.pid)
        cpu_before = sum(process.cpu_times()[:2])
        added = DriversAdded(core, namespace)
        requests_before, started = api_requests(k8s_cluster.api_client), time.time()
        create_calls: dict[str, tuple[float, float]] = {}  # job -> its create call's start, end

        def create(name: str) -> None:
            body = job_manifest(name, driver={"cores": 1, "memory": "512m"})
            called = time.time()
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
            create_calls[name] = (called, time.time())

        def drivers() -> dict[str, client.V1Pod]:
            pods = core.list_namespaced_pod(namespace, label_selector=DRIVERS)
            return {p.metadata.labels["dstream.dev/job"]: p for p in pods.items}

        in_parallel(create, names)
        until("every job's driver pod", lambda: len(added.seen) == JOBS, seconds_per_job())
        added.stop()
        jobs = {
            j["metadata"]["name"]: j
            for j in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)[
                "items"
            ]
        }
        pods = drivers()
        job_times = [
            datetime.fromisoformat(jobs[n]["metadata"]["creationTimestamp"]).timestamp()
            for n in names
        ]
        created = [
            stamp(pods[n].metadata.creation_timestamp) - job_time
            for n, job_time in zip(names, job_times, strict=True)
        ]

        phases = _where_the_time_goes(core, namespace, jobs, pods)
        seen = _apply_to_pod_seen(create_calls, added.seen)

        def statuses_name_their_driver() -> bool:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
            return all((j.get("status") or {}).get("driverPod") for j in items["items"])

        status_seen = until("every status names its driver", statuses_name_their_driver, 300)
        status_lag = status_seen - max(stamp(p.metadata.creation_timestamp) for p in pods.values())
        # the creation's cost: from before the first create until every status names its driver
        cpu_created = sum(process.cpu_times()[:2]) - cpu_before
        requests_created = api_requests(k8s_cluster.api_client) - requests_before

        old_hashes = {n: p.metadata.annotations[SPEC_HASH] for n, p in pods.items()}
        changed_at = time.time()
        in_parallel(
            lambda n: k8s.patch_spec(n, {"executor": {"instances": 2}}),
            names,
        )

        def all_replaced() -> bool:
            now = drivers()
            return len(now) == JOBS and all(
                p.metadata.annotations[SPEC_HASH] != old_hashes[n]
                and not p.metadata.deletion_timestamp
                for n, p in now.items()
            )

        replaced = until("every driver replaced for the change", all_replaced, seconds_per_job())
        rss_mib = process.memory_info().rss / 2**20
        cpu_seconds = sum(process.cpu_times()[:2]) - cpu_before
        requests = (api_requests(k8s_cluster.api_client) - requests_before).total()
        busy = time.time() - started

        deleted_at = time.time()
        in_parallel(k8s.delete_job, names)
        marked: list[float] = []  # when every pod left was first seen on its way out

        def job_pods_gone() -> bool:
            left = core.list_namespaced_pod(namespace, label_selector="dstream.dev/job").items
            if not marked and all(p.metadata.deletion_timestamp for p in left):
                marked.append(time.time())
            return not left

        gone = until("every job pod gone", job_pods_gone, seconds_per_job())
        summary = (
            f"operator-scale: jobs={JOBS} replicas={REPLICAS} "
            f"jobs_created_over={max(job_times) - min(job_times):.0f}s "
            f"apply_to_pod_p50={statistics.median(created):.0f}s "
            f"apply_to_pod_p99={percentile(created, 0.99):.0f}s {phases} {seen} "
            f"status_after_last_pod={status_lag:.1f}s "
            f"change_all_replaced={replaced - changed_at:.1f}s "
            f"delete_all_marked={marked[0] - deleted_at:.1f}s "
            f"delete_all_gone={gone - deleted_at:.1f}s "
            f"operator_rss={rss_mib:.0f}MiB operator_cpu={cpu_seconds:.1f}s "
            f"api_requests_per_s={requests / busy:.1f} "
            f"created_cpu_per_job={cpu_created / JOBS * 1000:.0f}ms "
            f"created_requests_per_job={requests_created.total() / JOBS:.1f}"
        )
        print(summary)
        print(f"operator-scale: created_writes_per_job {writes_per_job(requests_created)}")
        assert leader.running()
        standbys = [o for o in operators if o is not leader]
        assert not [o for o in standbys if o.metric("dstream_operator_leader")]
    finally:
        if added is not None:
            added.stop()
        for operator in operators:
            operator.stop()
        test_operator._remove_jobs(k8s)
