"""One supervision step for one job, as a pure function: what is seen in, what to do out.

The supervisor calls `plan` whenever a job or its pods change and on every poll tick. Being
level-triggered, the same observation always yields the same plan, so a missed event or an
operator restart costs nothing but a tick.

A job with `driver.standby` runs two driver pods; the job's Lease elects which one leads (the
drivers hold it themselves, runtime/kube_lease.py). The pair is planned as one driver, the
leader, with two differences: a pod that ends while the other lives is replaced, without
waiting for it to be gone, and counts no restart (the job did not stop: the survivor leads, or
goes on standing by), and a pod missing beside a live one is created, in both cases once the
survivor has completed a batch (not during a standby's takeover); except a pod of a changed
spec that has yet to commit a batch (while `upgrade.rollbackOnFailure` can go back): its end
is the job's failure, both restart, and the failures lead to a rollback as with one driver.
When both are gone the job's restartPolicy applies as to a single driver; a spec change or a
suspension stops both. A pod of the two that keeps dying is replaced under the restart backoff
from its second replacement on (`DriverRoles`).

Driver pods have a name per attempt (`<job>-driver-<n>`, resources.driver_name) and are told
apart by what they are, not by name: a pod the operator stopped, or whose end it handled, that
is still going away (`PodFacts.retiring`) is `stopping`, and no longer the job's driver. A lost
driver's replacement is created at once, beside the stopping pod (`_replaces_at_once`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import yaml
from dstream.spec import API_VERSION, KIND, StreamingJob, parse_job

from dstream_operator import restarts
from dstream_operator.checkpoint_storage import checkpoint_storage
from dstream_operator.resources import job_manifest
from dstream_operator.status import (
    DriverReport,
    DriverRoles,
    JobStatus,
    PodFacts,
    running_phase,
    with_condition,
    with_driver,
    with_phase,
)

# Why the operator stopped a driver; written on the pod before deleting it, so the pod's
# disappearance is not mistaken for a failure.
STOP_SUSPEND = "suspend"
STOP_SPEC_CHANGE = "spec-change"
STOP_ENDED = "ended"
STOP_JOB_DELETION = "job-deletion"

CHECKPOINT_SHARED = "CheckpointShared"  # the condition: see checkpoint_storage.py


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the StreamingJob."""

    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Observation:
    """Everything `plan` looks at."""

    job: StreamingJob | None  # None when the spec is invalid
    job_uid: str
    problems: tuple[str, ...]  # why the spec is invalid
    status: JobStatus
    driver: PodFacts | None  # the driver pod as it is now
    vanished: PodFacts | None  # a driver pod that disappeared since the last step
    executors_ready: int
    report: DriverReport | None
    spec_hash: str  # of the current spec; a live driver with another one is outdated
    now: datetime
    template_overrides: tuple[str, ...] = ()  # pod template fields the operator overrides
    second: PodFacts | None = None  # the second driver pod (driver.standby)
    stopping: tuple[PodFacts, ...] = ()  # driver pods retiring (stopped, not yet gone)
    second_vanished: PodFacts | None = None
    leader: str | None = None  # the holder of the job's Lease (driver.standby)
    generation: int | None = None  # of the spec `job` was parsed from


@dataclass
class Plan:
    """What to do: stop and/or create the driver, post events, write the status."""

    status: JobStatus
    stop_driver: str | None = None  # a STOP_* reason, for every driver pod of the job
    create_driver: bool = False  # every driver pod the job should run and does not have
    ended_pods: list[str] = field(default_factory=list)  # to mark STOP_ENDED and remove
    restarted: bool = False
    events: list[Event] = field(default_factory=list)
    wake_at: datetime | None = None  # plan again then, even if nothing changes (backoff end)
    run_job: StreamingJob | None = None  # what a new driver runs: the spec, or a rollback's


def plan(seen: Observation) -> Plan:
    """Decide for one job; see the module docstring."""
    if seen.job is None:
        return _invalid(seen)
    retrying = _changed_since_failure(seen)
    if retrying:
        seen = dataclasses.replace(seen, status=_fresh_budget(seen.status))
    if seen.job.spec.driver.standby or seen.second or seen.second_vanished:
        step = _plan_pair(seen)
    else:
        step = _plan_driver(seen)
    if retrying:
        message = "spec changed on a Failed job: starting again with a fresh budget"
        step.events.insert(0, Event("Normal", "Retrying", message))
    _judge_checkpoint_storage(seen, step)
    return step


def _judge_checkpoint_storage(seen: Observation, step: Plan) -> None:
    """The `CheckpointShared` condition, and with every driver pod created for a job whose
    checkpoint its pods do not share, a Warning event saying what that driver gives up."""
    assert seen.job is not None
    storage = checkpoint_storage(step.run_job or seen.job)
    step.status = with_condition(
        step.status, CHECKPOINT_SHARED, storage.shared, storage.reason, storage.message, seen.now
    )
    if step.create_driver and not storage.shared:
        step.events.append(Event("Warning", "CheckpointNotShared", storage.message))


def _changed_since_failure(seen: Observation) -> bool:
    """The spec changed after the job failed: the status's generation is older than the
    spec's. Decided here rather than when the change is announced, so that a step in flight
    when the change arrives cannot write the failure back over the fresh start."""
    observed = seen.status.observed_generation
    return (
        seen.status.phase == "Failed"
        and observed is not None
        and seen.generation is not None
        and observed < seen.generation
    )


def _fresh_budget(status: JobStatus) -> JobStatus:
    return status.model_copy(
        update={
            "phase": "Pending",
            "restarts": 0,
            "next_restart_time": None,
            "message": "spec changed; starting again",
        }
    )


def _plan_driver(seen: Observation) -> Plan:
    """Decide for a job's one driver (or the leader of two)."""
    assert seen.job is not None
    if _predecessors(seen.driver, seen.job_uid):
        return _await_predecessor(seen, seen.driver, seen.job.spec.executor.instances)
    if _predecessors(seen.vanished, seen.job_uid):
        seen = dataclasses.replace(seen, vanished=None)  # its end is no restart of this job
    job = seen.job
    step = Plan(status=_forget_old_rollback(seen))
    step.run_job, run_hash = _target(seen, step.status)
    _record_stable(seen, step, run_hash)
    _handle_termination(seen, job, step)
    step.run_job, run_hash = _target(seen, step.status)  # a rollback may have been decided
    if job.spec.suspend:
        _suspend(seen, step)
    elif step.status.phase != "Failed":
        _run(seen, step, run_hash)
    alive = seen.driver if seen.driver is not None and seen.driver.alive else None
    step.status = with_driver(
        step.status,
        alive,
        seen.executors_ready if alive else 0,
        job.spec.executor.instances,
        seen.report if alive else None,
        seen.now,
    )
    return step


def _predecessors(pod: PodFacts | None, job_uid: str) -> bool:
    """A driver pod of an earlier job of the same name: deleted and created again before the
    garbage collector removed the old pods (`kubectl delete` then `kubectl apply`)."""
    return pod is not None and pod.owner_uid is not None and pod.owner_uid != job_uid


def _await_predecessor(seen: Observation, pod: PodFacts, executors_desired: int) -> Plan:
    """The garbage collector removes the old driver; this job's own starts once it is gone."""
    message = f"waiting for driver pod {pod.name} of an earlier job of this name to go"
    status = with_phase(seen.status, seen.status.phase or "Pending", message, seen.now)
    return Plan(status=with_driver(status, None, 0, executors_desired, None, seen.now))


def _invalid(seen: Observation) -> Plan:
    """Say what is wrong; a driver of the last valid spec keeps running, like an old
    ReplicaSet during a rollout that cannot proceed."""
    message = "invalid spec: " + "; ".join(seen.problems)
    step = Plan(status=with_phase(seen.status, "Failed", message, seen.now))
    if seen.status.phase != "Failed" or seen.status.message != message:
        step.events.append(Event("Warning", "InvalidSpec", message))
    return step


def _forget_old_rollback(seen: Observation) -> JobStatus:
    """A rollback lasts until the spec changes: a new spec gets its own chance."""
    status = seen.status
    if status.rolled_back_from is None or status.rolled_back_from == seen.spec_hash:
        return status
    return status.model_copy(update={"rolled_back_from": None, "upgrade_failures": 0})


def _target(seen: Observation, status: JobStatus) -> tuple[StreamingJob, str]:
    """The job a driver should run, and its fingerprint: the spec, unless it was rolled back
    from, then the last spec that committed a batch."""
    assert seen.job is not None
    if status.rolled_back_from == seen.spec_hash and status.stable_spec and status.stable_spec_hash:
        document = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": seen.job.metadata.model_dump(exclude_none=True),
            "spec": yaml.safe_load(status.stable_spec),
        }
        return parse_job(document, "status.stableSpec"), status.stable_spec_hash
    return seen.job, seen.spec_hash


def _record_stable(seen: Observation, step: Plan, run_hash: str) -> None:
    """A driver that committed a batch proves its spec: it becomes the one to roll back to."""
    driver, report = seen.driver, seen.report
    committed = report is not None and report.last_batch_time is not None
    if driver is None or not driver.alive or not committed or driver.spec_hash != run_hash:
        return
    if step.status.stable_spec_hash == run_hash:
        return
    assert step.run_job is not None
    text = yaml.safe_dump(job_manifest(step.run_job)["spec"], sort_keys=True)
    step.status = step.status.model_copy(
        update={"stable_spec": text, "stable_spec_hash": run_hash, "upgrade_failures": 0}
    )


def _ended_pod(seen: Observation) -> PodFacts | None:
    driver = seen.driver
    if driver is not None and driver.stop_reason is None and (driver.deleting or driver.terminal):
        return driver
    return seen.vanished


def _roll_back(seen: Observation, job: StreamingJob, step: Plan, ended: str) -> bool:
    """Count a failure of a changed spec's driver that never committed a batch; after
    `rollbackAfterFailures` of them, run the last spec that did. True if rolled back."""
    status, upgrade = step.status, job.spec.upgrade
    pod = _ended_pod(seen)
    if pod is None or not _unproven(seen, status, pod):
        return False
    failures = status.upgrade_failures + 1
    if failures < upgrade.rollback_after_failures:
        step.status = status.model_copy(update={"upgrade_failures": failures})
        return False
    message = (
        f"{ended}; the changed spec failed {failures} times before committing a batch: "
        f"rolled back to the last spec that did ({status.stable_spec_hash}), from the "
        "checkpoint; change the spec to try again"
    )
    step.status = with_phase(status, "Recovering", message, seen.now).model_copy(
        update={
            "rolled_back_from": seen.spec_hash,
            "upgrade_failures": 0,
            "restarts": 0,
            "next_restart_time": seen.now,
        }
    )
    step.restarted = True
    step.events.append(Event("Warning", "RolledBack", message))
    return True


def _unproven(seen: Observation, status: JobStatus, pod: PodFacts) -> bool:
    """Whether `pod` runs a changed spec that no driver has committed a batch of yet, while
    a rollback to the last one that did is possible: its failure counts towards
    `rollbackAfterFailures`."""
    assert seen.job is not None
    return (
        seen.job.spec.upgrade.rollback_on_failure
        and status.stable_spec_hash is not None
        and status.rolled_back_from is None
        and pod.spec_hash == seen.spec_hash != status.stable_spec_hash
    )


def ended_driver(seen: Observation) -> restarts.Termination | None:
    """A driver that ended without the operator stopping it: it exited, or someone deleted its
    pod (a graceful deletion shows first as a deletion mark, and ends the pod before it goes),
    or the pod vanished. Once handled, the pod carries a stop reason and is not counted again."""
    driver, vanished = seen.driver, seen.vanished
    if driver is not None and driver.stop_reason is None:
        if driver.deleting:
            return restarts.Termination(True, f"driver pod {driver.name} was deleted")
        if driver.terminal:
            return restarts.Termination(driver.phase == "Failed", driver.describe_end())
    if vanished is not None and vanished.stop_reason is None:
        return restarts.Termination(True, f"driver pod {vanished.name} was deleted")
    return None


def _handle_termination(seen: Observation, job: StreamingJob, step: Plan) -> None:
    driver = seen.driver
    if driver is not None and driver.terminal and not driver.deleting:
        step.stop_driver = STOP_ENDED  # removes the ended pod
    ended = ended_driver(seen)
    if ended is None:
        return
    if driver is not None:
        step.stop_driver = STOP_ENDED  # marks its end as handled
    if job.spec.suspend or step.status.phase == "Failed":
        return
    if ended.failed and _roll_back(seen, job, step, ended.reason):
        return
    decision = restarts.decide(job.spec.restart_policy, step.status.restarts, ended)
    if isinstance(decision, restarts.GiveUp):
        step.status = with_phase(step.status, "Failed", decision.reason, seen.now)
        step.events.append(Event("Warning", "JobFailed", decision.reason))
        return
    policy = job.spec.restart_policy
    when = f"in {decision.delay_seconds}s" if decision.delay_seconds else "now"
    message = (
        f"{ended.reason}; restart {decision.attempt}/{policy.max_restarts} "
        f"{when} from the checkpoint"
    )
    step.status = with_phase(step.status, "Recovering", message, seen.now).model_copy(
        update={
            "restarts": decision.attempt,
            "next_restart_time": seen.now + timedelta(seconds=decision.delay_seconds),
        }
    )
    step.restarted = True
    step.events.append(Event("Warning", "DriverLost", message))


def _rollback_note(status: JobStatus) -> str | None:
    if status.rolled_back_from is None:
        return None
    return (
        f"rolled back: running the last spec that committed a batch ({status.stable_spec_hash}) "
        f"instead of spec {status.rolled_back_from}, whose driver kept failing before its "
        "first batch; change the spec to try again"
    )


def _reset_after_stable_run(seen: Observation, step: Plan) -> None:
    """A driver ready for `resetAfterSeconds` has recovered: the next loss is a first one
    again (restarted at once, with a full restart budget)."""
    policy = seen.job.spec.restart_policy if seen.job else None
    ready = next((c for c in step.status.conditions if c.type == "DriverReady"), None)
    ready_since = ready.last_transition_time if ready and ready.status == "True" else None
    if not step.status.restarts or policy is None:
        return
    if restarts.stable_since(policy, ready_since, seen.now):
        message = (
            f"the driver has been ready for {policy.reset_after_seconds}s: "
            f"restart count {step.status.restarts} reset"
        )
        step.status = step.status.model_copy(update={"restarts": 0})
        step.events.append(Event("Normal", "RestartCountReset", message))


def _suspend(seen: Observation, step: Plan) -> None:
    if seen.driver is not None and seen.driver.alive:
        step.stop_driver = STOP_SUSPEND
        step.events.append(
            Event("Normal", "Suspending", "stopping the driver gracefully; checkpoint kept")
        )
    step.status = with_phase(
        step.status, "Suspended", "suspended; the checkpoint is kept", seen.now
    ).model_copy(update={"next_restart_time": None})


def _run(seen: Observation, step: Plan, run_hash: str) -> None:
    driver, status = seen.driver, step.status
    if driver is not None and driver.alive:
        if driver.spec_hash != run_hash:
            step.stop_driver = STOP_SPEC_CHANGE
            step.events.append(
                Event("Normal", "Restarting", "spec changed: restarting the driver gracefully")
            )
            step.status = with_phase(
                status, "Starting", "restarting the driver for a spec change", seen.now
            )
            return
        phase = running_phase(driver, status.restarts, seen.report)
        step.status = with_phase(status, phase, _rollback_note(status), seen.now)
        _reset_after_stable_run(seen, step)
        return
    if not _replaces_at_once(seen):
        return  # the old driver is still going away
    due = status.next_restart_time
    if due is not None and seen.now < due:
        step.status = with_phase(status, "Recovering", status.message, seen.now)
        step.wake_at = due
        return
    step.create_driver = True
    phase = "Recovering" if status.restarts else "Starting"
    message = status.message if phase == "Recovering" else None  # why it is recovering
    step.status = with_phase(status, phase, message, seen.now).model_copy(
        update={"next_restart_time": None}
    )
    reason = "DriverRestarted" if due is not None else "DriverCreated"
    step.events.append(Event("Normal", reason, "created the driver pod"))
    if seen.template_overrides:
        message = "pod fields the operator owns, the job's values ignored: "
        step.events.append(
            Event("Warning", "PodTemplateOverridden", message + ", ".join(seen.template_overrides))
        )


def _replaces_at_once(seen: Observation) -> bool:
    """Whether the next driver may start while the old one's pod is still going away: only
    when the old driver was lost (`STOP_ENDED`) and the job has a checkpoint. Every driver pod
    waits for its checkpoint's lead (`--standby`) and then claims a new epoch, which fences off
    the old driver should it still write (docs/fault-tolerance.md). A driver stopped on purpose
    (a spec change, a suspension) is waited for: its graceful stop still commits batches, and
    a changed spec may name another checkpoint, where nothing fences the two. Without a
    checkpoint nothing does either."""
    assert seen.job is not None
    going = [*seen.stopping, *([seen.driver] if seen.driver is not None else [])]
    lost = all(pod.stop_reason in (None, STOP_ENDED) for pod in going)
    return not going or (lost and seen.job.spec.checkpoint is not None)


def _unhandled_end(pod: PodFacts | None, vanished: bool) -> bool:
    """A pod that ended (exited, deleted, gone) without the operator stopping it."""
    if pod is None or pod.stop_reason is not None:
        return False
    return vanished or pod.deleting or pod.terminal


def _plan_pair(seen: Observation) -> Plan:
    """Two driver pods: see the module docstring."""
    assert seen.job is not None
    present = [p for p in (seen.driver, seen.second) if p is not None]
    living = [p for p in present if p.alive]
    lead = next((p for p in living if p.name == seen.leader), living[0] if living else None)
    ended = [p for p in present if _unhandled_end(p, vanished=False)] + [
        p for p in (seen.vanished, seen.second_vanished) if _unhandled_end(p, vanished=True)
    ]
    standby = seen.job.spec.driver.standby
    status = _forget_old_rollback(seen)
    failing = next((p for p in ended if _unproven(seen, status, p)), None)
    if lead is not None and ended and standby and failing is None:
        step = _plan_driver(dataclasses.replace(seen, driver=lead, vanished=None))
        if step.stop_driver is None:
            _replace_lost(seen, lead, ended, step)
    else:  # planned as one driver: the leader, else the one whose end is to be handled
        # (first a pod of an unproven changed spec: its partner runs the same spec and is
        # no safety net, so its loss is the job's failure, counted towards a rollback)
        view = failing if failing in present else lead
        view = view or next((p for p in present if p in ended), present[0] if present else None)
        vanished = next((p for p in ended if p not in present), None)
        vanished = vanished or seen.vanished or seen.second_vanished
        step = _plan_driver(dataclasses.replace(seen, driver=view, vanished=vanished))
    roles = _roles(seen, living)
    if lead is not None and standby and len(present) < 2 and _keeps_running(step):
        roles = _replace_when_due(seen, lead, step, roles)
    step.status = step.status.model_copy(update={"driver": roles})
    return step


def _replace_when_due(
    seen: Observation, lead: PodFacts, step: Plan, roles: DriverRoles
) -> DriverRoles:
    """Create the missing pod of the two once the survivor has completed a batch (is ready)
    and the backoff has passed. A standby that just took over runs its first batches on
    executors new to the job's code; a replacement started then (a driver and its executors)
    takes CPU from them wherever they share nodes. The price: no standby for those seconds
    longer. The survivor's pod turning ready is an event that plans again."""
    if not lead.ready:
        return roles
    count, due = _next_replacement(seen, roles)
    if due is not None and seen.now < due:
        step.wake_at = min(step.wake_at or due, due)
        return roles
    step.create_driver = True
    return roles.model_copy(update={"replacements": count + 1, "last_replaced_time": seen.now})


def _next_replacement(seen: Observation, roles: DriverRoles) -> tuple[int, datetime | None]:
    """The replacements counted so far (none once the last is older than the restart policy's
    resetAfterSeconds) and when the next may be created: at once the first time (None), then
    the restart backoff after the last replacement, so a pod that keeps dying is not recreated
    in a tight loop while the other lives."""
    assert seen.job is not None
    policy = seen.job.spec.restart_policy
    last = roles.last_replaced_time
    count = 0 if restarts.stable_since(policy, last, seen.now) else roles.replacements
    if last is None or not count:
        return count, None
    return count, last + timedelta(seconds=restarts.backoff_seconds(policy, count))


def _replace_lost(seen: Observation, lead: PodFacts, ended: list[PodFacts], step: Plan) -> None:
    """One of the two drivers ended while the other lives: remove it, and (once it is marked,
    and its backoff passed) create another, counting no restart."""
    _, due = _next_replacement(seen, seen.status.driver or DriverRoles())
    when = f"in {(due - seen.now).total_seconds():.0f} s" if due and due > seen.now else "now"
    if not lead.ready:
        when = f"once {lead.name} has completed a batch"
    for pod in ended:
        if pod in (seen.driver, seen.second):
            step.ended_pods.append(pod.name)
        message = (
            f"{_end_of(pod)}; {lead.name} {_role_after(seen, lead, pod)}; replacing {pod.name} "
            f"{when}"
        )
        step.events.append(Event("Warning", "DriverLost", message))


def _role_after(seen: Observation, survivor: PodFacts, lost: PodFacts) -> str:
    """What the surviving driver does now, by the Lease as last read."""
    if lost.name == seen.leader:
        return "takes over once the Lease is free"
    return "leads" if survivor.name == seen.leader else "stands by"


def _end_of(pod: PodFacts) -> str:
    if pod.terminal:
        return pod.describe_end()
    return f"driver pod {pod.name} was deleted"


def _keeps_running(step: Plan) -> bool:
    return step.stop_driver is None and step.status.phase not in ("Failed", "Suspended")


def _roles(seen: Observation, living: list[PodFacts]) -> DriverRoles:
    """Who leads (the Lease's holder, if it is one of the live pods) and who stands by."""
    names = [p.name for p in living]
    leader = seen.leader if seen.leader in names else None
    standby = next((n for n in names if n != leader), None) if leader else None
    earlier = seen.status.driver or DriverRoles()
    return earlier.model_copy(update={"leader": leader, "standby": standby})
