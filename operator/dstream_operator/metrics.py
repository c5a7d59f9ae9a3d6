"""The operator's own Prometheus metrics (the drivers export the stream's metrics)."""

from __future__ import annotations

import functools
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import kopf
from prometheus_client import Counter, Gauge

from dstream_operator.status import PHASES

RECONCILIATIONS = Counter(
    "dstream_operator_reconciliations_total",
    "Handler and supervision runs, by handler.",
    ["handler"],
)
ERRORS = Counter(
    "dstream_operator_errors_total",
    "Handler and supervision runs that failed, by handler.",
    ["handler"],
)
DRIVER_RESTARTS = Counter(
    "dstream_operator_driver_restarts_total",
    "Drivers replaced after a failure or loss.",
    ["namespace", "job"],
)
JOBS = Gauge("dstream_operator_jobs", "StreamingJobs by phase.", ["phase"])
LEADER = Gauge(
    "dstream_operator_leader", "1 while this operator holds the leader Lease (--lease), else 0."
)

Result = TypeVar("Result")


def counted(
    name: str,
) -> Callable[[Callable[..., Awaitable[Result]]], Callable[..., Awaitable[Result]]]:
    """Count runs and failures of an async handler; kopf's TemporaryError is a planned retry
    (e.g. waiting for a pod to go), not an error."""

    def decorate(handler: Callable[..., Awaitable[Result]]) -> Callable[..., Awaitable[Result]]:
        @functools.wraps(handler)
        async def run(**kwargs: Any) -> Result:
            RECONCILIATIONS.labels(name).inc()
            try:
                return await handler(**kwargs)
            except kopf.TemporaryError:
                raise
            except Exception:
                ERRORS.labels(name).inc()
                raise

        return run

    return decorate


def count_phases(phases: Iterable[str | None]) -> None:
    """Set the per-phase gauge, including zeros, so a phase that empties drops to 0."""
    tally = Tally(phase or "Pending" for phase in phases)
    for phase in PHASES:
        JOBS.labels(phase).set(tally[phase])
