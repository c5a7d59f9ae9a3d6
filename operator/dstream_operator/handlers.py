"""kopf handlers: StreamingJob lifecycle, pod watching, and the supervisor's start and stop.

The handlers write the job's fixed children (ConfigMap, Service, PodDisruptionBudgets, a
RoleBinding for a ServiceAccount of the user's) and its namespace's driver identity, as the
supervisor does before it creates a driver (`supervisor.sync_children`), and own the optional
checkpoint cleanup on deletion; the supervisor owns the driver pod and the status (see
supervisor.py). The operator's memo carries `kube` (a `Kube` client) and
`supervision` (`SupervisorSettings`); main.py builds it, tests build their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
from typing import Any

import kopf
from dstream.spec import StreamingJob

from dstream_operator import resources
from dstream_operator.diffbase import MemoryDiffBaseStorage, ProgressAnnotations, uid_of
from dstream_operator.kube import Kube
from dstream_operator.metrics import counted
from dstream_operator.reconcile import STOP_JOB_DELETION
from dstream_operator.status import PodFacts, pod_facts
from dstream_operator.supervisor import (
    JobBook,
    JobKey,
    Supervisor,
    owner_of,
    parse,
    stop_driver,
    sweep_leftovers,
    sync_children,
)

JOBS = ("dstream.dev", "v1alpha1", "streamingjobs")
DRIVER_PODS = {resources.ROLE_LABEL: "driver", resources.JOB_LABEL: kopf.PRESENT}
EXECUTOR_PODS = {resources.ROLE_LABEL: "executor", resources.JOB_LABEL: kopf.PRESENT}
POD_SELECTOR = f"{resources.JOB_LABEL},{resources.ROLE_LABEL} in (driver,executor)"
FINALIZER = "dstream.dev/checkpoint-cleanup"
WAIT_SECONDS = 3
FIRST_STEP_SECONDS = 30  # how long the creation handler leaves a new job to the supervisor


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Keep kopf's handler progress in annotations (the status schema is ours and pruned) and
    its diff base in memory (`diffbase`), post only our own decisions and kopf's warnings as
    Events, and start the supervisor."""
    settings.persistence.progress_storage = ProgressAnnotations(prefix="dstream.dev")
    memo.diffbase = settings.persistence.diffbase_storage = MemoryDiffBaseStorage()
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.WARNING
    # Filter pods on the API server: a handler's `labels=` only filters what kopf has already
    # received, and an operator watching every namespace would stream every pod in the cluster.
    settings.watching.label_selectors["", "v1", "pods"] = POD_SELECTOR
    policy = await memo.kube.first_served(resources.POLICY_VERSIONS, "poddisruptionbudgets")
    platform = dataclasses.replace(memo.supervision.platform, policy_version=policy)
    memo.supervision = dataclasses.replace(memo.supervision, platform=platform)
    memo.book = JobBook()
    supervisor = Supervisor(memo.book, memo.kube, memo.supervision)
    memo.supervisor_task = asyncio.create_task(supervisor.run_forever(), name="supervisor")


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    memo.supervisor_task.cancel()
    await asyncio.gather(memo.supervisor_task, return_exceptions=True)
    await memo.kube.close()


@kopf.on.resume(*JOBS)
@kopf.on.create(*JOBS)
@counted("create")
async def set_up(
    body: kopf.Body,
    meta: kopf.Meta,
    memo: kopf.Memo,
    logger: logging.Logger,
    **_: Any,
) -> None:
    """Create (or repair) the job's fixed children, and its namespace's driver identity if
    this is the namespace's first job. The supervisor does not wait for this: its first step
    writes the children a new driver needs itself, the driver pod first. This waits for that
    step (at most FIRST_STEP_SECONDS), and then finds nothing left to write: with many jobs
    created at once, their children would otherwise be written before their drivers. A job
    that an earlier operator ran (it has a status) may have children this one would not make:
    those are deleted (`sweep_leftovers`); a new job has none, and costs no look for them."""
    key = (meta["namespace"], meta["name"])
    ran_before = bool(body.get("status"))  # read now: the first step writes one
    job, problems = parse(dict(body))
    if job is None:
        logger.warning("invalid spec, nothing set up: %s", "; ".join(problems))
    else:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(memo.book.memory(key).stepped.wait(), FIRST_STEP_SECONDS)
        await write_children(body, key, memo, job, sweep=ran_before)
        kopf.event(
            body,
            type="Normal",
            reason="SetUp",
            message="ConfigMap, Service, PodDisruptionBudgets and the UI Ingress (if "
            f"configured) in place; the driver runs as {resources.driver_service_account(job)}",
        )
        if changed_unseen(body):
            announce_change(body, job, changed=None)


async def write_children(
    body: kopf.Body, key: JobKey, memo: kopf.Memo, job: StreamingJob, sweep: bool = False
) -> None:
    """Bring the job's children to its spec, after its namespace's driver identity (whose Role
    a user account's RoleBinding names); only what differs is written (`sync_children`).
    With `sweep`, what an earlier operator made that the job no longer has is deleted."""
    owner = owner_of(dict(body))
    await memo.book.identities.ensure(memo.kube, owner.namespace)
    platform, memory = memo.supervision.platform, memo.book.memory(key)
    desired = resources.children(job, owner, platform)
    await sync_children(memo.kube, memory, desired)
    if sweep:
        await sweep_leftovers(memo.kube, memory, owner, desired, platform)


def changed_unseen(body: kopf.Body) -> bool:
    """The spec changed while no operator ran: the status was written for an older
    generation. (kopf's diff base is kept in memory, `diffbase`, so kopf calls the creation
    handler, not the update handler, for every job an operator finds when it starts.)"""
    observed = (body.get("status") or {}).get("observedGeneration")
    return observed is not None and observed < (body["metadata"].get("generation") or 0)


def announce_change(body: kopf.Body, job: StreamingJob, changed: list[str] | None) -> None:
    """Say what a spec change will do, with the fields that restart the driver (None: not
    known, the change was made while no operator ran). A Failed job's fresh budget is the
    supervisor's to give (`reconcile.plan`), by the spec's generation."""
    if changed is None:
        message = (
            "changed while no operator ran: the driver restarts from its checkpoint if "
            "what it runs changed"
        )
    elif changed and not job.spec.suspend:
        message = f"{', '.join(changed)} changed: restarting the driver from its checkpoint"
    else:
        message = "applied without restarting the driver"
    kopf.event(body, type="Normal", reason="SpecChanged", message=message)


@kopf.on.update(*JOBS, field="spec")
@counted("update")
async def spec_changed(
    old: Any,
    new: Any,
    body: kopf.Body,
    meta: kopf.Meta,
    memo: kopf.Memo,
    logger: logging.Logger,
    **_: Any,
) -> None:
    """Publish the new spec to the children it changed (the driver's ConfigMap, the budgets)
    and say what the change will do; the supervisor restarts the driver when its spec
    fingerprint no longer matches."""
    key = (meta["namespace"], meta["name"])
    job, problems = parse(dict(body))
    if job is None:
        logger.warning("invalid spec, change not applied: %s", "; ".join(problems))
        return
    await write_children(body, key, memo, job)
    changed = resources.restart_fields(dict(old or {}), dict(new or {}))
    announce_change(body, job, changed)


def deletes_checkpoint(spec: kopf.Spec, **_: Any) -> bool:
    """Only jobs that ask for checkpoint deletion get a finalizer."""
    return bool((spec.get("checkpoint") or {}).get("deleteOnJobDeletion"))


@kopf.on.delete(*JOBS, when=deletes_checkpoint, timeout=600)
@counted("delete")
async def delete_checkpoint(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Stop the driver, then delete the checkpoint with a one-off pod on the job's volume.
    A failed cleanup is reported, not retried forever: the job's deletion must not hang."""
    owner = owner_of(dict(body))
    job, _problems = parse(dict(body))
    checkpoint = resources.shared_checkpoint(job) if job else None
    if job is None or checkpoint is None:
        kopf.event(
            body,
            type="Normal",
            reason="CheckpointNotShared",
            message="the checkpoint is not on a job volume: nothing to delete",
        )
        return
    if await stop_driver(memo.kube, owner, STOP_JOB_DELETION):
        raise kopf.TemporaryError("waiting for the driver to stop", delay=WAIT_SECONDS)
    name = resources.cleanup_pod_name(owner.name)
    cleanup = await memo.kube.get("v1", "Pod", owner.namespace, name)
    if cleanup is None:
        image = memo.supervision.image
        await memo.kube.create(resources.cleanup_pod(job, owner, checkpoint, image))
        kopf.event(
            body,
            type="Normal",
            reason="DeletingCheckpoint",
            message=f"deleting checkpoint {checkpoint} with pod {name}",
        )
        raise kopf.TemporaryError("waiting for the checkpoint cleanup", delay=WAIT_SECONDS)
    phase = (cleanup.get("status") or {}).get("phase")
    if phase == "Succeeded":
        kopf.event(body, type="Normal", reason="CheckpointDeleted", message=checkpoint)
    elif phase == "Failed":
        kopf.event(
            body,
            type="Warning",
            reason="CheckpointNotDeleted",
            message=f"cleanup pod {name} failed; delete {checkpoint} by hand",
        )
    else:
        raise kopf.TemporaryError("waiting for the checkpoint cleanup", delay=WAIT_SECONDS)


@kopf.on.event(*JOBS)
async def job_seen(
    type: str | None, body: kopf.Body, name: str, namespace: str, memo: kopf.Memo, **_: Any
) -> None:
    """Record the job; when it is gone, delete its driver pod at once (see
    `delete_orphaned_driver`)."""
    key = (namespace, name)
    if type == "DELETED":
        memo.diffbase.forget(uid_of(body))
        known = memo.book.jobs.get(key)
        memo.book.see_job(key, None)
        for driver in known.driver_pods() if known is not None else []:
            if not driver.deleting:  # a standby job's second driver too
                await delete_orphaned_driver(memo.kube, namespace, driver)
        return
    memo.book.see_job(key, copy.deepcopy(dict(body)))  # kopf's body views change under our feet


async def delete_orphaned_driver(kube: Kube, namespace: str, driver: PodFacts) -> None:
    """The garbage collector would delete the pod of a deleted job too, but it works through
    every object of every deleted job at the controller-manager's client rate (20 requests a
    second by default): 200 jobs deleted at once left their pods for minutes
    (docs/operator-scale.md). The driver still stops gracefully, with its grace period; the
    pod's uid makes sure that a successor of the same name is left alone."""
    await kube.delete("v1", "Pod", namespace, driver.name, uid=driver.uid)


@kopf.on.event("", "v1", "pods", labels=DRIVER_PODS)
async def driver_pod_seen(
    type: str | None,
    body: kopf.Body,
    namespace: str,
    labels: kopf.Labels,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Any pod with the job's label and the driver role is one of its drivers, whatever its
    name (a name per attempt, `resources.driver_name`)."""
    key = (namespace, labels[resources.JOB_LABEL])
    memo.book.see_driver(key, pod_facts(body), deleted=type == "DELETED")


@kopf.on.event("", "v1", "pods", labels=EXECUTOR_PODS)
async def executor_pod_seen(
    type: str | None,
    body: kopf.Body,
    namespace: str,
    labels: kopf.Labels,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    key = (namespace, labels[resources.JOB_LABEL])
    memo.book.see_executor(key, pod_facts(body), deleted=type == "DELETED")
