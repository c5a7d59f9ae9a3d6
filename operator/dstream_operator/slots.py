"""When supervision steps run: a bounded number at once, and the creation of missing driver
pods before anything else.

With many jobs created at once the operator is short of CPU, not of API round trips: every
job's step also writes its Service and budgets, posts Events and patches its status, and each
driver pod it creates comes back as watch events (the scheduler's binding, the kubelet's
status) that step the job again. Run in the order they come, that work of the first jobs
delays the pods of the last ones, and with the API server on the same cores every write
delays every other one. So a step that may create a job's driver pod (the job has none)
goes first: the other steps wait until no such step is left, and one that created its pod
gives up its slot and waits before doing the rest (docs/operator-scale.md). They wait at
most `defer_seconds`: a stream of new jobs must not keep the others' statuses stale.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

JobKey = tuple[str, str]  # (namespace, name)
DEFER_SECONDS = 10.0


class StepSlots:
    """Slots for the supervision steps of jobs, at most `concurrency` held at once, and the
    steps that may create a driver pod first (see the module docstring)."""

    def __init__(self, concurrency: int, defer_seconds: float = DEFER_SECONDS):
        self._slots = asyncio.Semaphore(concurrency)
        self._defer_seconds = defer_seconds
        self._creating: set[JobKey] = set()  # steps that may create a pod, not past it yet
        self._none_creating = asyncio.Event()
        self._none_creating.set()
        self._holding: set[JobKey] = set()  # steps holding a slot now

    def may_create_pod(self, key: JobKey) -> None:
        """The step about to start for `key` may create a driver pod: until it is past that
        (`pod_done`, or the step's end), the others wait. Called when the step is started, so
        that no step started later goes before it."""
        self._creating.add(key)
        self._none_creating.clear()

    def pod_done(self, key: JobKey) -> None:
        """The step of `key` created its driver pod, or found it needs none."""
        self._creating.discard(key)
        if not self._creating:
            self._none_creating.set()

    @contextlib.asynccontextmanager
    async def slot(self, key: JobKey) -> AsyncIterator[None]:
        """Hold a slot for the step of `key` while it runs; a step that creates no pod first
        waits for those that may."""
        if key not in self._creating:
            await self._after_pods()
        await self._take(key)
        try:
            yield
        finally:
            self._give(key)
            self.pod_done(key)

    async def rest_after_pods(self, key: JobKey) -> None:
        """The step of `key` is past its driver pod: the rest of its work waits, without its
        slot, for the steps that may still create one."""
        self.pod_done(key)
        if self._none_creating.is_set():
            return
        self._give(key)
        await self._after_pods()
        await self._take(key)

    async def _after_pods(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_creating.wait(), self._defer_seconds)

    async def _take(self, key: JobKey) -> None:
        await self._slots.acquire()
        self._holding.add(key)

    def _give(self, key: JobKey) -> None:
        """Give back the slot of `key` if it holds one (a cancelled `_take` took none)."""
        if key in self._holding:
            self._holding.discard(key)
            self._slots.release()
