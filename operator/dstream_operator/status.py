"""What a StreamingJob's status says, and how it follows from its pods and its driver's API.

Everything here is pure: Kubernetes objects and driver reports in, a `JobStatus` out. The CRD's
status schema is generated from `JobStatus`, so the operator cannot write a field the API server
would prune.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Phase = Literal["Pending", "Starting", "Running", "Recovering", "Suspended", "Failed"]
PHASES: tuple[Phase, ...] = ("Pending", "Starting", "Running", "Recovering", "Suspended", "Failed")

STOP_REASON_ANNOTATION = "dstream.dev/stop-reason"
SPEC_HASH_ANNOTATION = "dstream.dev/spec-hash"

# The driver API's `state` values that name a phase of their own; the others follow the pod.
_DRIVER_STATE_PHASE: dict[str, Phase] = {
    "starting": "Starting",
    "recovering": "Recovering",
    "running": "Running",
}


class StatusModel(BaseModel):
    """camelCase on the wire like every Kubernetes status."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class Condition(StatusModel):
    """A Kubernetes-style condition; its transition time only moves when its status flips."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: datetime | None = None


class Executors(StatusModel):
    ready: int = Field(0, ge=0)
    desired: int = Field(0, ge=0)


class DriverRoles(StatusModel):
    """The two driver pods of a job with `driver.standby`: who holds the job's Lease and leads,
    and who follows the checkpoint, ready to take over."""

    leader: str | None = None
    standby: str | None = None
    replacements: int = Field(
        0,
        ge=0,
        description="Pods of the two replaced while the other lived, since the last replacement "
        "older than restartPolicy.resetAfterSeconds; from the second on, a replacement waits "
        "the restart backoff, so a pod that keeps dying is not recreated in a tight loop.",
    )
    last_replaced_time: datetime | None = None


class JobStatus(StatusModel):
    """`.status` of a StreamingJob, as the operator writes it."""

    phase: Phase | None = None
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = Field(None, description="The spec generation acted upon.")
    driver_pod: str | None = None
    driver: DriverRoles | None = Field(
        None, description="With driver.standby: the leading and the standing-by driver pods."
    )
    executors: Executors | None = None
    restarts: int = Field(0, ge=0, description="Driver restarts after failures or losses.")
    driver_attempts: int = Field(
        0,
        ge=0,
        description="Driver pods created for this job so far; the next one is named "
        "<job>-driver-<driverAttempts + 1>.",
    )
    next_restart_time: datetime | None = Field(
        None, description="When the operator will start the next driver (restart backoff)."
    )
    last_transition_time: datetime | None = Field(None, description="When the phase last changed.")
    message: str | None = None
    last_batch_time: datetime | None = None
    processing_delay_seconds: float | None = None
    scheduling_delay_seconds: float | None = None
    total_delay_seconds: float | None = None
    rate_limit: float | None = Field(
        None, description="Records per second the next batch may admit, over all sources."
    )
    lag_records: int | None = Field(
        None,
        ge=0,
        description="Records the sources offer that no batch has admitted yet, over all sources.",
    )
    stable_spec: str | None = Field(
        None, description="The last spec whose driver committed a batch (YAML), for rollbacks."
    )
    stable_spec_hash: str | None = None
    upgrade_failures: int = Field(
        0, ge=0, description="Failures of the current spec's drivers before any committed."
    )
    rolled_back_from: str | None = Field(
        None,
        description="Hash of the spec the operator rolled back from; the job runs stableSpec "
        "until the spec changes.",
    )

    def to_patch(self) -> dict[str, Any]:
        """The status as a JSON merge patch: the supervisor writes all of it, observedGeneration
        included (the generation of the spec its step acted on), in one request.

        Unset top-level fields are sent as null, which a merge patch deletes; nested values carry
        no nulls, which the API server would reject where the schema says string or number.
        """
        values = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        aliases = {field.alias or name for name, field in type(self).model_fields.items()}
        return {alias: values.get(alias) for alias in sorted(aliases)}


@dataclass(frozen=True)
class PodFacts:
    """What the operator needs to know about one pod, read from the pod object."""

    name: str
    uid: str | None  # tells a driver pod from the next one of the same name
    phase: str
    ready: bool
    scheduled: bool
    deleting: bool
    stop_reason: str | None
    spec_hash: str | None
    reason: str | None
    message: str | None
    exit_code: int | None
    owner_uid: str | None  # of the StreamingJob that controls the pod
    ip: str | None = None  # status.podIP, once it has one

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def alive(self) -> bool:
        """Running or about to: neither ended nor on its way out."""
        return not self.terminal and not self.deleting

    @property
    def retiring(self) -> bool:
        """Stopped by the operator (or its end handled) and on its way out: the driver it was
        has been dealt with, and its replacement need not wait for the pod to go."""
        return self.stop_reason is not None and self.deleting

    def describe_end(self) -> str:
        """A one-line account of why the pod ended, for events and status messages."""
        parts = [f"driver pod {self.name} {self.phase.lower()}"]
        if self.reason:
            parts.append(f"reason {self.reason}")
        if self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        text = ", ".join(parts)
        return f"{text}: {self.message}" if self.message else text


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """Condense a pod object; the first terminated container explains a failed pod."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    terminated = _first_terminated(status)
    annotations = metadata.get("annotations") or {}
    return PodFacts(
        name=metadata.get("name", ""),
        uid=metadata.get("uid"),
        phase=status.get("phase") or "Pending",
        ready=conditions.get("Ready") == "True",
        scheduled=conditions.get("PodScheduled") == "True",
        deleting=metadata.get("deletionTimestamp") is not None,
        stop_reason=annotations.get(STOP_REASON_ANNOTATION),
        spec_hash=annotations.get(SPEC_HASH_ANNOTATION),
        reason=(terminated or {}).get("reason") or status.get("reason"),
        message=(terminated or {}).get("message") or status.get("message"),
        exit_code=(terminated or {}).get("exitCode"),
        ip=status.get("podIP"),
        owner_uid=next(
            (
                ref.get("uid")
                for ref in metadata.get("ownerReferences") or []
                if ref.get("controller")
            ),
            None,
        ),
    )


def _first_terminated(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return terminated
    return None


@dataclass(frozen=True)
class DriverReport:
    """The parts of the driver's `GET /v1/status` that go into the job status."""

    state: str
    last_batch_time: datetime | None
    processing_seconds: float | None
    scheduling_delay_seconds: float | None
    total_delay_seconds: float | None
    rate_limit: float | None
    lag_records: int | None


def _total(values: list[Any]) -> Any:
    """The sum over sources, or None when any source cannot tell (unlimited, unknown lag)."""
    return sum(values) if values and None not in values else None


def driver_report(document: Mapping[str, Any]) -> DriverReport:
    """Read the driver API's status document; a source without a limit makes the total
    unlimited, and one that cannot tell its lag makes the total unknown."""
    last = document.get("lastBatch") or {}
    limits = list((document.get("rateLimit") or {}).values())
    lags = list((document.get("backlog") or {}).values())
    return DriverReport(
        state=str(document.get("state", "")),
        last_batch_time=datetime.fromisoformat(last["time"]) if last.get("time") else None,
        processing_seconds=last.get("processingSeconds"),
        scheduling_delay_seconds=last.get("schedulingDelaySeconds"),
        total_delay_seconds=last.get("totalDelaySeconds"),
        rate_limit=None if (limit := _total(limits)) is None else float(limit),
        lag_records=_total(lags),
    )


def running_phase(driver: PodFacts, restarts: int, report: DriverReport | None) -> Phase:
    """The phase while a driver pod exists: its readiness, refined by what the driver reports."""
    if not driver.scheduled and driver.phase == "Pending":
        return "Pending"
    if not driver.ready:
        return "Recovering" if restarts else "Starting"
    if report is not None and report.state in _DRIVER_STATE_PHASE:
        return _DRIVER_STATE_PHASE[report.state]
    return "Running"


def with_phase(status: JobStatus, phase: Phase, message: str | None, now: datetime) -> JobStatus:
    """Set the phase and message; the transition time moves only when the phase changes."""
    moved = status.phase != phase
    return status.model_copy(
        update={
            "phase": phase,
            "message": message,
            "last_transition_time": now if moved else status.last_transition_time,
        }
    )


def with_driver(
    status: JobStatus,
    driver: PodFacts | None,
    executors_ready: int,
    executors_desired: int,
    report: DriverReport | None,
    now: datetime,
) -> JobStatus:
    """Driver pod, executor counts, conditions and the driver's batch figures."""
    driver_ready = driver is not None and driver.ready
    status = with_condition(
        status,
        "DriverReady",
        driver_ready,
        "PodReady" if driver_ready else ("PodNotReady" if driver else "NoDriverPod"),
        f"driver pod {driver.name} is {driver.phase}" if driver else "no driver pod",
        now,
    )
    status = with_condition(
        status,
        "ExecutorsReady",
        executors_ready >= executors_desired,
        "AllReady" if executors_ready >= executors_desired else "NotAllReady",
        f"{executors_ready} of {executors_desired} executors ready",
        now,
    )
    update: dict[str, Any] = {
        "driver_pod": driver.name if driver else None,
        "executors": Executors(ready=executors_ready, desired=executors_desired),
    }
    if report is not None:
        update |= {
            "last_batch_time": report.last_batch_time,
            "processing_delay_seconds": report.processing_seconds,
            "scheduling_delay_seconds": report.scheduling_delay_seconds,
            "total_delay_seconds": report.total_delay_seconds,
            "rate_limit": report.rate_limit,
            "lag_records": report.lag_records,
        }
    return status.model_copy(update=update)


def with_condition(
    status: JobStatus, kind: str, true: bool, reason: str, message: str, now: datetime
) -> JobStatus:
    """Set one condition, in its place among the others (or last when new); its transition
    time moves only when its status flips."""
    value: Literal["True", "False"] = "True" if true else "False"
    previous = next((c for c in status.conditions if c.type == kind), None)
    since = previous.last_transition_time if previous and previous.status == value else now
    new = Condition(
        type=kind, status=value, reason=reason, message=message, last_transition_time=since
    )
    conditions = [new if c.type == kind else c for c in status.conditions]
    if previous is None:
        conditions.append(new)
    return status.model_copy(update={"conditions": conditions})
