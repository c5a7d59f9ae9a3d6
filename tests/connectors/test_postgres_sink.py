"""The PostgreSQL sink against a real server: exactly-once per batch, table checks, bad records,
a server that goes away, and the password from the environment."""

from __future__ import annotations

import operator
import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from conditions import eventually
from dstream.connectors.postgres import COMMIT_TABLE, PostgresSink, TableMismatchError
from dstream.runtime.control.failure import FailurePolicy
from dstream.service.job import build_context
from dstream.spec import PostgresSink as PostgresSettings
from dstream.spec import StreamingJob, parse_job, password_env
from postgres_server import SECRET_PASSWORD, SECRET_ROLE, PostgresServer, running_postgres
from streams import final_failure, manual_context, run_batches

JOB = "pgtest"


@pytest.fixture(scope="session")
def postgres():
    yield from running_postgres()


@pytest.fixture
def table(request) -> str:
    """A table name of its own for each test (the server is shared)."""
    return re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:50]


def query(server: PostgresServer, statement: str, *params) -> list[tuple]:
    with psycopg.connect(server.dsn()) as conn:
        return conn.execute(statement, params).fetchall()


def execute(server: PostgresServer, statement: str) -> None:
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(statement)


def commits(server: PostgresServer, table: str) -> list[tuple]:
    """The commit rows of a table; none while the sink has yet to commit its first batch (it
    creates the commit table in the batch's own transaction)."""
    if query(server, "SELECT to_regclass(%s)", COMMIT_TABLE) == [(None,)]:
        return []
    return query(
        server,
        f"SELECT output, batch_time, rows, rejected FROM {COMMIT_TABLE}"
        " WHERE job = %s AND target = %s ORDER BY batch_time, output",
        JOB,
        table,
    )


def sink(server: PostgresServer, table: str, mode: str = "append", **extra) -> PostgresSink:
    settings = PostgresSettings(dsn=server.dsn(), table=table, mode=mode, **extra)
    return PostgresSink(JOB, settings)


def at(seconds: int) -> datetime:
    """A batch time as the engine hands it to sinks (local, naive)."""
    return datetime.fromtimestamp(seconds)


def utc(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def test_append_writes_each_batch_with_its_time(sc, postgres, table):
    ssc = manual_context(sc)
    batches = [[("a", 1), ("b", 2)], [("a", 3)]]
    ssc.queueStream(batches).foreachRDD(sink(postgres, table))
    run_batches(ssc, 2)
    rows = query(postgres, f"SELECT key, value, batch_time FROM {table} ORDER BY batch_time, key")
    first, second = sorted({r[2] for r in rows})
    assert [(k, v) for k, v, t in rows if t == first] == [("a", 1), ("b", 2)]
    assert [(k, v) for k, v, t in rows if t == second] == [("a", 3)]
    assert (second - first).total_seconds() == 1
    assert [(c[2], c[3]) for c in commits(postgres, table)] == [(2, 0), (1, 0)]
    types = query(
        postgres,
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
        table,
    )
    assert dict(types) == {
        "key": "text",
        "value": "bigint",
        "batch_time": "timestamp with time zone",
    }


def test_upsert_keeps_the_latest_state_per_key(sc, postgres, table):
    ssc = manual_context(sc)
    words = ssc.queueStream([[("a", 1), ("b", 1)], [("a", 1)], [("c", 1), ("a", 1)]])
    totals = words.reduceByKey(operator.add).updateStateByKey(
        lambda new, old: sum(new) + (old or 0)
    )
    totals.foreachRDD(sink(postgres, table, mode="upsert"))
    run_batches(ssc, 3)
    rows = query(postgres, f"SELECT key, value FROM {table} ORDER BY key")
    assert rows == [("a", 3), ("b", 1), ("c", 1)]
    # The state stream carries every key each batch: all rows hold the last batch's time.
    times = query(postgres, f"SELECT DISTINCT batch_time FROM {table}")
    assert times == [(commits(postgres, table)[-1][1],)]
    assert len(commits(postgres, table)) == 3
    primary = query(
        postgres,
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
        " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
        table,
    )
    assert primary == [("key",)]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_batch_run_again_changes_nothing(sc, postgres, table, mode):
    output = sink(postgres, table, mode=mode)
    output(at(1000), sc.parallelize([("a", 1), ("b", 2)]))
    before = query(postgres, f"SELECT key, value, batch_time FROM {table} ORDER BY key")
    # The re-run after a crash recomputes the same batch (here: even with other values).
    output(at(1000), sc.parallelize([("a", 10), ("c", 5)]))
    assert query(postgres, f"SELECT key, value, batch_time FROM {table} ORDER BY key") == before
    assert commits(postgres, table) == [(0, utc(1000), 2, 0)]


def test_outputs_of_one_job_commit_apart(sc, postgres, table):
    first = PostgresSink(JOB, PostgresSettings(dsn=postgres.dsn(), table=table), output=0)
    second = PostgresSink(JOB, PostgresSettings(dsn=postgres.dsn(), table=table), output=1)
    first(at(1000), sc.parallelize([("a", 1)]))
    second(at(1000), sc.parallelize([("b", 2)]))
    assert query(postgres, f"SELECT key FROM {table} ORDER BY key") == [("a",), ("b",)]
    assert [c[0] for c in commits(postgres, table)] == [0, 1]


def test_dict_records_are_written_as_their_fields(sc, postgres, table):
    output = sink(postgres, table, mode="upsert", key_columns=["user"])
    output(at(1000), sc.parallelize([{"user": "u1", "events": 3, "tags": ["x"]}]))
    output(at(1001), sc.parallelize([{"user": "u1", "events": 4, "tags": []}]))
    rows = query(postgres, f'SELECT "user", events, tags, batch_time FROM {table}')
    assert rows == [("u1", 4, [], utc(1001))]


def test_once_the_tables_exist_a_role_without_create_privilege_writes(sc, postgres, table):
    sink(postgres, table)(at(1000), sc.parallelize([("a", 1)]))
    execute(postgres, f"CREATE ROLE {table}_writer LOGIN")
    execute(
        postgres,
        f"GRANT SELECT, INSERT, UPDATE ON {table}, dstream_commits, dstream_rejected,"
        f" dstream_epochs TO {table}_writer",
    )
    settings = PostgresSettings(dsn=postgres.dsn(f"{table}_writer"), table=table)
    PostgresSink(JOB, settings)(at(1001), sc.parallelize([("b", 2)]))
    assert query(postgres, f"SELECT key FROM {table} ORDER BY key") == [("a",), ("b",)]
    no_create = query(
        postgres, "SELECT has_schema_privilege(%s, 'public', 'CREATE')", f"{table}_writer"
    )
    assert no_create == [(False,)]


def test_a_table_with_wrong_columns_is_rejected_naming_the_column(sc, postgres, table):
    execute(postgres, f"CREATE TABLE {table} (key text, count bigint, batch_time timestamptz)")
    with pytest.raises(TableMismatchError, match=r"has no column 'value'"):
        sink(postgres, table)(at(1000), sc.parallelize([("a", 1), ("b", 2)]))
    assert query(postgres, f"SELECT count(*) FROM {table}") == [(0,)]
    assert commits(postgres, table) == []


def test_upsert_into_a_table_without_a_key_is_rejected(sc, postgres, table):
    execute(postgres, f"CREATE TABLE {table} (key text, value bigint, batch_time timestamptz)")
    with pytest.raises(TableMismatchError, match=r"unique index on exactly key"):
        sink(postgres, table, mode="upsert")(at(1000), sc.parallelize([("a", 1)]))
    assert commits(postgres, table) == []


def rejected(server: PostgresServer, table: str) -> list[tuple]:
    return query(
        server,
        "SELECT record, reason FROM dstream_rejected WHERE job = %s AND target = %s"
        " ORDER BY reason",
        JOB,
        table,
    )


def test_a_record_missing_a_column_is_set_aside_and_the_rest_commits(sc, postgres, table):
    output = sink(postgres, table)
    good = [{"user": "u1", "events": 3}, {"user": "u2", "events": 5}]
    bad = {"user": "u3"}
    output(at(1000), sc.parallelize([*good, bad]))
    assert query(postgres, f'SELECT "user", events FROM {table} ORDER BY 1') == [
        ("u1", 3),
        ("u2", 5),
    ]
    assert rejected(postgres, table) == [({"user": "u3"}, "missing column 'events'")]
    assert output.rejected_records == 1
    assert commits(postgres, table) == [(0, utc(1000), 2, 1)]


def test_a_value_postgres_refuses_is_set_aside_and_the_rest_commits(sc, postgres, table):
    output = sink(postgres, table)
    output(at(1000), sc.parallelize([("a", 1)]))  # creates value as bigint
    output(at(1001), sc.parallelize([("b", 2), ("c", "many"), (("x", "y"), 5), ("d", 4)]))
    assert query(postgres, f"SELECT key, value FROM {table} ORDER BY key") == [
        ("a", 1),
        ("b", 2),
        ("d", 4),
    ]
    (refused, structured) = rejected(postgres, table)  # by reason
    assert structured == ([["x", "y"], 5], "a tuple cannot go into column 'key' (text)")
    assert refused[0] == ["c", "many"]
    assert "InvalidTextRepresentation" in refused[1] and "bigint" in refused[1]
    assert commits(postgres, table)[-1] == (0, utc(1001), 2, 2)


def test_a_batch_fails_whole_when_the_server_is_down_and_commits_on_rerun(sc, postgres, table):
    output = sink(postgres, table)
    output(at(1000), sc.parallelize([("a", 1)]))
    postgres.stop()
    try:
        with pytest.raises(psycopg.OperationalError):
            output(at(1001), sc.parallelize([("b", 2), ("c", 3)]))
    finally:
        postgres.start()
    assert query(postgres, f"SELECT key FROM {table}") == [("a",)]
    output(at(1001), sc.parallelize([("b", 2), ("c", 3)]))
    assert query(postgres, f"SELECT key FROM {table} ORDER BY key") == [("a",), ("b",), ("c",)]
    assert [c[1] for c in commits(postgres, table)] == [utc(1000), utc(1001)]


def test_a_connection_lost_mid_batch_commits_nothing(sc, postgres, table):
    """The server ends the session while the batch's rows are going in (a trigger terminates
    its own backend on the third row): the first rows must not be committed."""
    execute(postgres, f"CREATE TABLE {table} (key text, value bigint, batch_time timestamptz)")
    execute(
        postgres,
        f"CREATE FUNCTION {table}_die() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF NEW.key = 'die' THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;"
        " RETURN NEW; END $$",
    )
    execute(
        postgres,
        f"CREATE TRIGGER die BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_die()",
    )
    with pytest.raises(psycopg.OperationalError):
        sink(postgres, table)(at(1000), sc.parallelize([("a", 1), ("b", 2), ("die", 3)], 1))
    assert query(postgres, f"SELECT count(*) FROM {table}") == [(0,)]
    assert commits(postgres, table) == []


def started_with_policy(sc, postgres, table, policy: FailurePolicy, batches: list) -> Any:
    ssc = manual_context(sc)
    ssc.queueStream(batches).foreachRDD(sink(postgres, table))
    ssc.start()
    ssc._scheduler.failure_policy = policy
    return ssc


def retried(ssc) -> bool:
    current = ssc._scheduler.current
    return current is not None and current.retries >= 1


def test_a_server_down_for_seconds_is_ridden_out_by_retries(sc, postgres, table):
    ssc = started_with_policy(
        sc, postgres, table, FailurePolicy(retries=6, backoff_s=0.25), [[("a", 1)], [("b", 2)]]
    )
    postgres.stop()
    try:
        ssc._clock.advance(1000)
        eventually(lambda: retried(ssc), 60, message="batch 1 retried")
    finally:
        postgres.start()
    ssc._clock.advance(1000)
    ssc._scheduler.wait_for_batch(2000, 60)
    ssc.stop(stopSparkContext=False)
    first, second = ssc._scheduler.history
    assert first.retries >= 1 and first.error is None and second.error is None
    assert query(postgres, f"SELECT key, value FROM {table} ORDER BY key") == [("a", 1), ("b", 2)]
    assert [c[1] for c in commits(postgres, table)] == [utc(1), utc(2)]


def test_a_table_that_does_not_fit_stops_the_run_uncommitted(sc, postgres, table):
    execute(postgres, f"CREATE TABLE {table} (word text, batch_time timestamptz)")
    ssc = started_with_policy(
        sc, postgres, table, FailurePolicy(retries=1, backoff_s=0.05), [[("a", 1)]]
    )
    ssc._clock.advance(1000)
    assert re.search("TableMismatchError.*no column 'key'", str(final_failure(ssc)))
    ssc.stop(stopSparkContext=False)
    (info,) = ssc._scheduler.history
    assert info.retries == 1 and not info.skipped


@pytest.fixture(scope="session")
def secret_role(postgres):
    execute(postgres, f"CREATE ROLE {SECRET_ROLE} LOGIN PASSWORD '{SECRET_PASSWORD}'")
    execute(postgres, f"CREATE SCHEMA AUTHORIZATION {SECRET_ROLE}")
    return SECRET_ROLE


def secret_sink(server: PostgresServer, table: str) -> PostgresSink:
    settings = PostgresSettings.model_validate(
        {
            "dsn": server.dsn(SECRET_ROLE),
            "table": f"{SECRET_ROLE}.{table}",
            "passwordSecret": {"name": "pg", "key": "password"},
        }
    )
    return PostgresSink(JOB, settings)


def test_the_password_comes_from_the_environment(sc, postgres, secret_role, table, monkeypatch):
    monkeypatch.setenv(password_env("postgres"), SECRET_PASSWORD)
    secret_sink(postgres, table)(at(1000), sc.parallelize([("a", 1)]))
    assert query(postgres, f"SELECT key, value FROM {SECRET_ROLE}.{table}") == [("a", 1)]
    owners = query(
        postgres, "SELECT tablename, tableowner FROM pg_tables WHERE schemaname = %s", SECRET_ROLE
    )
    assert {(table, SECRET_ROLE), ("dstream_commits", SECRET_ROLE)} <= set(owners)


def test_a_wrong_password_is_refused_by_the_server(sc, postgres, secret_role, table, monkeypatch):
    monkeypatch.setenv(password_env("postgres"), "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        secret_sink(postgres, table)(at(1000), sc.parallelize([("a", 1)]))


def test_a_missing_password_variable_is_named(postgres, monkeypatch):
    monkeypatch.delenv(password_env("postgres"), raising=False)
    with pytest.raises(ValueError, match="DSTREAM_POSTGRES_PASSWORD"):
        secret_sink(postgres, "t")


def job_with_postgres_sink(server: PostgresServer, table: str) -> StreamingJob:
    return parse_job(
        {
            "apiVersion": "dstream.dev/v1alpha1",
            "kind": "StreamingJob",
            "metadata": {"name": JOB},
            "spec": {
                "batchInterval": "1s",
                "app": {"builtin": "wordcount"},
                "source": {"type": "rate", "rate": {"recordsPerSecond": 100}},
                "sink": {"type": "postgres", "postgres": {"dsn": server.dsn(), "table": table}},
            },
        }
    )


def test_a_job_spec_attaches_the_sink(sc, postgres, table):
    ssc = build_context(job_with_postgres_sink(postgres, table), sc)
    (output,) = ssc._graph.outputs
    assert isinstance(output.func, PostgresSink)
    assert (output.func.job, output.func.settings.table, output.func.output) == (JOB, table, 0)


def test_a_deposed_drivers_batch_is_refused_inside_its_transaction(sc, postgres, table, tmp_path):
    """Two drivers of one job: once epoch 2 wrote, epoch 1's transaction rolls back whole."""
    from dstream.runtime.leadership.fencing import DeposedError, EpochLedger, Fence

    ledger = EpochLedger(tmp_path)
    settings = PostgresSettings(dsn=postgres.dsn(), table=table)
    output = PostgresSink(f"{table}-job", settings)
    output.write_batch(at(1000), sc.parallelize([("new", 1)]), Fence(ledger, 2))
    with pytest.raises(DeposedError, match=r"epoch 2 was claimed .* held epoch 1"):
        output.write_batch(at(1001), sc.parallelize([("old", 1)]), Fence(ledger, 1))
    assert query(postgres, f"SELECT key FROM {table}") == [("new",)]
    assert query(postgres, f"SELECT epoch FROM {COMMIT_TABLE} WHERE target = %s", table) == [(2,)]


def test_a_commit_table_from_before_epochs_gets_its_epoch_column(sc, postgres, table):
    schema = f"{table}_s"
    execute(postgres, f"CREATE SCHEMA {schema}")
    execute(
        postgres,
        f"CREATE TABLE {schema}.{COMMIT_TABLE} (job text NOT NULL, target text NOT NULL,"
        " output integer NOT NULL, batch_time timestamptz NOT NULL,"
        " rows bigint NOT NULL DEFAULT 0, rejected bigint NOT NULL DEFAULT 0,"
        " committed_at timestamptz NOT NULL DEFAULT now(),"
        " PRIMARY KEY (job, target, output, batch_time))",
    )
    sink(postgres, f"{schema}.t")(at(1000), sc.parallelize([("a", 1)]))
    assert query(postgres, f"SELECT epoch, rows FROM {schema}.{COMMIT_TABLE}") == [(0, 1)]
