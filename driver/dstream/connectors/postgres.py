"""`sink.type: postgres`: each batch in one PostgreSQL transaction, exactly once.

A batch's rows and a row of the commit table (`dstream_commits`, keyed by job, table, output
and batch time) are written in ONE transaction. The commit row is inserted first; when it is
already there, the batch was committed before a crash and the transaction writes nothing. A
re-run batch therefore changes nothing, in `append` as in `upsert` mode, and a failure anywhere
(a lost connection, a server going down, the driver killed) leaves no partial batch behind.

Why the rows go through the driver: one transaction per batch needs one connection, which lives
on the driver. The alternative, a two-phase scheme (every task writes its partition into a
staging table, the driver moves the staged rows in one transaction), costs a second copy of
every row and staging tables to clean up after crashes; it pays off only for output too large
for the driver. What streaming jobs write to a database is mostly small already: window counts,
top-K lists, per-batch aggregates, session states. So the batch is collected on the driver:
suited to outputs of up to some hundred thousand rows per batch, which the driver holds in
memory and one connection writes within the batch interval; not to copying every raw record of
a high-rate stream into a table.

Rows: a pair `(k, v)` becomes the columns `key` and `value`, a dict its fields, anything else
the column `value`; every row gets `batch_time` (timestamptz). A missing table is created from
the batch's most common row shape (with a primary key on `keyColumns` in upsert mode); an
existing one is checked first, and rejected with an error naming the column when no record of
the batch fits it, before anything is written. A record that does not fit a table that others
fit (a dict missing a column, a value PostgreSQL refuses) is counted and left out of the table:
it goes, as JSON with the reason, into the dead-letter table `dstream_rejected` in the same
transaction, so it is recorded exactly once too; the rest of the batch commits.

Fencing (runtime/fencing.py): with a checkpoint, the driver writes under an epoch, and the
transaction first raises the job's row of `dstream_epochs` to it, which it may only do when no
newer epoch wrote there; else a newer driver leads, and the transaction is rolled back with a
DeposedError. The row lock serialises the two drivers' transactions, so a deposed driver's
output cannot land after its successor's first batch, however long it was frozen. The commit
row keeps the epoch of the driver that wrote the batch.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from pyspark import RDD

from dstream.runtime.leadership.fencing import DeposedError, Fence
from dstream.runtime.timeutil import time_to_ms
from dstream.spec import PostgresSink as PostgresSettings
from dstream.spec import password_env

if TYPE_CHECKING:
    from dstream.spec import StreamingJob

log = logging.getLogger(__name__)

COMMIT_TABLE = "dstream_commits"
REJECTED_TABLE = "dstream_rejected"
EPOCH_TABLE = "dstream_epochs"
BATCH_TIME = "batch_time"
CONNECT_TIMEOUT_S = 10

# Column types of a created table, by the Python type of the first value seen.
_SQL_TYPES: list[tuple[type, str]] = [
    (bool, "boolean"),
    (int, "bigint"),
    (float, "double precision"),
    (str, "text"),
    (datetime, "timestamptz"),
    (date, "date"),
    (dict, "jsonb"),
    (list, "jsonb"),
    (tuple, "jsonb"),
]
JSON_TYPES = ("jsonb", "json")
# What psycopg stores in a column of any other type (PostgreSQL then checks the value).
_SCALARS = (type(None), bool, int, float, str, datetime, date, Decimal, bytes)
_dumps = functools.partial(json.dumps, default=str)


class TableMismatchError(ValueError):
    """The target table cannot hold this output; the message names the column."""


@dataclass(frozen=True)
class Rejected:
    """A record left out of the table, with why (a row of the dead-letter table)."""

    record: Any
    reason: str


def row_of(record: Any) -> dict[str, Any]:
    """The columns a record is written as: pairs as key/value, dicts as their fields."""
    if isinstance(record, tuple) and len(record) == 2:
        return {"key": record[0], "value": record[1]}
    if isinstance(record, dict):
        return dict(record)
    return {"value": record}


def sql_type(value: Any) -> str:
    for python_type, name in _SQL_TYPES:
        if isinstance(value, python_type):
            return name
    return "text"


def new_table_columns(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Columns (name -> type) for a table created from a batch: its most common row shape,
    each column typed by its first non-null value."""
    shapes = Counter(tuple(row) for row in rows)
    names = shapes.most_common(1)[0][0]
    columns = {}
    for name in names:
        first = next((row[name] for row in rows if row.get(name) is not None), None)
        columns[name] = sql_type(first)
    return columns


def misfit(row: dict[str, Any], data_columns: list[str]) -> str | None:
    """Why a row does not fit the table's data columns (all but batch_time), or None."""
    if BATCH_TIME in row:
        return f"the record has a field {BATCH_TIME!r}, which the sink sets itself"
    missing = [c for c in data_columns if c not in row]
    if missing:
        return f"missing column {missing[0]!r}"
    unknown = [c for c in row if c not in data_columns]
    if unknown:
        return f"no column {unknown[0]!r} in the table"
    return None


def unstorable(row: dict[str, Any], types: dict[str, str]) -> str | None:
    """Why a fitting row still cannot be stored (a structure into a non-JSON column), or None."""
    for name, value in row.items():
        if types[name] not in JSON_TYPES and not isinstance(value, _SCALARS):
            return f"a {type(value).__name__} cannot go into column {name!r} ({types[name]})"
    return None


def check_table(
    table: str,
    columns: dict[str, str],
    unique_keys: list[list[str]],
    settings: PostgresSettings,
    rows: list[dict[str, Any]],
) -> None:
    """Raise TableMismatchError naming the column when the existing table cannot take this output."""
    if columns.get(BATCH_TIME) != "timestamp with time zone":
        found = columns.get(BATCH_TIME)
        raise TableMismatchError(
            f"table {table}: column {BATCH_TIME!r} must be timestamptz"
            + (f", is {found}" if found else ", is missing")
        )
    if settings.mode == "upsert":
        for key in settings.key_columns:
            if key not in columns:
                raise TableMismatchError(f"table {table}: no key column {key!r} for upsert")
        if sorted(settings.key_columns) not in [sorted(k) for k in unique_keys]:
            raise TableMismatchError(
                f"table {table}: upsert needs a primary key or unique index on exactly "
                f"{', '.join(settings.key_columns)}"
            )
    data_columns = [c for c in columns if c != BATCH_TIME]
    if rows and all(misfit(row, data_columns) for row in rows):
        raise TableMismatchError(
            f"table {table} {_difference(rows[0], data_columns)}: no record of the batch fits"
            f" its columns ({', '.join(columns)}); the first is written as"
            f" {', '.join([*rows[0], BATCH_TIME])}"
        )


def _difference(row: dict[str, Any], data_columns: list[str]) -> str:
    """The first column that the table lacks for this row, or has and the row lacks."""
    unknown = [c for c in row if c not in data_columns]
    if unknown:
        return f"has no column {unknown[0]!r}"
    missing = [c for c in data_columns if c not in row]
    return f"has a column {missing[0]!r} that the records lack"


class PostgresSink:
    """A `foreachRDD` function writing each batch of one output stream in one transaction.

    `output` tells apart the streams of a job that writes several into the same table (the
    commit row is per output).
    """

    def __init__(self, job: str, settings: PostgresSettings, output: int = 0):
        self.job = job
        self.settings = settings
        self.output = output
        self.rejected_records = 0
        password = os.environ.get(password_env("postgres"))
        if settings.password_secret is not None and password is None:
            raise ValueError(
                f"sink.postgres.passwordSecret is set but {password_env('postgres')} is not "
                "in the environment (the operator sets it on Kubernetes; export it for dstream run)"
            )
        self._password = password

    def __call__(self, time: datetime, rdd: RDD) -> None:
        """Unfenced, as the output of a context without a checkpoint."""
        self.write_batch(time, rdd, None)

    def write_batch(self, time: datetime, rdd: RDD, fence: Fence | None) -> None:
        batch_ms = time_to_ms(time)
        records = rdd.collect()
        try:
            rejected = self.commit(batch_ms, records, fence, row_by_row=False)
        except (psycopg.DataError, psycopg.IntegrityError) as error:
            log.warning(
                "batch %s: %s; writing row by row to find the rejected records", time, error
            )
            rejected = self.commit(batch_ms, records, fence, row_by_row=True)
        if rejected:
            self.rejected_records += len(rejected)
            log.warning(
                "batch %s: %d records left out of %s (see %s)",
                time,
                len(rejected),
                self.settings.table,
                REJECTED_TABLE,
            )

    def connect(self) -> psycopg.Connection:
        extra: dict[str, Any] = {"password": self._password} if self._password else {}
        return psycopg.connect(
            self.settings.dsn,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=f"dstream-{self.job}",
            **extra,
        )

    def commit(
        self, batch_ms: int, records: list[Any], fence: Fence | None, row_by_row: bool
    ) -> list[Rejected]:
        """One transaction: the commit row, the rows, the rejected records; nothing when the
        batch is already committed. Returns the records left out."""
        batch_time = datetime.fromtimestamp(batch_ms / 1000, UTC)
        rows = [row_of(record) for record in records]
        epoch = fence.epoch if fence is not None else 0
        with self.connect() as conn, conn.transaction():
            self.create_bookkeeping(conn)
            if fence is not None:
                self.check_epoch(conn, epoch)
            if not self.claim(conn, batch_time, epoch):
                log.info("batch %s already committed to %s", batch_time, self.settings.table)
                return []
            columns = self.prepare_table(conn, rows)
            data_columns = [c for c in columns if c != BATCH_TIME]
            rejected, fitting = [], []
            for record, row in zip(records, rows, strict=True):
                reason = misfit(row, data_columns) or unstorable(row, columns)
                if reason:
                    rejected.append(Rejected(record, reason))
                else:
                    fitting.append((record, row))
            fitting = self.deduplicate(fitting)
            statement = self.insert_statement(data_columns)
            values = [self.values(row, data_columns, columns, batch_time) for _, row in fitting]
            if row_by_row:
                refused = self.insert_each(conn, statement, fitting, values)
            else:
                refused = self.insert_all(conn, statement, values)
            rejected += refused
            self.record_counts(conn, batch_time, len(values) - len(refused), len(rejected))
            self.record_rejected(conn, batch_time, rejected)
        return rejected

    def check_epoch(self, conn: psycopg.Connection, epoch: int) -> None:
        """Raise the job's epoch row to `epoch`, locking it until the transaction ends;
        DeposedError when a newer epoch is there already (a newer driver leads)."""
        table = self.own_table(EPOCH_TABLE)
        raised = conn.execute(
            sql.SQL(
                "INSERT INTO {0} (job, epoch) VALUES (%s, %s) ON CONFLICT (job) DO UPDATE"
                " SET epoch = EXCLUDED.epoch WHERE {0}.epoch <= EXCLUDED.epoch RETURNING epoch"
            ).format(table),
            (self.job, epoch),
        ).fetchone()
        if raised is None:
            (newer,) = conn.execute(
                sql.SQL("SELECT epoch FROM {} WHERE job = %s").format(table), (self.job,)
            ).fetchone()
            raise DeposedError(epoch, newer, f"the {EPOCH_TABLE} row of job {self.job}")

    def claim(self, conn: psycopg.Connection, batch_time: datetime, epoch: int) -> bool:
        """Insert this batch's commit row; False when a committed run already holds it."""
        cursor = conn.execute(
            sql.SQL(
                "INSERT INTO {} (job, target, output, batch_time, epoch) VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING"
            ).format(self.own_table(COMMIT_TABLE)),
            (self.job, self.settings.table, self.output, batch_time, epoch),
        )
        return cursor.rowcount == 1

    def create_bookkeeping(self, conn: psycopg.Connection) -> None:
        """The commit and dead-letter tables, beside the target table, when missing (so that
        once they exist the role needs no CREATE privilege on the schema)."""
        batch = "job text NOT NULL, target text NOT NULL, output integer NOT NULL,"
        batch += " batch_time timestamptz NOT NULL"
        columns = {
            COMMIT_TABLE: batch + ", rows bigint NOT NULL DEFAULT 0,"
            " rejected bigint NOT NULL DEFAULT 0, committed_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (job, target, output, batch_time)",
            REJECTED_TABLE: batch + ", record jsonb, reason text NOT NULL",
            EPOCH_TABLE: "job text PRIMARY KEY, epoch bigint NOT NULL",
        }
        for name, definition in columns.items():
            if not self.exists(conn, self.own_name(name)):
                conn.execute(
                    sql.SQL("CREATE TABLE {} (" + definition + ")").format(self.own_table(name))
                )
        if not self.has_column(conn, self.own_name(COMMIT_TABLE), "epoch"):  # older tables too
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN epoch bigint NOT NULL DEFAULT 0").format(
                    self.own_table(COMMIT_TABLE)
                )
            )

    @staticmethod
    def exists(conn: psycopg.Connection, name: str) -> bool:
        return conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is not None

    @staticmethod
    def has_column(conn: psycopg.Connection, table: str, column: str) -> bool:
        found = conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s"
            " AND NOT attisdropped",
            (table, column),
        )
        return found.fetchone() is not None

    def record_rejected(
        self, conn: psycopg.Connection, batch_time: datetime, rejected: list[Rejected]
    ) -> None:
        if not rejected:
            return
        with conn.cursor() as cursor:
            cursor.executemany(
                sql.SQL(
                    "INSERT INTO {} (job, target, output, batch_time, record, reason)"
                    " VALUES (%s, %s, %s, %s, %s, %s)"
                ).format(self.own_table(REJECTED_TABLE)),
                [
                    (
                        self.job,
                        self.settings.table,
                        self.output,
                        batch_time,
                        as_json(r.record),
                        r.reason,
                    )
                    for r in rejected
                ],
            )

    def record_counts(
        self, conn: psycopg.Connection, batch_time: datetime, rows: int, rejected: int
    ) -> None:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET rows = %s, rejected = %s"
                " WHERE job = %s AND target = %s AND output = %s AND batch_time = %s"
            ).format(self.own_table(COMMIT_TABLE)),
            (rows, rejected, self.job, self.settings.table, self.output, batch_time),
        )

    def prepare_table(self, conn: psycopg.Connection, rows: list[dict[str, Any]]) -> dict[str, str]:
        """The table's columns (name -> type), after creating or checking it."""
        columns = self.table_columns(conn)
        if not columns and rows:
            self.create_table(conn, new_table_columns(rows))
            columns = self.table_columns(conn)
        elif columns:
            check_table(self.settings.table, columns, self.unique_keys(conn), self.settings, rows)
        return columns

    def table_columns(self, conn: psycopg.Connection) -> dict[str, str]:
        cursor = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped"
            " ORDER BY attnum",
            (self.settings.table,),
        )
        return dict(cursor.fetchall())

    def unique_keys(self, conn: psycopg.Connection) -> list[list[str]]:
        """The column sets of the table's primary key and unique indexes (full, not partial)."""
        cursor = conn.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL"
            " GROUP BY i.indexrelid",
            (self.settings.table,),
        )
        return [keys for (keys,) in cursor.fetchall()]

    def create_table(self, conn: psycopg.Connection, columns: dict[str, str]) -> None:
        parts = [
            sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
            for name, kind in columns.items()
        ]
        parts.append(sql.SQL("{} timestamptz NOT NULL").format(sql.Identifier(BATCH_TIME)))
        if self.settings.mode == "upsert":
            missing = [k for k in self.settings.key_columns if k not in columns]
            if missing:
                raise TableMismatchError(
                    f"table {self.settings.table}: the records have no key column {missing[0]!r}"
                )
            keys = sql.SQL(", ").join(map(sql.Identifier, self.settings.key_columns))
            parts.append(sql.SQL("PRIMARY KEY ({})").format(keys))
        conn.execute(
            sql.SQL("CREATE TABLE {} ({})").format(self.table(), sql.SQL(", ").join(parts))
        )

    def insert_statement(self, data_columns: list[str]) -> sql.Composed:
        names = [*data_columns, BATCH_TIME]
        statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            self.table(),
            sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(sql.Placeholder() * len(names)),
        )
        if self.settings.mode == "append":
            return statement
        keys = self.settings.key_columns
        updates = [
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(name))
            for name in names
            if name not in keys
        ]
        return statement + sql.SQL(" ON CONFLICT ({}) DO UPDATE SET {}").format(
            sql.SQL(", ").join(map(sql.Identifier, keys)), sql.SQL(", ").join(updates)
        )

    def deduplicate(self, fitting: list[tuple[Any, dict[str, Any]]]) -> list[tuple[Any, dict]]:
        """Upsert: the last record of each key in the batch (one statement cannot update a
        row twice)."""
        if self.settings.mode == "append":
            return fitting
        last: dict[str, tuple[Any, dict]] = {}
        for record, row in fitting:
            key = [row[k] for k in self.settings.key_columns]
            last[json.dumps(key, default=str, sort_keys=True)] = (record, row)
        return list(last.values())

    @staticmethod
    def values(
        row: dict[str, Any], data_columns: list[str], types: dict[str, str], batch_time: datetime
    ) -> list[Any]:
        """The row's values in column order; structured values as JSON where the column is."""
        return [
            Jsonb(row[c], _dumps) if types[c] in JSON_TYPES else row[c] for c in data_columns
        ] + [batch_time]

    @staticmethod
    def insert_all(
        conn: psycopg.Connection, statement: sql.Composed, values: list[list[Any]]
    ) -> list[Rejected]:
        """The fast path: all rows in one pipelined executemany; any refusal aborts it."""
        if values:
            with conn.cursor() as cursor:
                cursor.executemany(statement, values)
        return []

    @staticmethod
    def insert_each(
        conn: psycopg.Connection,
        statement: sql.Composed,
        fitting: list[tuple[Any, dict]],
        values: list[list[Any]],
    ) -> list[Rejected]:
        """Each row under its own savepoint: the ones PostgreSQL refuses are left out."""
        rejected = []
        for (record, _), row_values in zip(fitting, values, strict=True):
            try:
                with conn.transaction():
                    conn.execute(statement, row_values)
            except (psycopg.DataError, psycopg.IntegrityError) as error:
                rejected.append(Rejected(record, f"{type(error).__name__}: {error}".strip()))
        return rejected

    def table(self) -> sql.Identifier:
        return sql.Identifier(*self.settings.table.split("."))

    def own_name(self, name: str) -> str:
        """One of the sink's bookkeeping tables, in the target table's schema."""
        return ".".join([*self.settings.table.split(".")[:-1], name])

    def own_table(self, name: str) -> sql.Identifier:
        return sql.Identifier(*self.own_name(name).split("."))


def as_json(record: Any) -> Jsonb:
    """A record as JSON, whatever it holds (what is not JSON becomes its string)."""
    return Jsonb(record, _dumps)


def postgres_sink(job: StreamingJob, output: int) -> PostgresSink:
    assert job.spec.sink.postgres is not None
    return PostgresSink(job.metadata.name, job.spec.sink.postgres, output)
