"""A driver pod's executors owned by it, without Spark's wait for that pod to be ready.

Given `spark.kubernetes.driver.pod.name`, Spark makes the driver pod the owner of every
executor pod (Kubernetes deletes them with it), and it also waits, inside the SparkContext's
start and before it asks for a single executor, for that pod to turn ready: at least a second
(`spark.kubernetes.allocation.driver.readinessTimeout` counts whole seconds) and in vain, since
a dstream driver is ready only once it has completed a batch. So the operator leaves the name
unset, and the driver puts its own pod, from the downward API (POD_NAME, POD_UID), into the
executors' pod template as their owner; Spark keeps a template's owner references on the pods
it makes from it.

Executor claims that Spark creates per executor (`claimName=OnDemand`) are owned by the driver
pod only through the name, so such a job keeps Spark's way, wait included.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

POD_NAME_KEY = "spark.kubernetes.driver.pod.name"
TEMPLATE_KEY = "spark.kubernetes.executor.podTemplateFile"
ON_DEMAND_CLAIM = "OnDemand"


def owner_settings(conf: list[tuple[str, str]]) -> dict[str, str]:
    """What to add to a driver's Spark settings `conf` so that this driver pod owns its
    executors: nothing off Kubernetes, outside a pod, or when the job names the driver pod
    itself. May write a template file."""
    settings = dict(conf)
    pod, uid = os.environ.get("POD_NAME"), os.environ.get("POD_UID")
    on_kubernetes = settings.get("spark.master", "").startswith("k8s://")
    if not on_kubernetes or not (pod and uid) or POD_NAME_KEY in settings:
        return {}
    if any(_is_on_demand_claim(key, value) for key, value in settings.items()):
        return {POD_NAME_KEY: pod}
    template = with_owner(_read_template(settings.get(TEMPLATE_KEY)), pod, uid)
    return {TEMPLATE_KEY: str(_write_template(template))}


def with_owner(template: dict[str, Any], pod: str, uid: str) -> dict[str, Any]:
    """The pod template with the driver pod added to its owners, as Spark's own would be."""
    owner = {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid, "controller": True}
    metadata = dict(template.get("metadata") or {})
    metadata["ownerReferences"] = [*(metadata.get("ownerReferences") or []), owner]
    return {"apiVersion": "v1", "kind": "Pod", "spec": {}, **template, "metadata": metadata}


def _is_on_demand_claim(key: str, value: str) -> bool:
    return (
        key.startswith("spark.kubernetes.executor.volumes.persistentVolumeClaim.")
        and key.endswith(".options.claimName")
        and value == ON_DEMAND_CLAIM
    )


def _read_template(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    loaded = yaml.safe_load(Path(path).read_text())
    if not isinstance(loaded, dict):
        raise ValueError(f"{TEMPLATE_KEY}: {path} does not hold a pod (a YAML mapping)")
    return loaded


def _write_template(template: dict[str, Any]) -> Path:
    """A file of this process's own: the pod's `/tmp`, which only this driver writes."""
    handle, name = tempfile.mkstemp(prefix="dstream-executor-pod-", suffix=".yaml")
    with os.fdopen(handle, "w") as out:
        yaml.safe_dump(template, out, sort_keys=False)
    return Path(name)
