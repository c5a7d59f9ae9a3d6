"""The StreamingJob specification: the one model of a job that the CLI, driver, API and operator share.

A manifest is the same YAML for `dstream run` (local) and `kubectl apply` (cluster). Field names are
camelCase as in every Kubernetes resource; Python code uses the snake_case attributes.
The CRD schema in `crds/streamingjob.yaml` is generated from these classes.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from dstream.pod_spec import PodSettings

API_VERSION = "dstream.dev/v1alpha1"
KIND = "StreamingJob"

DURATION_PATTERN = r"^[1-9][0-9]*(ms|s|m|h)$"
MEMORY_PATTERN = r"^[1-9][0-9]*[kmgt]$"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
# DNS subdomain (a Secret's name) and a Secret's data key, as Kubernetes validates them.
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# Unquoted SQL identifiers only: what the user writes is what psql shows, no case surprises.
SQL_NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"
SQL_TABLE_PATTERN = r"^([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$"

Duration = Annotated[str, Field(pattern=DURATION_PATTERN, description="e.g. 500ms, 1s, 30s, 5m")]
Memory = Annotated[str, Field(pattern=MEMORY_PATTERN, description="Spark notation, e.g. 512m, 1g")]

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def duration_ms(text: str) -> int:
    """Milliseconds in a duration string such as '500ms' or '30s'."""
    match = re.fullmatch(DURATION_PATTERN, text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 500ms, 1s, 30s, 5m)")
    return int(text[: match.start(1)]) * _UNIT_MS[match.group(1)]


class SpecModel(BaseModel):
    """Base of every spec block: camelCase names, unknown fields rejected (typos must not pass)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class WordcountArgs(SpecModel):
    window: Duration | None = None
    slide: Duration | None = None


class GrepArgs(SpecModel):
    pattern: str = Field(min_length=1)

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"not a regular expression ({error})") from None
        return pattern


class TopkArgs(SpecModel):
    k: int = Field(10, ge=1)
    window: Duration = "30s"
    slide: Duration | None = None


class SessionsArgs(SpecModel):
    timeout: Duration = "30s"


BUILTIN_ARGS: dict[str, type[SpecModel]] = {
    "wordcount": WordcountArgs,
    "grep": GrepArgs,
    "topk": TopkArgs,
    "sessions": SessionsArgs,
}


class App(SpecModel):
    """What computes: exactly one of a built-in app or a user module `pkg.mod:build`."""

    builtin: Literal["wordcount", "grep", "topk", "sessions"] | None = None
    module: str | None = Field(None, pattern=MODULE_PATTERN)
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("args")
    @classmethod
    def _args_fit_builtin(cls, args: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        builtin = info.data.get("builtin")
        if builtin is not None:
            try:
                BUILTIN_ARGS[builtin].model_validate(args)
            except ValidationError as error:
                raise ValueError("; ".join(problems_of(error))) from None
        return args

    @model_validator(mode="after")
    def _one_app(self) -> App:
        if (self.builtin is None) == (self.module is None):
            raise ValueError("set exactly one of builtin or module")
        return self

    def builtin_args(self) -> SpecModel:
        """The validated arguments of the built-in app."""
        assert self.builtin is not None
        return BUILTIN_ARGS[self.builtin].model_validate(self.args)

    @property
    def counts(self) -> bool:
        """Whether the app is a built-in whose output is (key, count) pairs: the console sink
        shows those largest first (it sits below the apps, so it reads this here)."""
        return self.builtin in ("wordcount", "topk", "sessions")


class RateSource(SpecModel):
    """Deterministic text lines: the same offsets always yield the same records."""

    records_per_second: int = Field(ge=1)
    partitions: int = Field(2, ge=1)
    seed: int = Field(0, ge=0)
    record_bytes: int = Field(100, ge=8, le=65536)


class FilesSource(SpecModel):
    """New files in a directory, in name order; `.`/`_`-prefixed names are ignored."""

    path: str = Field(min_length=1)
    format: Literal["text", "json"] = "text"


class SecretKeyRef(SpecModel):
    """A password kept in a Kubernetes Secret of the job's namespace, never in the spec.

    On Kubernetes the operator puts it into the driver's and executors' environment as
    `password_env(<connector type>)`; `dstream run` reads that same variable.
    """

    name: str = Field(pattern=SECRET_NAME_PATTERN, max_length=253)
    key: str = Field(pattern=SECRET_KEY_PATTERN, max_length=253)


def password_env(connector: str) -> str:
    """The environment variable that carries a connector's password: DSTREAM_<TYPE>_PASSWORD.
    A job has one source and one sink, so the connector type names it without ambiguity."""
    return f"DSTREAM_{connector.upper()}_PASSWORD"


def secret_env(spec: JobSpec) -> dict[str, SecretKeyRef]:
    """Environment variable -> Secret key, for every connector block of the job with a
    `passwordSecret` (the operator's view of the spec's credentials)."""
    found: dict[str, SecretKeyRef] = {}
    for selector in (spec.source, spec.sink):
        block = getattr(selector, selector.type, None)
        secret = getattr(block, "password_secret", None)
        if secret is not None:
            found[password_env(selector.type)] = secret
    return found


def _url_without_password(url: str) -> str:
    if urlsplit(url).password is not None:
        raise ValueError("holds a password; put it in a Secret and name it in passwordSecret")
    return url


UrlWithoutPassword = Annotated[str, AfterValidator(_url_without_password)]
REDIS_URL_PATTERN = r"^(redis|rediss|unix)://"
NATS_URL_PATTERN = r"^(nats|tls|ws|wss)://"
StartFrom = Literal["earliest", "latest"]


class RedisSource(SpecModel):
    """Redis Streams (Redis 7 or later): each batch is a recorded entry-ID range per stream."""

    url: UrlWithoutPassword = Field(
        pattern=REDIS_URL_PATTERN, description="e.g. redis://127.0.0.1:6379/0"
    )
    streams: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    field: str | None = Field(
        None, min_length=1, description="Entry field holding the record; unset: all fields."
    )
    start_from: StartFrom = "earliest"
    password_secret: SecretKeyRef | None = None

    @field_validator("streams")
    @classmethod
    def _distinct(cls, streams: list[str]) -> list[str]:
        if len(set(streams)) != len(streams):
            raise ValueError("a stream is listed twice")
        return streams


class NatsSource(SpecModel):
    """NATS JetStream: each batch is a recorded range of stream sequence numbers."""

    url: UrlWithoutPassword = Field(
        pattern=NATS_URL_PATTERN, description="e.g. nats://127.0.0.1:4222"
    )
    stream: str = Field(min_length=1, pattern=r"^[^.*>\s]+$")
    subjects: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Read only messages on these subjects (wildcards ok)."
    )
    start_from: StartFrom = "earliest"
    password_secret: SecretKeyRef | None = None


# host:port[,host:port...]
KAFKA_SERVERS_PATTERN = r"^[^,:\s]+:[0-9]{1,5}(,[^,:\s]+:[0-9]{1,5})*$"
# Client properties the connector sets itself: a passed-through value would break its guarantees
# (isolation, idempotence, transactions, offsets) or put a password into the spec.
KAFKA_OWN_PROPERTIES = {
    "bootstrap.servers",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "group.id",
    "isolation.level",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "enable.partition.eof",
    "enable.idempotence",
    "transactional.id",
    "acks",
}


class KafkaConnection(SpecModel):
    """How to reach and log in to a Kafka cluster: shared by the source and the sink."""

    bootstrap_servers: str = Field(
        pattern=KAFKA_SERVERS_PATTERN, description="host:port[,host:port...]"
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    username: str | None = Field(None, min_length=1, description="SASL user")
    password_secret: SecretKeyRef | None = None
    client_properties: dict[str, str] = Field(
        default_factory=dict,
        description="librdkafka client properties passed through (e.g. ssl.ca.location, "
        "fetch.max.bytes); the ones the connector sets itself are refused.",
    )

    @field_validator("client_properties")
    @classmethod
    def _not_our_own(cls, properties: dict[str, str]) -> dict[str, str]:
        own = sorted(KAFKA_OWN_PROPERTIES & set(properties))
        if own:
            raise ValueError(
                f"{own[0]!r} is set by the connector (use its own field, or passwordSecret)"
            )
        return properties

    @model_validator(mode="after")
    def _sasl_complete(self) -> KafkaConnection:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and (self.sasl_mechanism is None or self.username is None):
            raise ValueError(
                f"securityProtocol {self.security_protocol} needs saslMechanism and username"
            )
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError(
                f"saslMechanism needs a SASL_ securityProtocol, not {self.security_protocol}"
            )
        return self


def starting_offsets(text: str) -> str | datetime | dict[str, dict[int, int]]:
    """`earliest`, `latest`, an RFC 3339 timestamp (the first offset at or after it), or per
    partition offsets as Structured Streaming writes them: `{"topic": {"0": 23, "1": -2}}` with
    -2 for earliest and -1 for latest."""
    if text in ("earliest", "latest"):
        return text
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
            return {
                topic: {int(partition): int(offset) for partition, offset in offsets.items()}
                for topic, offsets in parsed.items()
            }
        except (ValueError, AttributeError, TypeError):
            raise ValueError(
                'per-partition offsets must be JSON like {"topic": {"0": 23, "1": -2}}'
            ) from None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            "expected earliest, latest, a timestamp such as 2026-01-31T12:00:00Z, or JSON "
            'offsets such as {"topic": {"0": 23}}'
        ) from None
    if moment.tzinfo is None:
        raise ValueError("the timestamp needs a time zone (e.g. a final Z for UTC)")
    return moment


class KafkaSource(KafkaConnection):
    """Apache Kafka: each batch is a recorded offset range [from, until) per topic-partition."""

    topics: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)
    topic_pattern: str | None = Field(
        None, min_length=1, description="Regular expression over topic names (whole name)."
    )
    starting_offsets: str = Field(
        "earliest",
        description="Without a checkpoint: earliest, latest, an RFC 3339 timestamp, or JSON "
        'offsets per partition {"topic": {"0": 23}} (-2 earliest, -1 latest).',
    )
    isolation: Literal["read_committed", "read_uncommitted"] = "read_committed"
    max_records_per_partition: int | None = Field(
        None, ge=1, description="At most this many offsets of one partition per batch."
    )
    min_partitions: int | None = Field(
        None, ge=1, description="Split ranges so a batch has at least this many tasks."
    )
    format: Literal["text", "json"] = "text"
    on_data_loss: Literal["fail", "skip"] = Field(
        "fail",
        description="A recorded or planned range that retention removed: stop the job, or "
        "count, log and skip it.",
    )
    group_id: str | None = Field(
        None,
        min_length=1,
        description="Consumer group the committed offsets are reported to (for lag tools "
        "only; default dstream-<job>).",
    )

    @field_validator("topic_pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"not a regular expression ({error})") from None
        return pattern

    @field_validator("starting_offsets")
    @classmethod
    def _parses(cls, text: str) -> str:
        starting_offsets(text)
        return text

    @model_validator(mode="after")
    def _topics_or_pattern(self) -> KafkaSource:
        if (self.topics is None) == (self.topic_pattern is None):
            raise ValueError("set exactly one of topics or topicPattern")
        return self


class Source(SpecModel):
    type: Literal["rate", "files", "redis", "nats", "kafka"]
    rate: RateSource | None = None
    files: FilesSource | None = None
    redis: RedisSource | None = None
    nats: NatsSource | None = None
    kafka: KafkaSource | None = None

    @model_validator(mode="after")
    def _block_for_type(self) -> Source:
        _require_block(self, self.type, ("rate", "files", "redis", "nats", "kafka"))
        return self


class FilesSink(SpecModel):
    path: str = Field(min_length=1)


class ConsoleSink(SpecModel):
    num: int = Field(10, ge=1)


class PostgresSink(SpecModel):
    """Each batch's records and its commit row in one PostgreSQL transaction (exactly-once)."""

    dsn: str = Field(
        min_length=1,
        description="libpq connection string or URI, without a password (use passwordSecret)",
    )
    table: str = Field(pattern=SQL_TABLE_PATTERN, description="table or schema.table")
    mode: Literal["append", "upsert"] = "append"
    key_columns: list[Annotated[str, Field(pattern=SQL_NAME_PATTERN)]] = Field(
        default_factory=lambda: ["key"],
        min_length=1,
        description="upsert: the columns that identify a row",
    )
    password_secret: SecretKeyRef | None = None

    @field_validator("dsn")
    @classmethod
    def _no_password(cls, dsn: str) -> str:
        if _dsn_has_password(dsn):
            raise ValueError("holds a password; put it in a Secret and name it in passwordSecret")
        return dsn


def _dsn_has_password(dsn: str) -> bool:
    """A password in either libpq form: `postgresql://user:pw@host?password=pw` or `password=pw`."""
    if re.match(r"^postgres(ql)?://", dsn):
        url = urlsplit(dsn)
        userinfo = url.netloc.rpartition("@")[0]
        return ":" in userinfo or "password" in {name.lower() for name in parse_qs(url.query)}
    return re.search(r"(^|\s)password\s*=", dsn, re.IGNORECASE) is not None


class KafkaSink(KafkaConnection):
    """Each batch into a Kafka topic, in one transaction with its commit marker (exactly once)."""

    topic: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]{1,249}$")
    delivery: Literal["exactlyOnce", "atLeastOnce"] = Field(
        "exactlyOnce",
        description="exactlyOnce: one transaction per batch; atLeastOnce: idempotent producer, "
        "no transactions (a re-run batch is written again).",
    )
    format: Literal["json", "text"] = Field("json", description="How a record's value is written.")
    key_field: str | None = Field(
        None, min_length=1, description="A dict record's field written as the message key."
    )
    commit_topic: str = Field(
        "dstream-commits",
        pattern=r"^[A-Za-z0-9._-]{1,249}$",
        description="exactlyOnce: the compacted topic where each batch's commit record goes, "
        "in the batch's transaction (created when missing).",
    )


class Sink(SpecModel):
    type: Literal["files", "console", "postgres", "kafka"]
    files: FilesSink | None = None
    console: ConsoleSink | None = None
    postgres: PostgresSink | None = None
    kafka: KafkaSink | None = None

    @model_validator(mode="after")
    def _block_for_type(self) -> Sink:
        _require_block(self, self.type, ("files", "postgres", "kafka"))
        return self


def _require_block(model: BaseModel, chosen: str, need_block: tuple[str, ...]) -> None:
    """A `type: X` selector needs its `X:` block when X takes settings, and no other block."""
    if chosen in need_block and getattr(model, chosen) is None:
        raise ValueError(f"type is {chosen!r} but the {chosen!r} block is missing")
    for other in type(model).model_fields:
        if other not in ("type", chosen) and getattr(model, other) is not None:
            raise ValueError(f"type is {chosen!r} but a {other!r} block is given")


class Checkpoint(SpecModel):
    path: str = Field(min_length=1)
    interval: Duration | None = None
    delete_on_job_deletion: bool = False


class Pid(SpecModel):
    proportional: float = Field(1.0, ge=0)
    integral: float = Field(0.2, ge=0)
    derivative: float = Field(0.0, ge=0)


class Backpressure(SpecModel):
    enabled: bool = True
    initial_rate: int | None = Field(None, ge=1)
    min_rate: int = Field(100, ge=1)
    max_rate: int | None = Field(None, ge=1)
    max_step: float = Field(2.0, gt=1)
    pid: Pid = Field(default_factory=Pid)

    @model_validator(mode="after")
    def _rate_order(self) -> Backpressure:
        if self.max_rate is not None and self.max_rate < self.min_rate:
            raise ValueError("maxRate must be at least minRate")
        return self


class Speculation(SpecModel):
    enabled: bool = True
    multiplier: float = Field(1.4, ge=1.0)
    quantile: float = Field(0.75, gt=0, le=1)


class DisruptionBudget(SpecModel):
    """A PodDisruptionBudget for the job's drivers or executors (Kubernetes): how many of them a
    voluntary disruption, such as a node drain, may evict at a time."""

    enabled: bool = True
    max_unavailable: int = Field(
        1, ge=0, description="0: a drain waits until the pods are moved by hand."
    )


class Driver(PodSettings):
    """The driver pod: its resources and pod customisation."""

    cores: int = Field(1, ge=1)
    memory: Memory = "1g"
    disruption_budget: DisruptionBudget = Field(default_factory=DisruptionBudget)
    standby: bool = Field(
        False,
        description="Run a second driver, with its own executors, that follows the checkpoint "
        "and takes over within seconds when the leading one dies; the job's Lease elects.",
    )


class Executor(PodSettings):
    """The executor pods: count, resources and pod customisation (a Spark pod template)."""

    instances: int = Field(2, ge=1)
    cores: int = Field(1, ge=1)
    memory: Memory = "1g"
    disruption_budget: DisruptionBudget = Field(default_factory=DisruptionBudget)


class PersistentVolumeClaimRef(SpecModel):
    claim_name: str = Field(pattern=NAME_PATTERN)
    read_only: bool = False


class HostPathRef(SpecModel):
    path: str = Field(pattern=r"^/")


class Volume(SpecModel):
    """Storage mounted into the driver and every executor (checkpoints and file sinks need it)."""

    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    mount_path: str = Field(pattern=r"^/")
    persistent_volume_claim: PersistentVolumeClaimRef | None = None
    host_path: HostPathRef | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Volume:
        if (self.persistent_volume_claim is None) == (self.host_path is None):
            raise ValueError("set exactly one of persistentVolumeClaim or hostPath")
        return self


class RestartPolicy(SpecModel):
    """Replacing a lost driver: the first restart at once, then backoff (doubled, capped)."""

    type: Literal["Always", "OnFailure", "Never"] = "Always"
    max_restarts: int = Field(10, ge=0)
    backoff_seconds: int = Field(10, ge=1)
    max_backoff_seconds: int = Field(300, ge=1)
    reset_after_seconds: int = Field(
        600,
        ge=0,
        description="A driver ready this long resets the restart count (and so the backoff); "
        "0: never.",
    )


class Upgrade(SpecModel):
    """What the operator does when a changed spec's driver keeps failing (Kubernetes)."""

    rollback_on_failure: bool = Field(
        True,
        description="Run the last spec that committed a batch again when a changed spec's "
        "driver fails rollbackAfterFailures times before committing its first batch; the "
        "checkpoint is kept.",
    )
    rollback_after_failures: int = Field(2, ge=1)


class FailurePolicy(SpecModel):
    """A failed batch output: retried, then the driver stops uncommitted (failure.py)."""

    retries: int = Field(5, ge=0, description="Times a failed output is run again.")
    backoff_seconds: float = Field(
        1.0, gt=0, description="Wait before the first retry; doubled before each next one."
    )
    on_exhausted: Literal["stop", "skip"] = Field(
        "stop",
        description="stop: end the driver, batch uncommitted (exit code 5); skip: commit it with "
        "its error and its input ranges recorded as skipped.",
    )


class StateStore(SpecModel):
    """Where keyed state lives (docs/state.md): mapWithState's state store, in each task's
    memory or in an embedded RocksDB on the executors' local disk."""

    store: Literal["memory", "rocksdb"] = Field(
        "memory",
        description="memory: a dict per partition in the Python worker; rocksdb: a RocksDB per "
        "partition on the executor's disk, for state larger than memory.",
    )
    memory_mb: int = Field(
        64,
        ge=1,
        alias="memoryMB",
        description="rocksdb: MB of block cache and memtables per Python worker (one per "
        "running task), shared by the stores it opens.",
    )
    snapshot_interval: int = Field(
        10, ge=1, description="Batches between snapshots; each batch writes its changes."
    )
    local_dir: str | None = Field(
        None,
        pattern=r"^/",
        description="rocksdb: the executors' directory for the stores; default: Spark's local "
        "directory.",
    )


class JobSpec(SpecModel):
    batch_interval: Duration
    app: App
    source: Source
    sink: Sink = Field(default_factory=lambda: Sink(type="console"))
    checkpoint: Checkpoint | None = None
    backpressure: Backpressure = Field(default_factory=Backpressure)
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    state: StateStore = Field(default_factory=StateStore)
    speculation: Speculation = Field(default_factory=Speculation)
    driver: Driver = Field(default_factory=Driver)
    executor: Executor = Field(default_factory=Executor)
    image: str | None = Field(
        None,
        min_length=1,
        description="The image of the driver and executors (Kubernetes); unset: the operator's "
        "own, so that a job runs the version of the operator that runs it.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    volumes: list[Volume] = Field(default_factory=list)
    spark_conf: dict[str, str] = Field(default_factory=dict)
    restart_policy: RestartPolicy = Field(default_factory=RestartPolicy)
    upgrade: Upgrade = Field(default_factory=Upgrade)
    suspend: bool = False

    @property
    def batch_interval_ms(self) -> int:
        return duration_ms(self.batch_interval)

    @model_validator(mode="after")
    def _one_kafka_password(self) -> JobSpec:
        """A Kafka source and a Kafka sink share DSTREAM_KAFKA_PASSWORD (password_env)."""
        source, sink = self.source.kafka, self.sink.kafka
        if source and sink and source.password_secret and sink.password_secret:
            if source.password_secret != sink.password_secret:
                raise ValueError(
                    "source.kafka and sink.kafka name different passwordSecrets, but both are "
                    f"passed as {password_env('kafka')}: use one Secret (or one login) for both"
                )
        return self


class Metadata(BaseModel):
    """Kubernetes object metadata: only the name is ours to check; the rest belongs to the API."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    namespace: str | None = None


class StreamingJob(SpecModel):
    api_version: Literal["dstream.dev/v1alpha1"]
    kind: Literal["StreamingJob"]
    metadata: Metadata
    spec: JobSpec


class SpecError(ValueError):
    """A manifest that is not a valid StreamingJob; `problems` are 'field.path: reason' lines."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(
            f"{source}: invalid StreamingJob\n" + "\n".join(f"  {p}" for p in problems)
        )


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith("function-"):
            continue
        else:
            path += ("." if path else "") + str(part)
    return path or "(document)"


def problems_of(error: ValidationError) -> list[str]:
    """'field.path: reason' for each pydantic error, with manifest (camelCase) field names."""
    return [f"{_field_path(e['loc'])}: {e['msg']}" for e in error.errors()]


def parse_job(document: Any, source: str = "<manifest>") -> StreamingJob:
    """Validate a loaded manifest; raises SpecError naming every wrong field."""
    if not isinstance(document, dict):
        raise SpecError(
            source, ["(document): expected a mapping with apiVersion, kind, metadata, spec"]
        )
    try:
        return StreamingJob.model_validate(document)
    except ValidationError as error:
        raise SpecError(source, problems_of(error)) from None


def load_job(path: str | Path) -> StreamingJob:
    """Read and validate a StreamingJob manifest file (the first StreamingJob in a multi-doc YAML)."""
    text = Path(path).read_text()
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise SpecError(str(path), [f"(document): not valid YAML: {error}"]) from None
    jobs = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    if not jobs:
        if len(documents) == 1:
            return parse_job(documents[0], str(path))
        raise SpecError(str(path), [f"(document): no document of kind {KIND}"])
    return parse_job(jobs[0], str(path))
