"""How the supervisor scales: it steps only the jobs that changed or are due, refreshes each
job in a slot of its own, and keeps a bounded number of steps in flight."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from dstream_operator.supervisor import JobBook, Supervisor, SupervisorSettings, refresh_slot

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
