"""Response models: the API's contract. Field names are camelCase on the wire, and the operator
reads /v1/status by these names, so renaming one is a breaking change."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class Health(ApiModel):
    status: Literal["ok"] = "ok"


class Readiness(ApiModel):
    ready: bool
    reason: str = Field(description="Why the driver is (not) ready.")


class LastBatch(ApiModel):
    """The last completed batch, as the operator copies it into the StreamingJob status."""

    time: datetime = Field(description="Batch time (ISO-8601).")
    processing_seconds: float | None
    scheduling_delay_seconds: float | None
    total_delay_seconds: float | None
    records: int = Field(ge=0)


class Status(ApiModel):
    job: str
    state: str = Field(
        description="starting, initialized, standby (waiting for the checkpoint's lead), "
        "recovering (re-running batches from the checkpoint), running, stopping or stopped."
    )
    epoch: int | None = Field(
        default=None,
        description="The epoch this driver leads the checkpoint under; null without a "
        "checkpoint or while a standby.",
    )
    batch_interval_seconds: float = Field(gt=0)
    last_batch: LastBatch | None = Field(description="null until the first batch completes.")
    rate_limit: dict[str, float | None] = Field(
        description="Records per second each source's next batch may admit; null: unlimited."
    )
    pending_batches: int = Field(
        ge=0, description="Batch times due (or recovered) and not yet started."
    )
    backlog: dict[str, int | None] = Field(
        description="Records available at each source but not yet admitted (null: unknown)."
    )
    recoveries: dict[str, int] = Field(
        description="What recovery from the checkpoint did at start, by kind."
    )


class Batch(ApiModel):
    time: datetime
    kind: str = Field(
        description="live; catch-up (started an interval or more late, backpressure off); "
        "replayed (re-run from the checkpoint after a restart)."
    )
    coalesced_batches: int = Field(
        ge=0,
        description="Earlier batch times merged into this batch because they fell due while "
        "the job was behind (backpressure on): they admitted nothing and wrote no output.",
    )
    records: int = Field(ge=0)
    records_by_source: dict[str, int]
    rate_limit: dict[str, float | None]
    scheduling_delay_seconds: float | None
    processing_seconds: float | None
    total_delay_seconds: float | None
    checkpoint_seconds: float | None = Field(
        description="Writing the batch record and commit marker; null without a checkpoint."
    )
    error: str | None = Field(description="Why the batch failed; null when it succeeded.")
    latency_p50_seconds: float | None = Field(
        description="End-to-end latency, median over the batch's records: from when a record "
        "became available at its source to when the batch's output committed. Null when the "
        "batch did not commit or no source knows when its records became available."
    )
    latency_p99_seconds: float | None = Field(
        description="End-to-end latency, 99th percentile over the batch's records."
    )


class Batches(ApiModel):
    batches: list[Batch] = Field(description="Completed batches, newest first.")


class StreamSummary(ApiModel):
    name: str
    slide_seconds: float = Field(gt=0)
    retain_seconds: float = Field(ge=0, description="How long the stream's RDDs are kept.")
    retained_batches: int = Field(ge=0)
    oldest: datetime | None
    newest: datetime | None


class Streams(ApiModel):
    streams: list[StreamSummary]


class TopEntry(ApiModel):
    key: Any
    value: float


class SliceResult(ApiModel):
    stream: str
    batch_times: list[datetime] = Field(description="The retained batches the query covered.")
    combine: Literal["sum", "latest"]
    top: list[TopEntry] | None = Field(
        description="With `top`: the K keys with the largest values, largest first."
    )
    count: int | None = Field(ge=0, description="Without `top`: records in those batches.")
    sample: list[Any] | None = Field(description="Without `top`: up to `limit` records.")


class StopAccepted(ApiModel):
    stopping: Literal[True] = True
    state: str


class ErrorDetail(ApiModel):
    detail: str
