"""Where a new driver's start goes between its SparkContext and its executors: the moments each
of its executor pods shows, read against the fault.

The recovery timeline (dstream.runtime.scheduling.timeline) says when the executors had registered; this
splits that up per executor pod: created, scheduled, its container started (the API server's
times, whole seconds), then, from the container's log with the runtime's timestamps
(nanoseconds), the executor JVM's first line, its connection to the driver and its
registration. A line a log does not show (another Spark version's wording) is left out. (The
driver's own Spark log says nothing of its SparkContext's steps: it logs at WARN.)
"""

from __future__ import annotations

from datetime import datetime

from kubernetes import client

from e2e.chaos.cluster import Cluster

# The INFO lines of an executor's start (CoarseGrainedExecutorBackend, as
# KubernetesExecutorBackend).
EXECUTOR_MARKS = {
    "jvm_logging": "Started daemon with process name",
    "connecting": "Connecting to driver",
    "registered": "Successfully registered with driver",
}


def log_marks(
    cluster: Cluster, namespace: str, pod: str, marks: dict[str, str]
) -> dict[str, float]:
    """The time (unix seconds) of the first line of the pod's log holding each mark's text."""
    return first_marks(cluster.pod_log(namespace, pod, timestamps=True), marks)


def first_marks(text: str, marks: dict[str, str]) -> dict[str, float]:
    """For each mark, the time of the first line of `text` (a log whose lines begin with their
    time) that holds its text; in the order of `marks`."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        stamp, _, message = line.partition(" ")
        for name, needle in marks.items():
            if name not in found and needle in message:
                found[name] = parse_timestamp(stamp)
    return {name: found[name] for name in marks if name in found}


def parse_timestamp(stamp: str) -> float:
    """An RFC 3339 time with up to nanoseconds, as the kubelet prefixes log lines."""
    head, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = datetime.fromisoformat(f"{head}+00:00").timestamp()
    return seconds + (float(f"0.{fraction}") if fraction else 0.0)


def pod_marks(pod: client.V1Pod) -> dict[str, float]:
    """When the API server saw the pod created, scheduled and its first container started."""
    marks = {"created": pod.metadata.creation_timestamp.timestamp()}
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "True":
            marks["scheduled"] = condition.last_transition_time.timestamp()
    for status in pod.status.container_statuses or []:
        running = status.state.running if status.state else None
        if running is not None and running.started_at is not None:
            marks["started"] = running.started_at.timestamp()
    return marks


def executor_pods(
    cluster: Cluster, namespace: str, job: str, driver_uid: str
) -> list[client.V1Pod]:
    """The job's executor pods that Spark created for the driver pod `driver_uid` (their
    owner)."""
    pods = cluster.job_pods(namespace, job, "executor")
    owned = [
        p for p in pods if any(ref.uid == driver_uid for ref in p.metadata.owner_references or [])
    ]
    return sorted(owned, key=lambda p: p.metadata.name)


def describe(marks: dict[str, float], since: float) -> str:
    return ", ".join(f"{name} +{at - since:.1f} s" for name, at in marks.items())


def breakdown(
    cluster: Cluster, namespace: str, job: str, driver: client.V1Pod, since: float
) -> list[str]:
    """One line per executor pod of `driver`, each mark in seconds after `since` (the fault)."""
    lines = []
    for pod in executor_pods(cluster, namespace, job, driver.metadata.uid):
        executor = pod.metadata.name
        marks = pod_marks(pod) | log_marks(cluster, namespace, executor, EXECUTOR_MARKS)
        lines.append(f"{executor}: {describe(marks, since)}")
    return lines
