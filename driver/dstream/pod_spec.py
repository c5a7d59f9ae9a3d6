"""Pod customisation of a job's driver and executors: the first-class fields and the pod template.

The template has the shape of Kubernetes' core/v1 Pod (metadata and spec) as of 1.20: every PodSpec
and Container field is named and its scalar type checked (by pydantic, and by the CRD schema that
is generated from these classes); the deeper structures (probes, volumes, affinity, security
contexts, resources) are left free-form, because the API server validates them in full when the
pod is created and a complete PodSpec schema would make the CRD too large to store twice.
Unknown field names are rejected by `dstream run` and the operator, and pruned by the API server
(Kubernetes 1.20 has no server-side field validation).

Only `dstream.spec` is imported by the operator; it re-exports what it needs from here.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A CPU quantity: whole cores, decimal cores or millicores ("2", "1.5", "1500m").
CPU_PATTERN = r"^([1-9][0-9]*|[0-9]+\.[0-9]+|[1-9][0-9]*m)$"

FreeForm = dict[str, Any]  # checked by the API server when the pod is created


class PodModel(BaseModel):
    """camelCase names as in the Kubernetes API; unknown fields are rejected (typos)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class EnvVar(PodModel):
    name: str = Field(min_length=1)
    value: str | None = None
    value_from: FreeForm | None = None


class KeyRef(PodModel):
    name: str = Field(min_length=1)
    optional: bool | None = None


class EnvFromSource(PodModel):
    prefix: str | None = None
    config_map_ref: KeyRef | None = None
    secret_ref: KeyRef | None = None


class Toleration(PodModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class LocalObjectReference(PodModel):
    name: str = Field(min_length=1)


class ContainerTemplate(PodModel):
    """A core/v1 Container. The one named `driver` (or `executor`) is merged into the container
    the operator (or Spark) generates; others are sidecars and need an image."""

    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    image: str | None = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    working_dir: str | None = None
    ports: list[FreeForm] | None = None
    env: list[EnvVar] | None = None
    env_from: list[EnvFromSource] | None = None
    resources: FreeForm | None = None
    volume_mounts: list[FreeForm] | None = None
    volume_devices: list[FreeForm] | None = None
    liveness_probe: FreeForm | None = None
    readiness_probe: FreeForm | None = None
    startup_probe: FreeForm | None = None
    lifecycle: FreeForm | None = None
    termination_message_path: str | None = None
    termination_message_policy: Literal["File", "FallbackToLogsOnError"] | None = None
    security_context: FreeForm | None = None
    stdin: bool | None = None
    stdin_once: bool | None = None
    tty: bool | None = None


class PodSpecTemplate(PodModel):
    """A partial core/v1 PodSpec (Kubernetes 1.20's fields)."""

    active_deadline_seconds: int | None = Field(None, ge=1)
    affinity: FreeForm | None = None
    automount_service_account_token: bool | None = None
    containers: list[ContainerTemplate] | None = None
    dns_config: FreeForm | None = None
    dns_policy: str | None = None
    enable_service_links: bool | None = None
    ephemeral_containers: list[FreeForm] | None = None
    host_aliases: list[FreeForm] | None = None
    host_ipc: bool | None = Field(None, alias="hostIPC")
    host_network: bool | None = None
    host_pid: bool | None = Field(None, alias="hostPID")
    hostname: str | None = None
    image_pull_secrets: list[LocalObjectReference] | None = None
    init_containers: list[ContainerTemplate] | None = None
    node_name: str | None = None
    node_selector: dict[str, str] | None = None
    overhead: FreeForm | None = None
    preemption_policy: str | None = None
    priority: int | None = None
    priority_class_name: str | None = None
    readiness_gates: list[FreeForm] | None = None
    restart_policy: str | None = None
    runtime_class_name: str | None = None
    scheduler_name: str | None = None
    security_context: FreeForm | None = None
    service_account: str | None = None
    service_account_name: str | None = None
    set_hostname_as_fqdn: bool | None = Field(None, alias="setHostnameAsFQDN")
    share_process_namespace: bool | None = None
    subdomain: str | None = None
    termination_grace_period_seconds: int | None = Field(None, ge=0)
    tolerations: list[Toleration] | None = None
    topology_spread_constraints: list[FreeForm] | None = None
    volumes: list[FreeForm] | None = None


class TemplateMetadata(PodModel):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class PodTemplate(PodModel):
    """A partial core/v1 Pod, merged under what the operator (driver) or Spark (executors)
    generates; see docs/job-spec.md, "Pod customisation on Kubernetes", for who owns which field."""

    metadata: TemplateMetadata | None = None
    spec: PodSpecTemplate | None = None


def cpu_cores(quantity: str) -> float:
    """Cores in a CPU quantity such as '2', '1.5' or '1500m'."""
    if not re.fullmatch(CPU_PATTERN, quantity):
        raise ValueError(f"not a CPU quantity: {quantity!r} (expected e.g. 2, 1.5, 1500m)")
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


class PodSettings(PodModel):
    """The common cases of pod customisation, shared by `driver` and `executor`; they win over
    the same fields in `podTemplate`."""

    service_account_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="Run as this ServiceAccount (e.g. one with workload-identity annotations); "
        "unset: the driver's own, created by the operator.",
    )
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: FreeForm | None = Field(None, description="A core/v1 Affinity.")
    priority_class_name: str | None = Field(None, pattern=NAME_PATTERN)
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    env_from: list[EnvFromSource] = Field(default_factory=list)
    cores_limit: str | None = Field(
        None, pattern=CPU_PATTERN, description="CPU limit, e.g. 2 or 1500m; unset: none."
    )
    cores_request: str | None = Field(
        None,
        pattern=CPU_PATTERN,
        description="CPU request, e.g. 250m, when the pod should reserve less (or more) than "
        "`cores`, as a mostly idle standby driver does; unset: `cores`.",
    )
    pod_template: PodTemplate | None = None

    @model_validator(mode="after")
    def _limit_covers_request(self) -> PodSettings:
        cores = getattr(self, "cores", None)
        if self.cores_limit is not None and cores is not None:
            if cpu_cores(self.cores_limit) < cores:
                raise ValueError(f"coresLimit {self.cores_limit} is below cores ({cores})")
        if self.cores_limit is not None and self.cores_request is not None:
            if cpu_cores(self.cores_limit) < cpu_cores(self.cores_request):
                raise ValueError(
                    f"coresLimit {self.cores_limit} is below coresRequest {self.cores_request}"
                )
        return self

    def customised(self) -> bool:
        """Whether any pod customisation field is set (beyond cores, memory, instances and the
        CPU request, which the pod's generated resources carry)."""
        fields = set(PodSettings.model_fields) - {"cores_request"}
        return bool(self.model_dump(exclude_defaults=True, include=fields))
