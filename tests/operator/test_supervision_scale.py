"""How the supervisor scales: it steps only the jobs that changed or are due, refreshes each
job in a slot of its own, keeps a bounded number of steps in flight, and creates missing driver
pods before doing anything else."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from dstream_operator.kube import Kube
from dstream_operator.slots import StepSlots
from dstream_operator.supervisor import JobBook, Supervisor, SupervisorSettings, refresh_slot
from kubernetes.client import Configuration

from tests.operator.conftest import NS, job_manifest

NOW = datetime(2026, 1, 1, 12, 0, 0, 300_000, tzinfo=UTC)


def test_only_changed_and_due_jobs_are_stepped():
    book = JobBook()
    for name in ("a", "b", "c"):
        book.see_job(("jobs", name), {"metadata": {"name": name}})
    assert book.take_due(NOW) == [("jobs", "a"), ("jobs", "b"), ("jobs", "c")]
    assert book.take_due(NOW) == []  # nothing changed, nothing due
    book.step_at(("jobs", "a"), NOW + timedelta(seconds=5))
    book.step_at(("jobs", "b"), NOW + timedelta(seconds=1))
    book.see_executor(("jobs", "c"), _pod_facts("c-exec-1"), deleted=False)
    assert book.take_due(NOW) == [("jobs", "c")]
    assert book.seconds_to_wait(5.0, NOW) == 1.0
    assert book.take_due(NOW + timedelta(seconds=1)) == [("jobs", "b")]
    assert book.take_due(NOW + timedelta(seconds=5)) == [("jobs", "a")]  # b's time was taken
    assert book.seconds_to_wait(5.0, NOW + timedelta(seconds=5)) == 5.0  # none asked for
    for name in ("a", "b"):
        book.step_at(("jobs", name), NOW + timedelta(seconds=6))
    book.see_job(("jobs", "a"), None)
    assert book.take_due(NOW + timedelta(seconds=6)) == [("jobs", "b")]  # a is gone


def test_a_step_replaces_the_times_asked_before():
    book = JobBook()
    book.see_job(("jobs", "a"), {"metadata": {"name": "a"}})
    book.take_due(NOW)
    book.step_at(("jobs", "a"), NOW + timedelta(seconds=1))
    book.forget_times(("jobs", "a"))  # stepped meanwhile, for another reason
    book.step_at(("jobs", "a"), NOW + timedelta(seconds=5))
    assert book.seconds_to_wait(5.0, NOW) == 5.0
    assert book.take_due(NOW + timedelta(seconds=2)) == []


def _pod_facts(name: str):
    from dstream_operator.status import pod_facts

    return pod_facts({"metadata": {"name": name, "uid": name}, "status": {"phase": "Running"}})


def test_refreshes_are_spread_over_the_interval_in_fixed_slots():
    keys = [("jobs", f"job-{i}") for i in range(200)]
    slots = [refresh_slot(key, 5.0, NOW) for key in keys]
    offsets = sorted((slot - NOW).total_seconds() for slot in slots)
    assert 0 < offsets[0] and offsets[-1] <= 5.0
    per_second = [sum(1 for o in offsets if s < o <= s + 1) for s in range(5)]
    assert min(per_second) >= 20, per_second  # 40 a second on average, none starved
    later = [refresh_slot(key, 5.0, slot) for key, slot in zip(keys, slots, strict=True)]
    assert all(abs((b - a).total_seconds() - 5.0) < 1e-3 for a, b in zip(slots, later, strict=True))


@pytest.mark.asyncio
async def test_steps_in_flight_are_bounded():
    book = JobBook()
    for i in range(12):
        book.see_job(("jobs", f"j{i}"), {"metadata": {"name": f"j{i}"}})
    supervisor = Supervisor(book, kube=None, settings=SupervisorSettings(concurrency=3))
    in_flight, most = 0, 0
    stepped = []

    async def step(key, http):
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        stepped.append(key)
        in_flight -= 1

    supervisor.step = step
    await supervisor.step_all(http=None)
    assert most == 3 and len(stepped) == 12


async def _pod_step(slots: StepSlots, key, log: list) -> None:
    """A step that creates its job's driver pod, then does the rest."""
    async with slots.slot(key):
        await asyncio.sleep(0.01)
        log.append(("pod", key))
        await slots.rest_after_pods(key)
        log.append(("rest", key))


async def _other_step(slots: StepSlots, key, log: list) -> None:
    async with slots.slot(key):
        log.append(("other", key))


@pytest.mark.asyncio
async def test_steps_that_may_create_a_pod_go_before_all_other_work():
    slots = StepSlots(concurrency=2)
    log: list = []
    tasks = [asyncio.create_task(_other_step(slots, "refresh", log))]
    for key in ("a", "b", "c", "d", "e"):
        slots.may_create_pod(key)  # as `start_due` does, when it starts the step
        tasks.append(asyncio.create_task(_pod_step(slots, key, log)))
    await asyncio.gather(*tasks)
    kinds = [kind for kind, _ in log]
    assert kinds[:5] == ["pod"] * 5, log  # with two slots, the rest gave theirs up
    assert sorted(kinds[5:]) == ["other"] + ["rest"] * 5


@pytest.mark.asyncio
async def test_other_steps_wait_for_pods_only_so_long():
    slots = StepSlots(concurrency=2, defer_seconds=0.05)
    stuck = asyncio.Event()
    slots.may_create_pod("stuck")

    async def never_past_its_pod() -> None:
        async with slots.slot("stuck"):
            await stuck.wait()

    blocked = asyncio.create_task(never_past_its_pod())
    log: list = []
    await asyncio.wait_for(_other_step(slots, "refresh", log), 5)
    assert log == [("other", "refresh")]
    stuck.set()
    await blocked


@pytest.mark.asyncio
async def test_new_jobs_driver_pods_are_created_before_their_other_children(cluster):
    """Against kmock's API emulator: with fewer slots than new jobs, every job's driver pod
    is created before any job's Service, budgets, Events or status."""
    book = JobBook()
    names = [f"job-{i}" for i in range(6)]
    for name in names:
        book.see_job((NS, name), job_manifest(name))
    kube = Kube(Configuration(host=str(cluster.url).rstrip("/")))
    supervisor = Supervisor(book, kube, SupervisorSettings(concurrency=2))
    try:
        async with aiohttp.ClientSession() as http:
            await supervisor.step_all(http)
    finally:
        await kube.close()
    writes = [(r.method, str(r.url.path)) for r in cluster if r.method in ("POST", "PATCH")]
    pods = [i for i, (method, path) in enumerate(writes) if path.endswith("/pods")]
    later = [
        i
        for i, (method, path) in enumerate(writes)
        if path.endswith(("/services", "/poddisruptionbudgets", "/events", "/status"))
    ]
    assert len(pods) == len(names) and len(later) >= 4 * len(names), writes
    assert max(pods) < min(later), writes
