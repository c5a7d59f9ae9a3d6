"""The driver's REST API: health, status, batches, interactive queries, /metrics and stop.

Every expected failure has its status code and documented body: unknown stream 404, a bad
parameter 422 (FastAPI's validation-error shape, naming the parameter), a missing or wrong token
401, a query Spark could not run (e.g. while stopping) 503.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client.exposition import choose_encoder
from pydantic import Field

from dstream_api.auth import require_token
from dstream_api.models import (
    Batches,
    ErrorDetail,
    Health,
    Readiness,
    SliceResult,
    Status,
    StopAccepted,
    Streams,
)
from dstream_api.view import (
    Combine,
    JobView,
    QueryFailedError,
    QueryNotApplicableError,
    SliceQuery,
    UnknownStreamError,
)

MAX_BATCHES = 1000
MAX_TOP = 10_000
MAX_SAMPLE = 1000

TIME_HELP = "ISO-8601 (naive: the driver's local time) or unix epoch seconds"
# Epoch seconds first: pydantic would otherwise read a bare number as a datetime too.
Time = Annotated[float, Field(allow_inf_nan=False)] | datetime


def parameter_error(name: str, message: str, value: Any) -> RequestValidationError:
    """A 422 in FastAPI's own validation-error shape, so clients parse one error format."""
    return RequestValidationError(
        [{"type": "value_error", "loc": ("query", name), "msg": message, "input": value}]
    )


def epoch_ms(name: str, value: Time | None) -> int | None:
    """Epoch milliseconds of a query time; naive datetimes are the driver's local time."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        return round(value * 1000)
    try:
        return round(value.astimezone().timestamp() * 1000)
    except (OverflowError, OSError, ValueError):
        raise parameter_error(name, f"time out of range: {value.isoformat()}", str(value)) from None


def app_for(view: JobView) -> FastAPI:
    app = FastAPI(
        title="dstream driver API",
        version="v1",
        description="Status, batches and interactive queries of one running D-Stream job.",
    )
    errors: dict[int | str, dict[str, Any]] = {
        401: {"model": ErrorDetail, "description": "Missing or wrong bearer token."},
        404: {"model": ErrorDetail, "description": "No such stream."},
        503: {"model": ErrorDetail, "description": "The driver cannot serve this right now."},
    }

    @app.get("/healthz", response_model=Health, tags=["probes"])
    def healthz() -> Health:
        """Liveness: the driver process answers."""
        return Health()

    @app.get(
        "/readyz",
        response_model=Readiness,
        responses={503: {"model": Readiness, "description": "Not ready."}},
        tags=["probes"],
    )
    def readyz(response: Response) -> Readiness:
        """Readiness: a batch has completed and the job is not stopping."""
        ready, reason = view.readiness()
        if not ready:
            response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return Readiness(ready=ready, reason=reason)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus exposition of the job's metrics.",
                "content": {"text/plain": {}, "application/openmetrics-text": {}},
            }
        },
        tags=["observability"],
    )
    def metrics(request: Request) -> Response:
        """Prometheus metrics (text format, or OpenMetrics when the scraper asks for it)."""
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(view.registry), media_type=content_type)

    @app.get("/v1/status", response_model=Status, response_model_by_alias=True, tags=["job"])
    def job_status() -> Status:
        """Where the job is: state, last batch, delays, rate limits, backlog, recoveries."""
        return view.status()

    @app.get("/v1/batches", response_model=Batches, tags=["job"])
    def batches(
        limit: Annotated[int, Query(ge=1, le=MAX_BATCHES, description="How many.")] = 100,
    ) -> Batches:
        """The most recent completed batches, newest first."""
        return Batches(batches=view.batches(limit))

    @app.get("/v1/streams", response_model=Streams, tags=["queries"])
    def streams() -> Streams:
        """Streams registered for interactive queries, with the batches they retain."""
        return Streams(streams=view.streams())

    @app.get(
        "/v1/streams/{name}/slice",
        response_model=SliceResult,
        responses={404: errors[404], 503: errors[503]},
        tags=["queries"],
    )
    def slice_stream(
        name: str,
        from_: Annotated[
            Time | None,
            Query(alias="from", description=f"First batch time ({TIME_HELP}); default: oldest."),
        ] = None,
        to: Annotated[
            Time | None,
            Query(description=f"Last batch time ({TIME_HELP}); default: newest completed."),
        ] = None,
        top: Annotated[
            int | None,
            Query(ge=1, le=MAX_TOP, description="Top K keys by value ((key, number) records)."),
        ] = None,
        combine: Annotated[
            Combine,
            Query(
                description="sum: all batches in range, values summed per key; latest: only "
                "the newest batch (for windowed or stateful streams, whose RDDs overlap)."
            ),
        ] = "sum",
        limit: Annotated[
            int, Query(ge=1, le=MAX_SAMPLE, description="Sample size without `top`.")
        ] = 20,
    ) -> SliceResult | JSONResponse:
        """Interactive query over the stream's retained RDDs between two batch times."""
        from_ms, to_ms = epoch_ms("from", from_), epoch_ms("to", to)
        if from_ms is not None and to_ms is not None and from_ms > to_ms:
            raise parameter_error("from", "`from` is after `to`", str(from_))
        query = SliceQuery(name, from_ms, to_ms, top, combine, limit)
        try:
            return view.slice(query)
        except UnknownStreamError:
            return JSONResponse({"detail": f"no stream named {name!r}"}, status_code=404)
        except QueryNotApplicableError as error:
            raise parameter_error("top", str(error), top) from None
        except QueryFailedError as error:
            return JSONResponse({"detail": f"query failed: {error}"}, status_code=503)

    @app.post(
        "/v1/stop",
        response_model=StopAccepted,
        status_code=status.HTTP_202_ACCEPTED,
        responses={401: errors[401], 503: errors[503]},
        dependencies=[Depends(require_token)],
        tags=["job"],
    )
    def stop() -> StopAccepted:
        """Graceful stop: the running batch completes and commits, then the driver exits."""
        return StopAccepted(state=view.request_stop())

    return app
