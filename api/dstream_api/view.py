"""What the API needs from a running job: `JobView`, with the query it answers and the errors
it raises.

The HTTP layer depends on this interface only, never on the engine: the job service implements
it over a running job (dstream.service.job_view) and hands it to the app, and the API's tests
use a fake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from dstream_api.models import Batch, SliceResult, Status, StreamSummary

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

Combine = Literal["sum", "latest"]


class UnknownStreamError(LookupError):
    """No stream is registered for queries under that name (HTTP 404)."""


class QueryNotApplicableError(ValueError):
    """The query does not fit the stream's records, e.g. top-K over non-numeric values (422)."""


class QueryFailedError(RuntimeError):
    """Spark could not run the query, e.g. because the job is stopping (503)."""


@dataclass(frozen=True)
class SliceQuery:
    """An interactive query over a stream's retained RDDs between two batch times (inclusive)."""

    stream: str
    from_ms: int | None
    to_ms: int | None
    top: int | None
    combine: Combine
    limit: int


class JobView(Protocol):
    registry: CollectorRegistry

    def status(self) -> Status: ...

    def readiness(self) -> tuple[bool, str]: ...

    def batches(self, limit: int) -> list[Batch]: ...

    def streams(self) -> list[StreamSummary]: ...

    def slice(self, query: SliceQuery) -> SliceResult: ...

    def request_stop(self) -> str: ...
