"""The supervisor: one background loop that keeps every job's driver alive and its status true.

The watch handlers record what they see in a `JobBook` and wake the loop; the loop plans each job
(`reconcile.plan`), acts, and writes `.status`. It is the only writer of the status fields it
owns, which is what makes counting restarts race-free.

Why not a kopf timer or daemon per job: kopf puts a finalizer on every object that has one, so
`kubectl delete` of any StreamingJob would hang while the operator is down. Jobs get a finalizer
only when they ask for checkpoint deletion (see handlers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import json
import logging
import math
import time
import zlib
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from dstream.spec import API_VERSION, KIND, SpecError, StreamingJob, parse_job

from dstream_operator import children, metrics, resources
from dstream_operator.children import ChildKey
from dstream_operator.driver_api import fetch_report
from dstream_operator.kube import Kube, KubeError
from dstream_operator.reconcile import STOP_ENDED, Event, Observation, Plan, plan
from dstream_operator.slots import StepSlots
from dstream_operator.status import (
    STOP_REASON_ANNOTATION,
    DriverReport,
    JobStatus,
    PodFacts,
    pod_facts,
    with_phase,
)

logger = logging.getLogger(__name__)
LEASE_API = "coordination.k8s.io/v1"

JobKey = tuple[str, str]  # (namespace, name)
# Answers to creating a driver pod that no retry can change (a pod template the API server
# finds invalid): the job fails saying why, until its spec changes.
REJECTED = (400, 422)
PHASE_COUNT_SECONDS = 1.0


@dataclass(frozen=True)
class Derived:
    """What a step derives from the job's spec alone. A step runs for every job every poll
    interval, and deriving these costs milliseconds (YAML dumps for the fingerprint, the
    driver pod built to find overridden fields): with 200 jobs that was most of the
    operator's CPU. So they are derived again only when the spec changes."""

    job: StreamingJob | None
    problems: tuple[str, ...]
    spec_hash: str
    template_overrides: tuple[str, ...]


@dataclass
class JobMemory:
    """What is known about one job between supervision steps."""

    body: dict[str, Any] | None = None  # the StreamingJob as last seen
    applied: dict[ChildKey, str] = field(default_factory=dict)  # child -> its fingerprint
    # held while its children are written: the creation handler and the supervisor's first
    # step both write them, and the second then finds nothing left to write
    children_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stepped: asyncio.Event = field(default_factory=asyncio.Event)  # set after its first step
    status: JobStatus | None = None  # as the supervisor last wrote it
    drivers: dict[str, PodFacts] = field(default_factory=dict)  # the job's driver pods by name
    vanished: list[PodFacts] = field(default_factory=list)  # driver pods gone since the last step
    executors: dict[str, bool] = field(default_factory=dict)  # pod name -> ready
    report: DriverReport | None = None
    polled_at: float = -math.inf
    step_times: set[datetime] = field(default_factory=set)  # step then, even if nothing changes
    derived: tuple[str, Derived] | None = None  # and the spec (as JSON) it was derived from

    def mark_stopped(self, pod: PodFacts, reason: str) -> None:
        """Remember that the supervisor stopped `pod` or handled its end. Watch events may
        have moved it meanwhile (a force-deleted pod is already `vanished`): mark it where it
        is now, or its end would be counted again."""
        known = self.drivers.get(pod.name)
        if known is not None and known.uid == pod.uid:
            self.drivers[pod.name] = dataclasses.replace(known, deleting=True, stop_reason=reason)
        self.vanished = [
            dataclasses.replace(p, stop_reason=reason) if p.uid == pod.uid else p
            for p in self.vanished
        ]

    def driver_pods(self) -> list[PodFacts]:
        return list(self.drivers.values())

    def view(self, job: str) -> DriverView:
        """The job's driver pods as `reconcile.plan` sees them (see `DriverView`)."""
        pods = sorted(
            self.drivers.values(), key=lambda p: resources.driver_attempt(job, p.name) or 0
        )
        current = [p for p in pods if not p.retiring]
        return DriverView(
            driver=current[0] if current else None,
            second=current[1] if len(current) > 1 else None,
            stopping=tuple(p for p in pods if p.retiring),
        )

    def current_status(self) -> JobStatus:
        if self.status is not None:
            return self.status
        return JobStatus.model_validate((self.body or {}).get("status") or {})


@dataclass(frozen=True)
class DriverView:
    """A job's driver pods as the plan sees them, found by their labels, whatever their names:
    those retiring (stopped by the operator and on their way out) are `stopping`; of the
    others, oldest attempt first, the `driver` and (a standby job's) `second`."""

    driver: PodFacts | None
    second: PodFacts | None
    stopping: tuple[PodFacts, ...]

    def current(self) -> list[PodFacts]:
        return [p for p in (self.driver, self.second) if p is not None]


class DriverIdentities:
    """The namespaces whose shared driver identity (`resources.driver_identity`) the operator
    has applied since it started: the first job of a namespace applies it, the others wait
    for that and write nothing."""

    def __init__(self) -> None:
        self._ready: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    async def ensure(self, kube: Kube, namespace: str) -> None:
        if namespace in self._ready:
            return
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            if namespace not in self._ready:
                await apply_children(kube, resources.driver_identity(namespace))
                self._ready.add(namespace)

    def forget(self, namespace: str) -> None:
        """Apply it again next time: a driver pod was refused (someone deleted the account?)."""
        self._ready.discard(namespace)


class JobBook:
    """Jobs and their pods as the watch handlers report them; changes wake the supervisor."""

    def __init__(self) -> None:
        self.jobs: dict[JobKey, JobMemory] = {}
        self.identities = DriverIdentities()
        self.changed = asyncio.Event()
        self.dirty: set[JobKey] = set()  # jobs seen changing since their last step
        # (when, job) for every `step_at`, soonest first; an entry the job no longer holds
        # in its `step_times` is dropped when it comes up
        self._times: list[tuple[datetime, JobKey]] = []

    def memory(self, key: JobKey) -> JobMemory:
        return self.jobs.setdefault(key, JobMemory())

    def touch(self, key: JobKey) -> None:
        """Something about this job changed: step it soon."""
        self.dirty.add(key)
        self.changed.set()

    def see_job(self, key: JobKey, body: dict[str, Any] | None) -> None:
        if body is None:
            self.jobs.pop(key, None)
        else:
            self.memory(key).body = body
        self.touch(key)

    def see_driver(self, key: JobKey, pod: PodFacts, deleted: bool) -> None:
        """One of the job's driver pods (any pod with its labels and the driver role) changed."""
        memory = self.memory(key)
        known = memory.drivers.get(pod.name)
        if known is not None and known.uid is None:
            # what a create answered 409 left (a pod of that name it had not seen): this is it
            known = dataclasses.replace(known, uid=pod.uid)
        if known is not None and known.uid == pod.uid:
            # an event from before the supervisor marked and deleted this pod: keep the mark
            # and the deletion (neither is ever undone), so that the pod's end is not counted
            # twice and its replacement does not take it for the job's driver
            stop_reason = pod.stop_reason or known.stop_reason
            pod = dataclasses.replace(
                pod, stop_reason=stop_reason, deleting=pod.deleting or known.deleting
            )
        if not deleted:
            memory.drivers[pod.name] = pod
        elif known is None or known.uid == pod.uid:
            memory.drivers.pop(pod.name, None)
            memory.vanished.append(pod)
            self._forget_if_orphaned(key)
        self.touch(key)

    def see_executor(self, key: JobKey, pod: PodFacts, deleted: bool) -> None:
        executors = self.memory(key).executors
        if deleted:
            executors.pop(pod.name, None)
            self._forget_if_orphaned(key)
        else:
            executors[pod.name] = pod.ready and pod.alive
        self.touch(key)

    def _forget_if_orphaned(self, key: JobKey) -> None:
        """Pods of a deleted job go after the job itself: keep no memory for them."""
        memory = self.jobs[key]
        if memory.body is None and not memory.driver_pods() and not memory.executors:
            del self.jobs[key]

    def step_at(self, key: JobKey, at: datetime) -> None:
        """Step the job at `at` even if nothing changes about it: a restart backoff's end,
        its next status refresh. Kept in a heap: the supervisor wakes on every watch event,
        and scanning every job for its times on each wake was a quarter of the operator's
        CPU with 200 jobs (docs/operator-scale.md)."""
        memory = self.jobs.get(key)
        if memory is not None:
            memory.step_times.add(at)
            heapq.heappush(self._times, (at, key))

    def forget_times(self, key: JobKey) -> None:
        """The job is being stepped: the times asked before are its steps' to ask again."""
        memory = self.jobs.get(key)
        if memory is not None:
            memory.step_times.clear()

    def _held(self, at: datetime, key: JobKey) -> bool:
        memory = self.jobs.get(key)
        return memory is not None and at in memory.step_times

    def _drop_stale(self) -> None:
        while self._times and not self._held(*self._times[0]):
            heapq.heappop(self._times)

    def take_due(self, now: datetime) -> list[JobKey]:
        """The jobs to step now: those that changed and those whose time has come (each time
        is taken once)."""
        due = self.dirty
        self.dirty = set()
        self._drop_stale()
        while self._times and self._times[0][0] <= now:
            at, key = heapq.heappop(self._times)
            if self._held(at, key):
                self.jobs[key].step_times.discard(at)
                due.add(key)
        return sorted(key for key in due if key in self.jobs)

    def seconds_to_wait(self, interval: float, now: datetime) -> float:
        """Until the next job's time comes, at most the poll interval: a restart must not
        wait for the next poll tick (backoffSeconds may be shorter than the interval)."""
        self._drop_stale()
        if not self._times:
            return interval
        return max(0.0, min(interval, (self._times[0][0] - now).total_seconds()))

    async def wait(self, timeout: float) -> None:
        """Until something changes or `timeout` seconds pass."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            pass
        self.changed.clear()


def refresh_slot(key: JobKey, interval: float, now: datetime) -> datetime:
    """The job's next status refresh: the next moment after `now` in the job's own slot of
    the interval, a fixed offset from its name's hash. Jobs created together are then still
    refreshed (and their drivers polled) spread over the interval, not all at once."""
    offset = zlib.crc32("/".join(key).encode()) / 2**32 * interval
    start = now.timestamp()
    slot = offset + (math.floor((start - offset) / interval) + 1) * interval
    if slot - start < 1e-3:  # `now` is this slot, give or take float rounding
        slot += interval
    return datetime.fromtimestamp(slot, UTC)


@dataclass(frozen=True)
class SupervisorSettings:
    interval_seconds: float = 5.0  # status refresh and driver API poll period
    concurrency: int = 64  # supervision steps (API calls, driver polls) in flight at once
    poll_timeout_seconds: float = 2.0
    driver_host: resources.DriverHost = "service"
    api_server: str = resources.DEFAULT_API_SERVER  # the drivers' Spark master
    image: str = resources.OWN_IMAGE  # of the drivers and executors of jobs that name none
    platform: resources.Platform = resources.Platform()  # its policy version: see start()


def owner_of(body: dict[str, Any]) -> resources.Owner:
    meta = body["metadata"]
    return resources.Owner(meta["name"], meta["namespace"], meta.get("uid", ""))


def parse(body: dict[str, Any]) -> tuple[StreamingJob | None, tuple[str, ...]]:
    """The job model of a StreamingJob object, or the problems that make it invalid."""
    meta = body.get("metadata") or {}
    document = {
        "apiVersion": body.get("apiVersion", API_VERSION),
        "kind": body.get("kind", KIND),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "spec": body.get("spec"),
    }
    try:
        return parse_job(document, f"{meta.get('namespace')}/{meta.get('name')}"), ()
    except SpecError as error:
        return None, tuple(error.problems)


async def stop_driver(kube: Kube, owner: resources.Owner, reason: str) -> bool:
    """Stop every driver pod of the job (`stop_pod`), found by its labels as the API server
    lists them now; False if there was none."""
    labels = {resources.JOB_LABEL: owner.name, resources.ROLE_LABEL: "driver"}
    pods = await kube.list_by_labels("v1", "Pod", owner.namespace, labels)
    stopped = [await stop_pod(kube, owner, p["metadata"]["name"], reason) for p in pods]
    return any(stopped)


async def stop_pod(kube: Kube, owner: resources.Owner, name: str, reason: str) -> bool:
    """Mark a driver pod with why it is stopped, then delete it with its grace period (the
    driver stops its stream gracefully on SIGTERM). False if there was no such pod."""
    marked = await kube.patch(
        "v1",
        "Pod",
        owner.namespace,
        name,
        {"metadata": {"annotations": {STOP_REASON_ANNOTATION: reason}}},
    )
    if marked is None:
        return False
    return await kube.delete("v1", "Pod", owner.namespace, name)


def last_attempt(memory: JobMemory, job: str, status: JobStatus) -> int:
    """The highest driver attempt so far: counted in the status, or carried by a pod's name
    (one the last step created before its status write failed, or one still going away)."""
    pods = [*memory.driver_pods(), *memory.vanished]
    attempts = (resources.driver_attempt(job, p.name) or 0 for p in pods)
    return max([status.driver_attempts, *attempts])


def ready_executors(memory: JobMemory, driver: str | None) -> int:
    """The ready executors of one driver pod: the job's driver, or the leader of a standby
    job's two (the standby's executors stand by too). Each driver pod names its executors after
    itself, so a stopping driver's executors are not counted for its replacement."""
    return sum(resources.executors_of(driver, memory.executors).values()) if driver else 0


def _reject(step: Plan, message: str, now: datetime) -> None:
    """The planned driver cannot be created: the job fails instead of trying every tick."""
    step.status = with_phase(step.status, "Failed", message, now)
    step.events = [e for e in step.events if e.type == "Warning"]
    step.events.append(Event("Warning", "DriverPodRejected", message))


async def apply_children(
    kube: Kube, objects: list[dict[str, Any]], known: Collection[ChildKey] = ()
) -> None:
    """Apply objects concurrently, RoleBindings last: the API server checks a binding against
    the Role it grants, which must exist by then. Those `known` to exist are patched first."""

    async def apply(obj: dict[str, Any]) -> None:
        await kube.apply(obj, exists=children.child_key(obj) in known)

    bindings = [c for c in objects if c["kind"] == "RoleBinding"]
    await asyncio.gather(*(apply(c) for c in objects if c["kind"] != "RoleBinding"))
    await asyncio.gather(*(apply(c) for c in bindings))


async def sync_children(
    kube: Kube, memory: JobMemory, desired: list[dict[str, Any]], complete: bool = True
) -> None:
    """Write the children that changed since they were last applied (`children.changes`).
    `desired` is every child the job should have, and those applied before that it no longer
    has are deleted; unless not `complete`: then it is some of them, and nothing is deleted."""
    async with memory.children_lock:
        todo = children.changes(desired, memory.applied)
        if not complete:
            todo = dataclasses.replace(todo, delete=[])
        await apply_children(kube, todo.apply, known=memory.applied.keys())
        await asyncio.gather(*(kube.delete(*key) for key in todo.delete))
        todo.record(memory.applied)


async def sweep_leftovers(
    kube: Kube,
    memory: JobMemory,
    owner: resources.Owner,
    desired: list[dict[str, Any]],
    platform: resources.Platform,
) -> None:
    """Delete the optional children (`resources.optional_children`) that an earlier operator
    made and the job no longer has, because its spec or this operator's options changed while
    none ran (the UI Ingress after `sparkUI.ingress` was turned off, a budget turned off).
    What this process applied itself it deletes in `sync_children`. Only objects the job owns
    are deleted: one of the same name made by hand is kept."""
    wanted = {children.child_key(child) for child in desired}
    candidates = resources.optional_children(owner, platform)
    async with memory.children_lock:
        await asyncio.gather(
            *(delete_owned(kube, key, owner.uid) for key in candidates if key not in wanted)
        )


async def delete_owned(kube: Kube, key: ChildKey, owner_uid: str) -> None:
    """Delete the object if it exists and `owner_uid` owns it (that very object: by its uid)."""
    found = await kube.get(*key)
    meta = (found or {}).get("metadata") or {}
    if owner_uid in [ref.get("uid") for ref in meta.get("ownerReferences") or []]:
        await kube.delete(*key, uid=meta["uid"])


def prerequisites(desired: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The children a driver pod cannot start without: its ConfigMap (the job it runs),
    mounted when the kubelet starts it. The others (its Service, budgets, a user account's
    RoleBinding, the UI Ingress) are needed once the driver runs, and are written right after
    the pod: with many jobs created at once, a job's pod does not wait for its other children
    (docs/operator-scale.md)."""
    return [child for child in desired if child["kind"] == "ConfigMap"]


class Supervisor:
    """Runs supervision steps for all jobs in the book (see the module docstring)."""

    def __init__(self, book: JobBook, kube: Kube, settings: SupervisorSettings):
        self.book = book
        self.kube = kube
        self.settings = settings
        self._slots = StepSlots(settings.concurrency)
        self._running: dict[JobKey, asyncio.Task[None]] = {}
        self._again: set[JobKey] = set()  # changed while being stepped

    async def run_forever(self) -> None:
        async with aiohttp.ClientSession() as http:
            counted_at = -math.inf
            while True:
                interval = self.settings.interval_seconds
                await self.book.wait(self.book.seconds_to_wait(interval, datetime.now(UTC)))
                self.start_due(http)
                if time.monotonic() - counted_at >= PHASE_COUNT_SECONDS:
                    counted_at = time.monotonic()
                    self.count_phases()

    def count_phases(self) -> None:
        """The jobs per phase gauge: a pass over every job, so at most every
        PHASE_COUNT_SECONDS, not after every step."""
        metrics.count_phases(
            memory.current_status().phase for memory in self.book.jobs.values() if memory.body
        )

    def start_due(self, http: aiohttp.ClientSession) -> None:
        """Start a step for each job that changed or whose time came, without waiting for
        other jobs' steps: a slow job (or a burst of new ones) holds up no one but itself.
        A job is stepped once at a time; one that changes meanwhile is stepped again after.
        The steps of jobs without a driver pod go first (`StepSlots`)."""
        for key in self.book.take_due(datetime.now(UTC)):
            if key in self._running:
                self._again.add(key)
            else:
                if self._without_driver(key):
                    self._slots.may_create_pod(key)
                self._running[key] = asyncio.create_task(self._bounded_step(key, http))

    def _without_driver(self, key: JobKey) -> bool:
        """The job has no driver pod (but for those on their way out): its step may create
        one."""
        memory = self.book.jobs[key]
        return memory.body is not None and not memory.view(key[1]).current()

    async def step_all(self, http: aiohttp.ClientSession) -> None:
        """Step the due jobs and wait for them (what one turn of `run_forever` starts)."""
        self.start_due(http)
        await asyncio.gather(*self._running.values())

    async def _bounded_step(self, key: JobKey, http: aiohttp.ClientSession) -> None:
        try:
            async with self._slots.slot(key):
                await self.step(key, http)
        except Exception as error:  # one job's failure must not stop the others
            metrics.ERRORS.labels("supervise").inc()
            logger.error("supervising %s/%s failed: %r", *key, error)
        finally:
            if (memory := self.book.jobs.get(key)) is not None:
                memory.stepped.set()
            del self._running[key]
            if key in self._again:
                self._again.discard(key)
                self.book.touch(key)

    async def step(self, key: JobKey, http: aiohttp.ClientSession) -> None:
        memory = self.book.jobs.get(key)
        if memory is None or memory.body is None:
            return
        if memory.body["metadata"].get("deletionTimestamp"):
            return  # the deletion handler owns a job's last moments
        metrics.RECONCILIATIONS.labels("supervise").inc()
        # a failing step retries at its next refresh, not in a tight loop
        self.book.forget_times(key)
        self.book.step_at(key, refresh_slot(key, self.settings.interval_seconds, datetime.now(UTC)))
        owner = owner_of(memory.body)
        derived = self._derived(memory, owner)
        generation = memory.body["metadata"].get("generation")  # of the spec derived from
        job = derived.job
        view = memory.view(owner.name)
        vanished, memory.vanished = memory.vanished, []
        ended = [p for p in vanished if p.stop_reason is None]  # the others were handled
        try:
            pair = view.second is not None or (job is not None and job.spec.driver.standby)
            leader = await self._leader(view, owner) if pair else None
            serving = leader if pair else (view.driver.name if view.driver else None)
            seen = Observation(
                job=job,
                job_uid=owner.uid,
                problems=derived.problems,
                status=memory.current_status(),
                driver=view.driver,
                vanished=ended[0] if ended else None,
                executors_ready=ready_executors(memory, serving),
                report=await self._report(memory, view, owner, http, leader),
                spec_hash=derived.spec_hash,
                now=datetime.now(UTC),
                template_overrides=derived.template_overrides,
                second=view.second,
                second_vanished=ended[1] if len(ended) > 1 else None,
                stopping=view.stopping,
                leader=leader,
                generation=generation,
            )
            step = plan(seen)
            await self._act(step, memory, owner, job, seen.now)
            if step.wake_at is not None:
                self.book.step_at(key, step.wake_at)
        except Exception:
            memory.vanished = vanished + memory.vanished  # decide on them again next time
            raise
        status = step.status.model_copy(update={"observed_generation": generation})
        await self._write_status(memory, owner, status)

    def _derived(self, memory: JobMemory, owner: resources.Owner) -> Derived:
        """The job's `Derived`, from the memory unless its spec (or uid) changed since."""
        assert memory.body is not None
        key = json.dumps([memory.body.get("spec"), dataclasses.astuple(owner)], sort_keys=True)
        if memory.derived is not None and memory.derived[0] == key:
            return memory.derived[1]
        job, problems = parse(memory.body)
        settings = self.settings
        derived = Derived(
            job,
            problems,
            resources.spec_hash(job) if job else "",
            tuple(resources.template_overrides(job, owner, settings.api_server) if job else ()),
        )
        memory.derived = (key, derived)
        return derived

    async def _leader(self, view: DriverView, owner: resources.Owner) -> str | None:
        """The driver pod of a standby job that holds its Lease, if one of its current pods
        does (by name and uid; a stopping pod may hold it until its graceful stop ends, but it
        is no longer the job's driver: its executors and report are not the job's)."""
        name = resources.lease_name(owner.name)
        lease = await self.kube.get(LEASE_API, "Lease", owner.namespace, name)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        pods = view.current()
        return next(
            (p.name for p in pods if resources.lease_identity(p.name, p.uid) == holder), None
        )

    async def _report(
        self,
        memory: JobMemory,
        view: DriverView,
        owner: resources.Owner,
        http: aiohttp.ClientSession,
        leader: str | None,
    ) -> DriverReport | None:
        """The driver's (the leader's) last report, refreshed at most once per interval while
        it runs."""
        pods = view.current()
        driver = next((p for p in pods if p.name == leader), pods[0] if pods else None)
        if driver is None or not driver.alive or driver.phase != "Running":
            memory.report, memory.polled_at = None, -math.inf
            return None
        if time.monotonic() - memory.polled_at >= self.settings.interval_seconds:
            memory.polled_at = time.monotonic()
            pod_ip = driver.ip if self.settings.driver_host == "pod-ip" else None
            report = await fetch_report(
                http, resources.driver_url(owner, pod_ip), self.settings.poll_timeout_seconds
            )
            memory.report = report or memory.report
        return memory.report

    async def _act(
        self,
        step: Plan,
        memory: JobMemory,
        owner: resources.Owner,
        job: StreamingJob | None,
        now: datetime,
    ) -> None:
        if step.restarted:
            memory.applied.clear()  # a lost driver's replacement repairs them
        for pod in memory.view(owner.name).current():  # those retiring are stopped already
            reason = step.stop_driver or (STOP_ENDED if pod.name in step.ended_pods else None)
            if reason is not None:
                await stop_pod(self.kube, owner, pod.name, reason)
                memory.mark_stopped(pod, reason)
        if step.create_driver and job is not None:
            job = step.run_job or job  # the spec, or the one a rollback returned to
            # what the pod needs, the pod, then (once no other job's pod waits to be created:
            # `StepSlots`) the rest: those not applied as they are now since the operator
            # started (the creation handler waits for this first step, so a new job's
            # children are written once); a restart repairs them (above)
            desired = resources.children(job, owner, self.settings.platform)
            await self.book.identities.ensure(self.kube, owner.namespace)
            await sync_children(self.kube, memory, prerequisites(desired), complete=False)
            await self._create_missing(memory, job, owner, step, now)
            await self._slots.rest_after_pods((owner.namespace, owner.name))
            await sync_children(self.kube, memory, desired)
        if step.restarted:
            metrics.DRIVER_RESTARTS.labels(owner.namespace, owner.name).inc()
        await asyncio.gather(
            *(
                self.kube.create(resources.event(owner, e.type, e.reason, e.message, now))
                for e in step.events
            )
        )

    async def _create_missing(
        self,
        memory: JobMemory,
        job: StreamingJob,
        owner: resources.Owner,
        step: Plan,
        now: datetime,
    ) -> None:
        """Create the driver pods the job runs and does not have (one, or a standby job's two,
        besides those retiring), each named for the next attempt; the status counts them."""
        view = memory.view(owner.name)
        attempt = last_attempt(memory, owner.name, step.status)
        for _ in range(resources.driver_pod_count(job) - len(view.current())):
            name = resources.driver_name(owner.name, attempt + 1)
            settings = self.settings
            pod = resources.driver_pod(job, owner, settings.api_server, name, settings.image)
            try:
                created = await self.kube.create(pod)
            except KubeError as error:
                memory.applied.clear()  # the next try repairs what the pod needs
                self.book.identities.forget(owner.namespace)
                if error.status not in REJECTED:
                    raise
                _reject(step, f"the API server rejected the driver pod: {error}", now)
                return
            memory.drivers[name] = pod_facts(created or pod)
            attempt += 1
            step.status = step.status.model_copy(update={"driver_attempts": attempt})

    async def _write_status(
        self, memory: JobMemory, owner: resources.Owner, status: JobStatus
    ) -> None:
        if status.to_patch() == memory.current_status().to_patch() and memory.status is not None:
            return
        await self.kube.patch(
            API_VERSION,
            KIND,
            owner.namespace,
            owner.name,
            {"status": status.to_patch()},
            subresource="status",
        )
        memory.status = status
