"""The Kubernetes objects a StreamingJob consists of, as pure functions of its validated spec.

Every object carries the `dstream.dev/job` label and an ownerReference to the StreamingJob, so
deleting the job lets the garbage collector delete them; executors are owned by the driver pod
and go with it (the driver adds itself to their pod template as their owner, dstream's
`service/executor_owner.py`: Spark's own way, `spark.kubernetes.driver.pod.name`, would first
wait a second for a pod that turns ready only after its first batch).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Literal

import yaml
from dstream.spec import API_VERSION, KIND, PodSettings, StreamingJob, Volume, secret_env

from dstream_operator.pod_merge import merge_under
from dstream_operator.status import SPEC_HASH_ANNOTATION

JOB_LABEL = "dstream.dev/job"
ROLE_LABEL = "dstream.dev/role"

API_PORT = 8000
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
# The API server as seen from a driver pod; clusters without DNS (or kube-proxy) pass another.
DEFAULT_API_SERVER = "https://kubernetes.default.svc"
UI_PORT = 4040  # Spark's web UI
JOB_DIR = "/etc/dstream"
JOB_FILE = f"{JOB_DIR}/job.yaml"
EXECUTOR_TEMPLATE_KEY = "executor-pod-template.yaml"  # in the job's ConfigMap, beside job.yaml
DRIVER_CONTAINER = "driver"
EXECUTOR_CONTAINER = "executor"  # the container of the executor template that Spark fills in
# The driver API's token: the pod's own ServiceAccount token (mounted by Kubernetes, rotated in
# place, re-read by the API on every request). Whoever holds it can already delete the driver
# pod, so stopping the driver through its API grants nothing more, and the operator needs no
# access to Secrets.
API_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
IMAGE_UID = IMAGE_GID = 185  # the image's user and group (Spark's convention)
# The image of this operator's own version, as the project builds and tags it (`dstream:` and
# the package version: the Dockerfile, the chart's appVersion, e2e/image/build.sh). A job that
# names no image runs the operator's image: this one, or what `--image` says (the chart passes
# the image the operator itself runs), so the operator and its drivers are one version.
OWN_IMAGE = f"dstream:{importlib.metadata.version('dstream')}"

DriverHost = Literal["service", "pod-ip"]

_MEMORY_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


@dataclass(frozen=True)
class Owner:
    """The StreamingJob that owns the objects: enough to write an ownerReference."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def dns_label(text: str, limit: int = 63) -> str:
    """A DNS-1035 label (starts with a letter, at most `limit` chars) that stays unique."""
    label = text if text[:1].isalpha() else f"sj-{text}"
    if len(label) <= limit:
        return label
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{label[: limit - 9].rstrip('-')}-{digest}"


def driver_name(job: str, attempt: int) -> str:
    """The job's `attempt`-th driver pod (counted from 1 over the job's life, `status.driverAttempts`).
    A name per attempt lets a lost driver's replacement start while the old pod is still
    stopping; the operator finds a job's driver pods by their labels, never by name."""
    return f"{job}-driver-{attempt}"


def driver_attempt(job: str, pod: str) -> int | None:
    """The attempt a driver pod's name carries (`driver_name`); None for another name (a pod of
    an operator from before names per attempt: `<job>-driver`)."""
    suffix = pod.removeprefix(f"{job}-driver-")
    return int(suffix) if suffix != pod and suffix.isdigit() else None


def driver_pod_count(job: StreamingJob) -> int:
    """The live driver pods the job runs: one, or two with `driver.standby`."""
    return 2 if job.spec.driver.standby else 1


def lease_name(job: str) -> str:
    """The coordination.k8s.io/v1 Lease that elects the leader of a standby job's drivers."""
    return f"{job}-driver"


def lease_identity(pod: str, uid: str | None) -> str:
    """How a driver pod names itself as the holder of its job's Lease (kube_lease.identity)."""
    return f"{pod}/{uid}"


def service_name(job: str) -> str:
    return dns_label(f"{job}-driver")


def config_map_name(job: str) -> str:
    return f"{job}-job"


def cleanup_pod_name(job: str) -> str:
    return f"{job}-checkpoint-cleanup"


def executor_pod_prefix(driver_pod: str) -> str:
    """Spark requires the prefix of `<prefix>-exec-<n>` to be a DNS label of at most 47 chars.
    Every driver pod names its executors after itself: two drivers' executors run side by side
    (a standby job's pair, or a lost driver's and its replacement's while the old one stops)."""
    return dns_label(driver_pod, 47)


def executors_of(driver_pod: str, executors: dict[str, bool]) -> dict[str, bool]:
    """Of the job's executor pods (name -> ready), those of one of its driver pods."""
    prefix = f"{executor_pod_prefix(driver_pod)}-exec-"
    return {name: ready for name, ready in executors.items() if name.startswith(prefix)}


def labels(job: str, role: str) -> dict[str, str]:
    return {
        JOB_LABEL: job,
        ROLE_LABEL: role,
        "app.kubernetes.io/name": "dstream",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/component": role,
        "app.kubernetes.io/managed-by": "dstream-operator",
    }


def _metadata(name: str, owner: Owner, role: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner.name, role),
        "ownerReferences": [owner.reference()],
    }


# The ServiceAccount, Role and RoleBinding that every driver of a namespace runs as (see
# `driver_identity`).
DRIVER_ACCOUNT = "dstream-driver"


def driver_rules() -> list[dict[str, Any]]:
    """What Spark's driver does in its namespace: executor pods, their services, config maps
    and on-demand volume claims; the Lease through which a `driver.standby` job's two drivers
    elect their leader. Nothing cluster-wide. The one place the driver's rights are written:
    the shared Role grants them, and the chart's ClusterRole must hold them too."""
    return [
        {
            "apiGroups": [""],
            "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
            "verbs": [
                "get",
                "list",
                "watch",
                "create",
                "update",
                "patch",
                "delete",
                "deletecollection",
            ],
        },
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "patch"],
        },
    ]


def _identity_metadata(namespace: str) -> dict[str, Any]:
    """Owned by no job: the identity outlives each of them, like a namespace's `default`."""
    return {
        "name": DRIVER_ACCOUNT,
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/name": "dstream",
            "app.kubernetes.io/component": "driver",
            "app.kubernetes.io/managed-by": "dstream-operator",
        },
    }


def role(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _identity_metadata(namespace),
        "rules": driver_rules(),
    }


def driver_identity(namespace: str) -> list[dict[str, Any]]:
    """The ServiceAccount every driver of the namespace runs as, with its Role and RoleBinding.

    One per namespace, not one per job: on Kubernetes before 1.21 the token controller must
    write a token Secret for a new ServiceAccount before the API server admits a pod that runs
    as it, which made each new job wait for it (docs/operator-scale.md). A per-job account
    isolated nothing: the driver's Role lets it create pods, so it can run a pod as any
    account of its namespace."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _identity_metadata(namespace),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": DRIVER_ACCOUNT,
        },
        "subjects": [{"kind": "ServiceAccount", "name": DRIVER_ACCOUNT, "namespace": namespace}],
    }
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _identity_metadata(namespace),
    }
    return [account, role(namespace), binding]


def driver_service_account(job: StreamingJob) -> str:
    """The user's `driver.serviceAccountName`, or the namespace's shared one."""
    return job.spec.driver.service_account_name or DRIVER_ACCOUNT


def role_binding_name(job: str) -> str:
    return f"{job}-driver-account"


def role_binding(job: StreamingJob, owner: Owner) -> dict[str, Any] | None:
    """The shared driver Role for the user's own ServiceAccount (say, one with
    workload-identity annotations), so it gets what Spark's driver needs without further
    set-up; None when the driver runs as the shared account, already bound."""
    account = job.spec.driver.service_account_name
    if account is None:
        return None
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(role_binding_name(owner.name), owner, "driver"),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": DRIVER_ACCOUNT,
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": owner.namespace}],
    }


def job_manifest(job: StreamingJob) -> dict[str, Any]:
    """The manifest the driver reads: the user's spec as written, without cluster metadata."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": job.metadata.name, "namespace": job.metadata.namespace},
        "spec": job.spec.model_dump(mode="json", by_alias=True, exclude_unset=True),
    }


def config_map(job: StreamingJob, owner: Owner) -> dict[str, Any]:
    """The job manifest, and the executors' pod template when the spec customises them."""
    data = {"job.yaml": yaml_text(job_manifest(job), sort_keys=False)}
    template = executor_pod_template(job)
    if template is not None:
        data[EXECUTOR_TEMPLATE_KEY] = yaml_text(template, sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(config_map_name(owner.name), owner, "driver"),
        "data": data,
    }


def service(owner: Owner, standby: bool = False) -> dict[str, Any]:
    """Headless, selecting the job's driver pods by label, for the driver's API (the operator
    with `--driver-host service`, Prometheus) and UI; executors reach their own driver at its
    pod IP (`spark_conf`). It publishes not-ready addresses, so the API answers while a driver
    starts (a driver is ready once it has completed a batch). With a standby it points at the
    leader only, the one ready pod: a standby never completes a batch."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(owner.name), owner, "driver"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": not standby,
            "selector": {JOB_LABEL: owner.name, ROLE_LABEL: "driver"},
            "ports": [
                {"name": "spark-driver", "port": DRIVER_PORT, "targetPort": DRIVER_PORT},
                {
                    "name": "spark-blockmanager",
                    "port": BLOCK_MANAGER_PORT,
                    "targetPort": BLOCK_MANAGER_PORT,
                },
                {"name": "http-api", "port": API_PORT, "targetPort": API_PORT},
                {"name": "http-spark-ui", "port": UI_PORT, "targetPort": UI_PORT},
            ],
        },
    }


# PodDisruptionBudget: policy/v1 from Kubernetes 1.21 (and the only one from 1.25),
# policy/v1beta1 before; the operator uses the one the cluster serves (`Kube.serves`).
POLICY_VERSIONS = ("policy/v1", "policy/v1beta1")


def disruption_budget_name(job: str, role: str) -> str:
    return dns_label(f"{job}-{role}", 253)


DISRUPTED_ROLES = ("driver", "executor")


def disruption_budget(
    job: StreamingJob, owner: Owner, role: str, policy_version: str
) -> dict[str, Any] | None:
    """The PodDisruptionBudget of the job's drivers or executors; None when disabled.

    Kubernetes honours `maxUnavailable` only for pods whose controller has a scale subresource
    (a Deployment, a StatefulSet); for other pods, such as ours, the disruption controller
    cannot count the expected pods and refuses every eviction. So the budget is written as the
    equivalent `minAvailable`: the role's pod count less the job's `maxUnavailable`. A job with
    a standby has two drivers, and by default keeps one of them through any drain; as only the
    leader is ready (see `service`), that one is the leader, and a drain evicts the standby."""
    settings = job.spec.driver if role == "driver" else job.spec.executor
    if not settings.disruption_budget.enabled:
        return None
    pods = driver_pod_count(job) if role == "driver" else job.spec.executor.instances
    return {
        "apiVersion": policy_version,
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(disruption_budget_name(owner.name, role), owner, role),
        "spec": {
            "minAvailable": max(0, pods - settings.disruption_budget.max_unavailable),
            "selector": {"matchLabels": {JOB_LABEL: owner.name, ROLE_LABEL: role}},
        },
    }


@dataclass(frozen=True)
class UiIngress:
    """An Ingress per job for its Spark UI, at a host of its own (the UI serves from `/`)."""

    host: str  # may hold {job} and {namespace}
    class_name: str | None = None
    annotations: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Platform:
    """What shapes a job's objects beyond its spec: the cluster's API versions and the
    operator's own configuration."""

    policy_version: str = POLICY_VERSIONS[0]
    ui_ingress: UiIngress | None = None


def ui_ingress(owner: Owner, settings: UiIngress) -> dict[str, Any]:
    """networking.k8s.io/v1 (served from Kubernetes 1.19) to the driver Service's UI port."""
    metadata = _metadata(service_name(owner.name), owner, "driver")
    if settings.annotations:
        metadata["annotations"] = dict(settings.annotations)
    backend = {"service": {"name": service_name(owner.name), "port": {"number": UI_PORT}}}
    spec: dict[str, Any] = {
        "rules": [
            {
                "host": settings.host.format(job=owner.name, namespace=owner.namespace),
                "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]},
            }
        ]
    }
    if settings.class_name:
        spec["ingressClassName"] = settings.class_name
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": metadata,
        "spec": spec,
    }


def children(job: StreamingJob, owner: Owner, platform: Platform) -> list[dict[str, Any]]:
    """Everything but the driver pod and the namespace's driver identity (see
    `supervisor.apply_children` for the order)."""
    budgets = (disruption_budget(job, owner, r, platform.policy_version) for r in DISRUPTED_ROLES)
    ingress = [ui_ingress(owner, platform.ui_ingress)] if platform.ui_ingress else []
    standby = job.spec.driver.standby
    return [
        config_map(job, owner),
        service(owner, standby),
        *filter(None, [role_binding(job, owner), *budgets]),
        *ingress,
    ]


def optional_children(owner: Owner, platform: Platform) -> list[tuple[str, str, str, str]]:
    """The children a job has or not by its spec or the operator's options (a user account's
    RoleBinding, the budgets, the UI Ingress), as (apiVersion, kind, namespace, name): those an
    earlier operator may have made that the job no longer has."""
    ns, job = owner.namespace, owner.name
    budgets = [disruption_budget_name(job, role) for role in DISRUPTED_ROLES]
    return [
        ("rbac.authorization.k8s.io/v1", "RoleBinding", ns, role_binding_name(job)),
        *((platform.policy_version, "PodDisruptionBudget", ns, name) for name in budgets),
        ("networking.k8s.io/v1", "Ingress", ns, service_name(job)),
    ]


def event(owner: Owner, type: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    """A core/v1 Event about the StreamingJob, as `kubectl describe sj` shows them."""
    stamp = now.isoformat().replace("+00:00", "Z")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{owner.name}.", "namespace": owner.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": owner.name,
            "namespace": owner.namespace,
            "uid": owner.uid,
        },
        "type": type,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": "dstream-operator"},
        "reportingComponent": "dstream-operator",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def driver_url(owner: Owner, pod_ip: str | None = None) -> str:
    """Where the operator reads the driver API: at the pod IP when given (clusters without
    DNS), else through the headless Service's DNS name."""
    host = pod_ip or f"{service_name(owner.name)}.{owner.namespace}.svc"
    return f"http://{host}:{API_PORT}"


def memory_mib(spark_memory: str) -> int:
    """Spark's `512m`/`2g` notation in MiB."""
    return math.ceil(int(spark_memory[:-1]) * _MEMORY_MIB[spark_memory[-1]])


def pod_memory_mib(spark_memory: str) -> int:
    """JVM heap plus Spark's non-JVM overhead (40%, at least 384 MiB): the Python driver or
    Python workers live in the same container as the JVM."""
    heap = memory_mib(spark_memory)
    return heap + max(384, math.ceil(heap * 0.4))


# Spec fields only the operator reads: changing them never restarts the driver.
OPERATOR_ONLY_FIELDS = ("suspend", "restartPolicy", "upgrade")


# Fields inside a block that only the operator reads.
OPERATOR_ONLY_MEMBERS = {
    "checkpoint": "deleteOnJobDeletion",
    "driver": "disruptionBudget",
    "executor": "disruptionBudget",
}


def driver_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The part of a manifest's spec that the driver runs on."""
    kept = {k: v for k, v in spec.items() if k not in OPERATOR_ONLY_FIELDS}
    for block, member in OPERATOR_ONLY_MEMBERS.items():
        if isinstance(kept.get(block), dict):
            kept[block] = {k: v for k, v in kept[block].items() if k != member}
            if not kept[block]:  # `executor: {}` is no executor block at all
                del kept[block]
    return kept


def restart_fields(old_spec: dict[str, Any], new_spec: dict[str, Any]) -> list[str]:
    """Top-level spec fields whose change needs a new driver, in name order."""
    old, new = driver_spec(old_spec), driver_spec(new_spec)
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))


def spec_hash(job: StreamingJob) -> str:
    """Fingerprint of what the driver runs; the driver pod carries it, so a driver running an
    outdated spec is recognised even after the operator itself was down during the change."""
    text = yaml_text(driver_spec(job_manifest(job)["spec"]), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def yaml_text(data: Any, sort_keys: bool) -> str:
    """`yaml.safe_dump` of JSON-like data, remembered by the data's JSON text. PyYAML's
    emitter is pure Python, a few milliseconds a document, and a new job's spec is dumped
    several times (its fingerprint for the step, for the driver pod and for the overridden
    fields, its manifest for the ConfigMap by the creation handler and the supervisor): most
    of those become a JSON dump and a lookup. The text is the same, so fingerprints of
    running drivers still match."""
    return _yaml_of_json(json.dumps(data), sort_keys)


@functools.lru_cache(maxsize=1024)
def _yaml_of_json(text: str, sort_keys: bool) -> str:
    return yaml.safe_dump(json.loads(text), sort_keys=sort_keys)


def grace_seconds(job: StreamingJob) -> int:
    """Time for a graceful stop: the driver finishes the batches already planned (it gives them
    up to 10 intervals) and the one in flight, and commits them."""
    return max(30, math.ceil(12 * job.spec.batch_interval_ms / 1000))


# The driver's setting that makes it elect through a Lease (dstream.runtime.leadership.lease.KUBE_LEASE_KEY;
# the operator does not import the engine).
KUBE_LEASE_KEY = "spark.dstream.lease.kubernetes"


def job_image(job: StreamingJob, image: str) -> str:
    """The job's own image, or else `image`, the operator's."""
    return job.spec.image or image


def spark_conf(
    job: StreamingJob, owner: Owner, pod: str | None = None, image: str = OWN_IMAGE
) -> dict[str, str]:
    """Spark's Kubernetes client-mode settings for this job's driver pod `pod` (the first
    attempt's by default), its executors running `job_image`; the user's sparkConf comes last
    and wins. Executors reach their
    driver at its pod IP, not through the Service: the Service may also hold a driver that is
    still stopping while its replacement starts, or a standby job's other driver. The two
    drivers of a standby job elect through the job's Lease."""
    spec = job.spec
    pod = pod or driver_name(owner.name, 1)
    conf = {
        "spark.submit.deployMode": "client",
        "spark.driver.host": "$(POD_IP)",
        "spark.driver.bindAddress": "$(POD_IP)",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.ui.port": str(UI_PORT),
        "spark.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.driver.cores": str(spec.driver.cores),
        "spark.driver.memory": spec.driver.memory,
        "spark.kubernetes.namespace": owner.namespace,
        "spark.kubernetes.container.image": job_image(job, image),
        "spark.kubernetes.container.image.pullPolicy": spec.image_pull_policy,
        "spark.kubernetes.executor.podNamePrefix": executor_pod_prefix(pod),
        f"spark.kubernetes.executor.label.{JOB_LABEL}": owner.name,
        f"spark.kubernetes.executor.label.{ROLE_LABEL}": "executor",
        # No ConfigMap of the driver's conf directory (the image has none) for each driver to
        # create and each executor pod to mount; mounted, that directory would head the
        # executors' class path, and their JVMs would refuse the class archive.
        "spark.kubernetes.executor.disableConfigMap": "true",
        "spark.executor.instances": str(spec.executor.instances),
        "spark.executor.cores": str(spec.executor.cores),
        "spark.executor.memory": spec.executor.memory,
        "spark.speculation": str(spec.speculation.enabled).lower(),
        "spark.speculation.multiplier": str(spec.speculation.multiplier),
        "spark.speculation.quantile": str(spec.speculation.quantile),
    }
    if spec.driver.standby:
        conf[KUBE_LEASE_KEY] = f"{owner.namespace}/{lease_name(owner.name)}"
    for volume in spec.volumes:
        conf |= _executor_volume_conf(volume)
    conf |= _executor_secret_conf(job)
    conf |= _executor_template_conf(job)
    return conf | spec.spark_conf


def _executor_template_conf(job: StreamingJob) -> dict[str, str]:
    """Spark's own pod-template support for the executors: in client mode the driver reads the
    template from its file system, the job's ConfigMap mounted at JOB_DIR."""
    executor = job.spec.executor
    conf = {}
    if executor_pod_template(job) is not None:
        conf["spark.kubernetes.executor.podTemplateFile"] = f"{JOB_DIR}/{EXECUTOR_TEMPLATE_KEY}"
        conf["spark.kubernetes.executor.podTemplateContainerName"] = EXECUTOR_CONTAINER
    if executor.cores_limit is not None:  # Spark sets the executor's CPU limit from this
        conf["spark.kubernetes.executor.limit.cores"] = executor.cores_limit
    if executor.cores_request is not None:  # and its CPU request from this
        conf["spark.kubernetes.executor.request.cores"] = executor.cores_request
    return conf


def _first_class_pod(settings: PodSettings, container: str) -> dict[str, Any]:
    """The part of a pod that the first-class fields (`driver.nodeSelector`, ...) describe."""
    fields = settings.model_dump(mode="json", by_alias=True, exclude_none=True)
    pod_fields = (
        "serviceAccountName",
        "nodeSelector",
        "tolerations",
        "affinity",
        "priorityClassName",
        "imagePullSecrets",
    )
    main: dict[str, Any] = {"name": container}
    main |= {key: fields[key] for key in ("env", "envFrom") if fields[key]}
    if settings.cores_limit is not None:
        main["resources"] = {"limits": {"cpu": settings.cores_limit}}
    pod: dict[str, Any] = {
        "spec": {key: fields[key] for key in pod_fields if fields.get(key)} | {"containers": [main]}
    }
    metadata = {key: fields[key] for key in ("labels", "annotations") if fields[key]}
    if metadata:
        pod["metadata"] = metadata
    return pod


def _customised(settings: PodSettings, container: str) -> tuple[dict[str, Any], list[str]]:
    """The pod template with the first-class fields laid over it, and the template paths they
    overrode."""
    template = (
        settings.pod_template.model_dump(mode="json", by_alias=True, exclude_none=True)
        if settings.pod_template is not None
        else {}
    )
    return merge_under(template, _first_class_pod(settings, container))


def executor_pod_template(job: StreamingJob) -> dict[str, Any] | None:
    """The executors' pod template for Spark, or None when the spec does not customise them.
    Spark owns what it generates (the executor container's command, image, ports, resources,
    Spark's labels) and lays it over this template."""
    if not job.spec.executor.customised():
        return None
    pod, _overridden = _customised(job.spec.executor, EXECUTOR_CONTAINER)
    return {"apiVersion": "v1", "kind": "Pod"} | pod


def _executor_secret_conf(job: StreamingJob) -> dict[str, str]:
    """Connector passwords into the executors' environment: Spark's executor pod builder adds
    `valueFrom.secretKeyRef` for each setting (in client mode too), so the Secret is read by
    the kubelet; neither the driver nor the operator needs RBAC on Secrets."""
    return {
        f"spark.kubernetes.executor.secretKeyRef.{env}": f"{ref.name}:{ref.key}"
        for env, ref in secret_env(job.spec).items()
    }


def _secret_env(job: StreamingJob) -> list[dict[str, Any]]:
    """The driver's side of the same: its pod is ours to build (client mode)."""
    return [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        for env, ref in secret_env(job.spec).items()
    ]


def _executor_volume_conf(volume: Volume) -> dict[str, str]:
    if volume.persistent_volume_claim is not None:
        prefix = f"spark.kubernetes.executor.volumes.persistentVolumeClaim.{volume.name}"
        claim = volume.persistent_volume_claim
        return {
            f"{prefix}.mount.path": volume.mount_path,
            f"{prefix}.mount.readOnly": str(claim.read_only).lower(),
            f"{prefix}.options.claimName": claim.claim_name,
        }
    assert volume.host_path is not None
    prefix = f"spark.kubernetes.executor.volumes.hostPath.{volume.name}"
    return {
        f"{prefix}.mount.path": volume.mount_path,
        f"{prefix}.options.path": volume.host_path.path,
    }


def _pod_volume(volume: Volume) -> dict[str, Any]:
    if volume.persistent_volume_claim is not None:
        claim = volume.persistent_volume_claim
        return {
            "name": volume.name,
            "persistentVolumeClaim": {"claimName": claim.claim_name, "readOnly": claim.read_only},
        }
    assert volume.host_path is not None
    return {"name": volume.name, "hostPath": {"path": volume.host_path.path}}


def _user_volumes(job: StreamingJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The spec's volumes and their mounts, shared by the driver and the cleanup pod."""
    volumes = [_pod_volume(v) for v in job.spec.volumes]
    mounts = [
        {
            "name": v.name,
            "mountPath": v.mount_path,
            "readOnly": bool(v.persistent_volume_claim and v.persistent_volume_claim.read_only),
        }
        for v in job.spec.volumes
    ]
    return volumes, mounts


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _pod_security() -> dict[str, Any]:
    """Name the user: with `runAsNonRoot` alone the kubelet must prove it from the image, and
    refuses to start an image whose USER is root, unset or a name (CreateContainerConfigError)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_GID,
        "fsGroup": IMAGE_GID,
    }


def _http_probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": API_PORT},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def driver_args(
    job: StreamingJob,
    owner: Owner,
    api_server: str = DEFAULT_API_SERVER,
    pod: str | None = None,
    image: str = OWN_IMAGE,
) -> list[str]:
    """The fixed driver CLI contract: job file, API port, master, API host, `--standby`, then
    `--conf key=value`s. Every driver pod is started `--standby`: it waits for its checkpoint's
    lead instead of refusing a checkpoint led by a live driver. A lost driver's replacement is
    created while the old pod may still be stopping (its pod has a name of its own), and takes
    over once that one lets go; a standby job's two drivers elect through the job's Lease.
    The API listens on every interface (probes, the operator, Prometheus), which the driver
    allows only with a token (API_TOKEN_FILE)."""
    args = [JOB_FILE, "--port", str(API_PORT), "--master", f"k8s://{api_server}"]
    args += ["--host", "0.0.0.0", "--standby"]
    for key, value in spark_conf(job, owner, pod, image).items():
        args += ["--conf", f"{key}={value}"]
    return args


def driver_pod(
    job: StreamingJob,
    owner: Owner,
    api_server: str = DEFAULT_API_SERVER,
    pod: str | None = None,
    image: str = OWN_IMAGE,
) -> dict[str, Any]:
    """The driver pod `pod` (the first attempt's by default; see `driver_name`): what the
    operator generates, laid over the job's pod customisation; `image` unless the job names
    its own."""
    return _driver_pod_and_overrides(job, owner, api_server, pod, image)[0]


def template_overrides(
    job: StreamingJob, owner: Owner, api_server: str = DEFAULT_API_SERVER
) -> list[str]:
    """The pod fields where the job's pod template or first-class fields asked for a value that
    the operator's own (or a first-class field's over a template's) replaced, for a warning
    Event: a job cannot change what the operator must own, such as the driver's command,
    ports, ownerReferences and the dstream.dev labels."""
    driver = _driver_pod_and_overrides(job, owner, api_server)[1]
    executor = _customised(job.spec.executor, EXECUTOR_CONTAINER)[1]
    return [f"driver pod {path}" for path in driver] + [f"executor pod {path}" for path in executor]


def _driver_pod_and_overrides(
    job: StreamingJob,
    owner: Owner,
    api_server: str,
    name: str | None = None,
    image: str = OWN_IMAGE,
) -> tuple[dict[str, Any], list[str]]:
    customised, by_fields = _customised(job.spec.driver, DRIVER_CONTAINER)
    generated = _generated_driver_pod(job, owner, api_server, name, image)
    pod, by_operator = merge_under(customised, generated)
    return pod, by_fields + by_operator


def _generated_driver_pod(
    job: StreamingJob, owner: Owner, api_server: str, name: str | None, image: str
) -> dict[str, Any]:
    """The driver pod as the operator needs it. Its restartPolicy is Never: the operator, not
    the kubelet, applies the job's restartPolicy, so restarts are counted and backed off. A
    startup probe gives a recovering driver time to replay its checkpoint before liveness
    checks begin."""
    spec = job.spec
    name = name or driver_name(owner.name, 1)
    user_volumes, user_mounts = _user_volumes(job)
    memory = f"{pod_memory_mib(spec.driver.memory)}Mi"
    metadata = _metadata(name, owner, "driver")
    metadata["annotations"] = {SPEC_HASH_ANNOTATION: spec_hash(job)}
    container = {
        "name": DRIVER_CONTAINER,
        "image": job_image(job, image),
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "dstream.service.driver"],
        "args": driver_args(job, owner, api_server, name, image),
        "env": [
            _field_env("POD_IP", "status.podIP"),
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_UID", "metadata.uid"),  # its identity in a Lease, its executors' owner
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            {"name": "DSTREAM_API_TOKEN_FILE", "value": API_TOKEN_FILE},
            *_secret_env(job),
        ],
        "ports": [
            {"name": "http-api", "containerPort": API_PORT},
            {"name": "spark-driver", "containerPort": DRIVER_PORT},
            {"name": "spark-blockmgr", "containerPort": BLOCK_MANAGER_PORT},
            {"name": "http-spark-ui", "containerPort": UI_PORT},
        ],
        "resources": {
            "requests": {
                "cpu": spec.driver.cores_request or str(spec.driver.cores),
                "memory": memory,
            },
            "limits": {"memory": memory},
        },
        "startupProbe": _http_probe("/healthz", period=5, failures=60),
        "livenessProbe": _http_probe("/healthz", period=10, failures=3),
        "readinessProbe": _http_probe("/readyz", period=5, failures=1),
        "volumeMounts": [
            {"name": "dstream-job", "mountPath": JOB_DIR, "readOnly": True},
            {"name": "dstream-tmp", "mountPath": "/tmp"},
            *user_mounts,
        ],
        "securityContext": _container_security(),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "serviceAccountName": driver_service_account(job),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace_seconds(job),
            "securityContext": _pod_security(),
            "containers": [container],
            "volumes": [
                {"name": "dstream-job", "configMap": {"name": config_map_name(owner.name)}},
                {"name": "dstream-tmp", "emptyDir": {}},
                *user_volumes,
            ],
        },
    }


def shared_checkpoint(job: StreamingJob) -> str | None:
    """The checkpoint directory if it lives strictly inside one of the job's volumes; a
    checkpoint anywhere else dies with the driver pod and needs no cleanup."""
    if job.spec.checkpoint is None:
        return None
    path = PurePosixPath(job.spec.checkpoint.path)
    if ".." in path.parts:
        return None
    for volume in job.spec.volumes:
        root = PurePosixPath(volume.mount_path)
        if path != root and path.is_relative_to(root):
            return str(path)
    return None


def cleanup_pod(
    job: StreamingJob, owner: Owner, checkpoint: str, image: str = OWN_IMAGE
) -> dict[str, Any]:
    """A one-off pod that deletes the checkpoint directory from the shared volume."""
    user_volumes, user_mounts = _user_volumes(job)
    if not re.fullmatch(r"/[^\0]+", checkpoint):
        raise ValueError(f"refusing to delete {checkpoint!r}")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(cleanup_pod_name(owner.name), owner, "cleanup"),
        "spec": {
            "restartPolicy": "Never",
            "securityContext": _pod_security(),
            "containers": [
                {
                    "name": "cleanup",
                    "image": job_image(job, image),
                    "imagePullPolicy": job.spec.image_pull_policy,
                    "command": ["rm", "-rf", "--", checkpoint],
                    "volumeMounts": user_mounts,
                    "securityContext": _container_security(),
                }
            ],
            "volumes": user_volumes,
        },
    }
