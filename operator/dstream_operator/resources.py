"""The Kubernetes objects a StreamingJob consists of, as pure functions of its validated spec.

Every object carries the `dstream.dev/job` label and an ownerReference to the StreamingJob, so
deleting the job lets the garbage collector delete them; executors are owned by the driver pod
(Spark sets that up from `spark.kubernetes.driver.pod.name`) and go with it.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Literal

import yaml
from dstream.spec import API_VERSION, KIND, StreamingJob, Volume, secret_env

from dstream_operator.status import SPEC_HASH_ANNOTATION

JOB_LABEL = "dstream.dev/job"
ROLE_LABEL = "dstream.dev/role"

API_PORT = 8000
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
# The API server as seen from a driver pod; clusters without DNS (or kube-proxy) pass another.
DEFAULT_API_SERVER = "https://kubernetes.default.svc"
JOB_DIR = "/etc/dstream"
JOB_FILE = f"{JOB_DIR}/job.yaml"
# The driver API's token: the pod's own ServiceAccount token (mounted by Kubernetes, rotated in
# place, re-read by the API on every request). Whoever holds it can already delete the driver
# pod, so stopping the driver through its API grants nothing more, and the operator needs no
# access to Secrets.
API_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
IMAGE_UID = IMAGE_GID = 185  # the image's user and group (Spark's convention)

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


def driver_name(job: str) -> str:
    """Name of the driver pod, and of its ServiceAccount, Role and RoleBinding."""
    return f"{job}-driver"


def service_name(job: str) -> str:
    return dns_label(f"{job}-driver")


def config_map_name(job: str) -> str:
    return f"{job}-job"


def cleanup_pod_name(job: str) -> str:
    return f"{job}-checkpoint-cleanup"


def executor_pod_prefix(job: str) -> str:
    """Spark requires the prefix of `<prefix>-exec-<n>` to be a DNS label of at most 47 chars."""
    return dns_label(job, 47)


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


def service_account(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(driver_name(owner.name), owner, "driver"),
    }


def role(owner: Owner) -> dict[str, Any]:
    """What Spark's driver does in its namespace: executor pods, their services, config maps
    and on-demand volume claims. Nothing cluster-wide."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(driver_name(owner.name), owner, "driver"),
        "rules": [
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
            }
        ],
    }


def role_binding(owner: Owner) -> dict[str, Any]:
    name = driver_name(owner.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(name, owner, "driver"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
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
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(config_map_name(owner.name), owner, "driver"),
        "data": {"job.yaml": yaml.safe_dump(job_manifest(job), sort_keys=False)},
    }


def service(owner: Owner) -> dict[str, Any]:
    """Headless, and publishing not-ready addresses: executors must reach the driver while it
    starts, before its readiness probe passes."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(owner.name), owner, "driver"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: owner.name, ROLE_LABEL: "driver"},
            "ports": [
                {"name": "spark-driver", "port": DRIVER_PORT, "targetPort": DRIVER_PORT},
                {
                    "name": "spark-blockmanager",
                    "port": BLOCK_MANAGER_PORT,
                    "targetPort": BLOCK_MANAGER_PORT,
                },
                {"name": "http-api", "port": API_PORT, "targetPort": API_PORT},
            ],
        },
    }


def children(job: StreamingJob, owner: Owner) -> list[dict[str, Any]]:
    """Everything but the driver pod, in creation order (RBAC before what needs it)."""
    return [
        service_account(owner),
        role(owner),
        role_binding(owner),
        config_map(job, owner),
        service(owner),
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
OPERATOR_ONLY_FIELDS = ("suspend", "restartPolicy")


def driver_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The part of a manifest's spec that the driver runs on."""
    kept = {k: v for k, v in spec.items() if k not in OPERATOR_ONLY_FIELDS}
    if isinstance(kept.get("checkpoint"), dict):
        kept["checkpoint"] = {
            k: v for k, v in kept["checkpoint"].items() if k != "deleteOnJobDeletion"
        }
    return kept


def restart_fields(old_spec: dict[str, Any], new_spec: dict[str, Any]) -> list[str]:
    """Top-level spec fields whose change needs a new driver, in name order."""
    old, new = driver_spec(old_spec), driver_spec(new_spec)
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))


def spec_hash(job: StreamingJob) -> str:
    """Fingerprint of what the driver runs; the driver pod carries it, so a driver running an
    outdated spec is recognised even after the operator itself was down during the change."""
    text = yaml.safe_dump(driver_spec(job_manifest(job)["spec"]), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def grace_seconds(job: StreamingJob) -> int:
    """Time for a graceful stop: the driver finishes the batches already planned (it gives them
    up to 10 intervals) and the one in flight, and commits them."""
    return max(30, math.ceil(12 * job.spec.batch_interval_ms / 1000))


def spark_conf(job: StreamingJob, owner: Owner, driver_host: DriverHost) -> dict[str, str]:
    """Spark's Kubernetes client-mode settings for this job; the user's sparkConf comes last
    and wins."""
    spec = job.spec
    host = (
        "$(POD_IP)"
        if driver_host == "pod-ip"
        else f"{service_name(owner.name)}.{owner.namespace}.svc"
    )
    conf = {
        "spark.submit.deployMode": "client",
        "spark.driver.host": host,
        "spark.driver.bindAddress": "$(POD_IP)",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.driver.cores": str(spec.driver.cores),
        "spark.driver.memory": spec.driver.memory,
        "spark.kubernetes.namespace": owner.namespace,
        "spark.kubernetes.container.image": spec.image,
        "spark.kubernetes.container.image.pullPolicy": spec.image_pull_policy,
        "spark.kubernetes.driver.pod.name": driver_name(owner.name),
        "spark.kubernetes.executor.podNamePrefix": executor_pod_prefix(owner.name),
        f"spark.kubernetes.executor.label.{JOB_LABEL}": owner.name,
        f"spark.kubernetes.executor.label.{ROLE_LABEL}": "executor",
        "spark.executor.instances": str(spec.executor.instances),
        "spark.executor.cores": str(spec.executor.cores),
        "spark.executor.memory": spec.executor.memory,
        "spark.speculation": str(spec.speculation.enabled).lower(),
        "spark.speculation.multiplier": str(spec.speculation.multiplier),
        "spark.speculation.quantile": str(spec.speculation.quantile),
    }
    for volume in spec.volumes:
        conf |= _executor_volume_conf(volume)
    conf |= _executor_secret_conf(job)
    return conf | spec.spark_conf


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
    job: StreamingJob, owner: Owner, driver_host: DriverHost, api_server: str = DEFAULT_API_SERVER
) -> list[str]:
    """The fixed driver CLI contract: job file, API port, master, API host, then
    `--conf key=value`s. The API listens on every interface (probes, the operator, Prometheus),
    which the driver allows only with a token (API_TOKEN_FILE)."""
    args = [JOB_FILE, "--port", str(API_PORT), "--master", f"k8s://{api_server}"]
    args += ["--host", "0.0.0.0"]
    for key, value in spark_conf(job, owner, driver_host).items():
        args += ["--conf", f"{key}={value}"]
    return args


def driver_pod(
    job: StreamingJob, owner: Owner, driver_host: DriverHost, api_server: str = DEFAULT_API_SERVER
) -> dict[str, Any]:
    """The driver pod. Its restartPolicy is Never: the operator, not the kubelet, applies the
    job's restartPolicy, so restarts are counted and backed off. A startup probe gives a
    recovering driver time to replay its checkpoint before liveness checks begin."""
    spec = job.spec
    name = driver_name(owner.name)
    user_volumes, user_mounts = _user_volumes(job)
    memory = f"{pod_memory_mib(spec.driver.memory)}Mi"
    metadata = _metadata(name, owner, "driver")
    metadata["annotations"] = {SPEC_HASH_ANNOTATION: spec_hash(job)}
    container = {
        "name": "driver",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "dstream.service.driver"],
        "args": driver_args(job, owner, driver_host, api_server),
        "env": [
            _field_env("POD_IP", "status.podIP"),
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            {"name": "DSTREAM_API_TOKEN_FILE", "value": API_TOKEN_FILE},
            *_secret_env(job),
        ],
        "ports": [
            {"name": "http-api", "containerPort": API_PORT},
            {"name": "spark-driver", "containerPort": DRIVER_PORT},
            {"name": "spark-blockmgr", "containerPort": BLOCK_MANAGER_PORT},
        ],
        "resources": {
            "requests": {"cpu": str(spec.driver.cores), "memory": memory},
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
            "serviceAccountName": name,
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


def cleanup_pod(job: StreamingJob, owner: Owner, checkpoint: str) -> dict[str, Any]:
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
                    "image": job.spec.image,
                    "imagePullPolicy": job.spec.image_pull_policy,
                    "command": ["rm", "-rf", "--", checkpoint],
                    "volumeMounts": user_mounts,
                    "securityContext": _container_security(),
                }
            ],
            "volumes": user_volumes,
        },
    }
