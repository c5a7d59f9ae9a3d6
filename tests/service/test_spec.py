"""The StreamingJob model: durations, defaults, and errors that name the wrong field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from dstream.spec import (
    SecretKeyRef,
    SpecError,
    duration_ms,
    load_job,
    parse_job,
    password_env,
    secret_env,
)

WORDCOUNT = yaml.safe_load((Path(__file__).parents[2] / "examples" / "wordcount.yaml").read_text())


def with_change(path: str, value) -> dict:
    """The wordcount example with one field (dotted path) set to `value` (or removed if None)."""
    document = copy.deepcopy(WORDCOUNT)
    *parents, leaf = path.split(".")
    node = document
    for key in parents:
        node = node[key]
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return document


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("1s", 1000), ("30s", 30_000), ("5m", 300_000), ("1h", 3_600_000)],
)
def test_durations(text, ms):
    assert duration_ms(text) == ms


@pytest.mark.parametrize("text", ["0s", "1.5s", "1 s", "s", "10", "-1s", "1d"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="not a duration"):
        duration_ms(text)


def test_defaults_fill_an_minimal_job():
    job = parse_job(
        {
            "apiVersion": "dstream.dev/v1alpha1",
            "kind": "StreamingJob",
            "metadata": {"name": "tiny"},
            "spec": {
                "batchInterval": "2s",
                "app": {"builtin": "grep", "args": {"pattern": "ab"}},
                "source": {"type": "rate", "rate": {"recordsPerSecond": 10}},
            },
        }
    )
    spec = job.spec
    assert spec.batch_interval_ms == 2000
    assert spec.sink.type == "console"
    assert spec.backpressure.pid.proportional == 1.0 and spec.backpressure.min_rate == 100
    assert spec.speculation.enabled and spec.speculation.multiplier == 1.4
    assert spec.restart_policy.type == "Always"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.batchInterval", "1 sec", "spec.batchInterval: String should match pattern"),
        (
            "spec.source.rate.recordsPerSecond",
            0,
            "spec.source.rate.recordsPerSecond: Input should be greater",
        ),
        (
            "spec.source.type",
            "kinesis",
            "spec.source.type: Input should be 'rate', 'files', 'redis', 'nats' or 'kafka'",
        ),
        (
            "spec.source.rate",
            None,
            "spec.source: Value error, type is 'rate' but the 'rate' block is missing",
        ),
        (
            "spec.app.args",
            {"window": "x"},
            "spec.app.args: Value error, window: String should match",
        ),
        (
            "spec.app.module",
            "pkg.mod:build",
            "spec.app: Value error, set exactly one of builtin or module",
        ),
        ("spec.executor.memory", "1GB", "spec.executor.memory: String should match pattern"),
        ("spec.checkpoint.path", None, "spec.checkpoint.path: Field required"),
        ("spec.state", {"store": "leveldb"}, "spec.state.store: Input should be 'memory' or"),
        ("spec.state", {"memoryMB": 0}, "spec.state.memoryMB: Input should be greater"),
        ("spec.state", {"localDir": "state"}, "spec.state.localDir: String should match"),
        ("spec.bogus", 1, "spec.bogus: Extra inputs are not permitted"),
        ("metadata.name", "Not_A_Name", "metadata.name: String should match pattern"),
        ("kind", "Job", "kind: Input should be 'StreamingJob'"),
    ],
)
def test_invalid_specs_name_the_field(path, value, message):
    with pytest.raises(SpecError) as caught:
        parse_job(with_change(path, value))
    assert any(problem.startswith(message) for problem in caught.value.problems), (
        caught.value.problems
    )


def test_a_grep_pattern_that_does_not_compile_is_rejected():
    with pytest.raises(SpecError) as caught:
        parse_job(with_change("spec.app", {"builtin": "grep", "args": {"pattern": "(ab"}}))
    assert caught.value.problems == [
        "spec.app.args: Value error, pattern: Value error, not a regular expression "
        "(missing ), unterminated subpattern at position 0)"
    ]


def test_load_job_reports_yaml_errors_and_missing_kind(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_job(broken)
    two = tmp_path / "two.yaml"
    two.write_text("kind: A\n---\nkind: B\n")
    with pytest.raises(SpecError, match="no document of kind StreamingJob"):
        load_job(two)


def postgres_sink(**fields) -> dict:
    return with_change(
        "spec.sink", {"type": "postgres", "postgres": {"dsn": "host=db user=app", **fields}}
    )


def test_a_postgres_sink_with_a_secret_maps_to_one_environment_variable():
    job = parse_job(
        postgres_sink(
            table="analytics.counts",
            mode="upsert",
            passwordSecret={"name": "pg-credentials", "key": "password"},
        )
    )
    postgres = job.spec.sink.postgres
    assert (postgres.table, postgres.mode, postgres.key_columns) == (
        "analytics.counts",
        "upsert",
        ["key"],
    )
    assert password_env("postgres") == "DSTREAM_POSTGRES_PASSWORD"
    assert secret_env(job.spec) == {
        "DSTREAM_POSTGRES_PASSWORD": SecretKeyRef(name="pg-credentials", key="password")
    }
    assert secret_env(parse_job(WORDCOUNT).spec) == {}


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app:hunter2@db:5432/counts",
        "postgres://db/counts?user=app&password=hunter2",
        "host=db user=app password=hunter2",
        "host=db PASSWORD = hunter2",
    ],
)
def test_a_password_in_the_dsn_is_rejected(dsn):
    with pytest.raises(SpecError, match=r"spec\.sink\.postgres\.dsn: .*passwordSecret"):
        parse_job(postgres_sink(dsn=dsn, table="counts"))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"table": "Counts"}, "spec.sink.postgres.table"),
        ({"table": "counts; drop table x"}, "spec.sink.postgres.table"),
        ({"table": "counts", "mode": "merge"}, "spec.sink.postgres.mode"),
        ({"table": "counts", "keyColumns": []}, "spec.sink.postgres.keyColumns"),
        (
            {"table": "counts", "passwordSecret": {"name": "Pg", "key": "p"}},
            "spec.sink.postgres.passwordSecret.name",
        ),
        (
            {"table": "counts", "passwordSecret": {"name": "pg"}},
            "spec.sink.postgres.passwordSecret.key",
        ),
    ],
)
def test_bad_postgres_settings_name_the_field(fields, field):
    with pytest.raises(SpecError) as error:
        parse_job(postgres_sink(**fields))
    assert any(problem.startswith(field) for problem in error.value.problems), error.value


def broker_source(kind: str, **fields) -> dict:
    return with_change("spec.source", {"type": kind, kind: fields})


def test_redis_and_nats_sources_with_their_defaults_and_secrets():
    redis = parse_job(
        broker_source(
            "redis",
            url="redis://127.0.0.1:6379/0",
            streams=["events"],
            passwordSecret={"name": "redis-auth", "key": "password"},
        )
    ).spec
    assert (redis.source.redis.field, redis.source.redis.start_from) == (None, "earliest")
    assert secret_env(redis) == {
        "DSTREAM_REDIS_PASSWORD": SecretKeyRef(name="redis-auth", key="password")
    }
    nats = parse_job(broker_source("nats", url="nats://127.0.0.1:4222", stream="EVENTS")).spec
    assert (nats.source.nats.subjects, nats.source.nats.start_from) == ([], "earliest")


@pytest.mark.parametrize(
    ("kind", "fields", "field"),
    [
        ("redis", {"url": "http://h", "streams": ["a"]}, "spec.source.redis.url"),
        ("redis", {"url": "redis://u:pw@h/0", "streams": ["a"]}, "spec.source.redis.url"),
        ("redis", {"url": "redis://h/0", "streams": []}, "spec.source.redis.streams"),
        ("redis", {"url": "redis://h/0", "streams": ["a", "a"]}, "spec.source.redis.streams"),
        ("redis", {"url": "redis://h/0", "streams": ["a"], "field": ""}, "spec.source.redis.field"),
        (
            "redis",
            {"url": "redis://h/0", "streams": ["a"], "startFrom": "now"},
            "spec.source.redis.startFrom",
        ),
        ("nats", {"url": "nats://h:4222", "stream": "A.B"}, "spec.source.nats.stream"),
        ("nats", {"url": "nats://u:pw@h:4222", "stream": "A"}, "spec.source.nats.url"),
        ("nats", {"url": "nats://h:4222"}, "spec.source.nats.stream"),
    ],
)
def test_bad_broker_settings_name_the_field(kind, fields, field):
    with pytest.raises(SpecError) as error:
        parse_job(broker_source(kind, **fields))
    assert any(problem.startswith(field) for problem in error.value.problems), error.value


def test_the_failure_policy_defaults_to_retrying_then_stopping():
    policy = parse_job(WORDCOUNT).spec.failure_policy
    assert (policy.retries, policy.backoff_seconds, policy.on_exhausted) == (5, 1.0, "stop")


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"retries": -1}, "spec.failurePolicy.retries"),
        ({"backoffSeconds": 0}, "spec.failurePolicy.backoffSeconds"),
        ({"onExhausted": "ignore"}, "spec.failurePolicy.onExhausted"),
        ({"retry": 3}, "spec.failurePolicy.retry"),
    ],
)
def test_a_bad_failure_policy_names_the_field(policy, field):
    with pytest.raises(SpecError) as error:
        parse_job(with_change("spec.failurePolicy", policy))
    assert any(problem.startswith(field) for problem in error.value.problems), error.value


def test_the_state_block_selects_the_store_through_spark_settings():
    from dstream.service.job import spark_conf

    assert parse_job(WORDCOUNT).spec.state.store == "memory"
    job = parse_job(
        with_change(
            "spec.state",
            {"store": "rocksdb", "memoryMB": 256, "snapshotInterval": 5, "localDir": "/mnt/s"},
        )
    )
    conf = spark_conf(job, "local[2]", {})
    assert [conf.get(f"spark.dstream.state.{key}") for key in ("store", "memoryMB")] == [
        "rocksdb",
        "256",
    ]
    assert conf.get("spark.dstream.state.snapshotInterval") == "5"
    assert conf.get("spark.dstream.state.localDir") == "/mnt/s"
    overridden = with_change("spec.sparkConf", {"spark.dstream.state.store": "memory"})
    assert spark_conf(parse_job(overridden), "local[2]", {}).get("spark.dstream.state.store") == (
        "memory"
    )
