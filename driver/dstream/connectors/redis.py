"""`source.type: redis`: Redis Streams (Redis 7 or later), read as recorded entry-ID ranges.

Planning, on the driver: a stream's backlog is its `entries-added` counter (XINFO STREAM) minus the
entries this job has admitted, so sizing a batch never reads a record. The batch's share of the
rate budget (split across streams in proportion to their backlog) is cut into slices of
consecutive entries by a server-side script that returns only (first ID, last ID, count); the
slices go into the batch log and each becomes one task that reads exactly that range with XRANGE.

Stream IDs only grow, so a recorded range names the same entries forever, unless they are trimmed.
Trimming is detected three ways, each stopping the job with the stream and range named rather than
skipping input: at planning (more entries removed than this job has read), when a restarted driver
adopts its recorded ranges (each range is counted again on the server), and in the task (fewer
entries, or another first ID, than recorded). A dropped connection or a restarting broker is
retried with exponential backoff (redis-py's Retry) for `retry_seconds`; a command that failed is
simply sent again, because every read names its exact range and changes nothing on the server.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from pyspark import RDD, Accumulator
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from dstream.runtime.checkpoint.files import write_atomically
from dstream.runtime.control import latency
from dstream.runtime.control.latency import Ages
from dstream.sources import InputDStream, SourceError, split_budget
from dstream.spec import password_env

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.spec import Source

READ_CHUNK = 10_000  # entries per XRANGE call in a task: bounds a task's memory, not its range
BACKOFF = ExponentialBackoff(cap=2.0, base=0.05)

# Slices of at most ARGV[4] consecutive entries from the bound ARGV[1] ("(id" exclusive or "id")
# up to ARGV[2], at most ARGV[3] entries in all, as {first ID, last ID, count}: IDs only, so a
# batch is planned without shipping its records to the driver (1000 entries per XRANGE call).
SLICES_SCRIPT = """
local start, stop, want, per = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local slices, first, count, last = {}, nil, 0, nil
while want > 0 do
  local entries = redis.call('XRANGE', KEYS[1], start, stop, 'COUNT', math.min(want, 1000))
  if #entries == 0 then break end
  for _, entry in ipairs(entries) do
    if count == 0 then first = entry[1] end
    count = count + 1
    last = entry[1]
    if count == per then
      slices[#slices + 1] = {first, last, count}
      count = 0
    end
  end
  start = '(' .. last
  want = want - #entries
end
if count > 0 then slices[#slices + 1] = {first, last, count} end
return slices
"""


def connect(url: str, retry_seconds: float) -> redis.Redis:
    """A client whose commands are retried with backoff for about `retry_seconds` when the
    connection drops or the server is loading its data after a restart. The password, if any,
    comes from the environment (source.redis.passwordSecret), on the driver as in tasks."""
    return redis.Redis.from_url(
        url,
        password=os.environ.get(password_env("redis")),
        decode_responses=True,
        encoding_errors="replace",
        socket_connect_timeout=2,
        socket_timeout=30,
        retry=Retry(BACKOFF, retries_within(retry_seconds)),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


@contextmanager
def server_errors(url: str, retry_seconds: float) -> Iterator[None]:
    """Redis errors that outlast the retries, as a SourceError naming the server: the job must
    stop rather than let the scheduler mark a batch failed and move past its input."""
    try:
        yield
    except redis.ResponseError as error:
        raise SourceError(f"redis source {url}: {error}") from None
    except redis.RedisError as error:
        raise SourceError(
            f"redis source: {url} unreachable for {retry_seconds:.0f} s: {error}"
        ) from None


def retries_within(seconds: float) -> int:
    """How many backoff retries fit into `seconds` of waiting."""
    waited, retries = 0.0, 0
    while waited + BACKOFF.compute(retries + 1) <= seconds:
        retries += 1
        waited += BACKOFF.compute(retries)
    return retries


class RedisInputDStream(InputDStream):
    """Entries of one or more Redis streams; each stream is a partition of the source.

    A planned range is `{"streams": {key: {"after": ID, "index": n, "slices": [[first, last,
    count], ...]}}}`: `after` and `index` are the stream's position once the batch is admitted
    (the last ID read, and how many entries the stream had ever received up to it), so the batch
    log alone tells a restarted driver where to go on. With `field`, a record is that field's text
    and an entry without it is counted (`malformed_records`) and written to the dead-letter
    directory; without `field`, a record is the dict of all the entry's fields.
    """

    # This run's connections: not checkpointed; a restored graph opens its own (_attach).
    _UNPICKLED = (*InputDStream._UNPICKLED, "_client", "_probe", "_slices")

    def __init__(
        self,
        ssc: StreamingContext,
        url: str,
        streams: list[str],
        field: str | None = None,
        start_from: str = "earliest",
        name: str = "redis",
        retry_seconds: float = 60.0,
    ):
        super().__init__(ssc, name)
        self.url = url
        self.streams = list(streams)
        self.field = field
        self.start_from = start_from
        self.retry_seconds = retry_seconds
        self._connect()
        self._positions: dict[str, dict[str, Any]] = {}
        self._malformed = ssc.sparkContext.accumulator(0)
        self._require_streams()
        self._starts = {key: self._start(self._info(key)) for key in self.streams}

    def _connect(self) -> None:
        self._client = connect(self.url, self.retry_seconds)
        self._probe = connect(self.url, 0)  # metrics scrapes must not wait out a broker restart
        self._slices = self._client.register_script(SLICES_SCRIPT)

    def _attach(self, ssc: StreamingContext) -> None:
        super()._attach(ssc)
        self._connect()

    @property
    def malformed_records(self) -> int:
        """Entries without `field` met by this driver's batches (a re-run batch counts again)."""
        return self._malformed.value

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "streams": self.streams}

    def _require_streams(self) -> None:
        """Fail at start, naming the broker or the stream, rather than at the first batch."""
        client = connect(self.url, 2.0)
        try:
            for key in self.streams:
                kind = client.type(key)
                if kind == "none":
                    raise SourceError(
                        f"redis source: stream {key!r} does not exist at {self.url} (create it "
                        "with XADD, or XGROUP CREATE ... MKSTREAM, before starting the job)"
                    )
                if kind != "stream":
                    raise SourceError(f"redis source: key {key!r} at {self.url} is a {kind}")
        except (redis.AuthenticationError, redis.AuthenticationWrongNumberOfArgsError) as error:
            raise SourceError(
                f"redis source: {self.url} refused the login ({error}); the password comes from "
                f"{password_env('redis')} (source.redis.passwordSecret)"
            ) from None
        except redis.RedisError as error:
            raise SourceError(f"redis source: cannot reach {self.url}: {error}") from None

    # -- positions and backlog --------------------------------------------------------------

    def _start(self, info: dict[str, Any]) -> dict[str, Any]:
        """Where a job without a checkpoint starts in a stream, as `startFrom` says."""
        if self.start_from == "latest":
            return {"after": info["last-generated-id"], "index": info["entries-added"]}
        return {"after": "0-0", "index": info["entries-added"] - info["length"]}

    def _position(self, key: str) -> dict[str, Any]:
        """Where a stream's next batch starts: after the last batch planned or replayed."""
        return self._positions.get(key, self._starts[key])

    def _waiting(self, key: str, info: dict[str, Any]) -> int:
        """Entries after the position; SourceError if unread entries were removed."""
        position = self._position(key)
        added, index = info["entries-added"], position["index"]
        if added < index:
            raise SourceError(
                f"redis stream {key!r} was deleted and created again: it has received {added} "
                f"entries, but this job had already read {index}"
            )
        removed = added - info["length"]
        if removed > index:
            first = (info.get("first-entry") or ["(empty)"])[0]
            raise SourceError(
                f"redis stream {key!r}: {removed - index} entries after {position['after']} "
                f"were trimmed or deleted before this job read them (the stream now starts at "
                f"{first}); raise the stream's MAXLEN/MINID or consume faster"
            )
        return added - index

    def backlog_by_partition(self) -> dict[str, int]:
        try:
            return {key: self._waiting(key, self._probe.xinfo_stream(key)) for key in self.streams}
        except (redis.RedisError, SourceError):
            return {}

    def backlog(self, now_ms: int) -> int | None:
        by_stream = self.backlog_by_partition()
        return sum(by_stream.values()) if by_stream else None

    # -- planning -------------------------------------------------------------------------

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        with server_errors(self.url, self.retry_seconds):
            return self._plan_streams(max_records)

    def _plan_streams(self, max_records: int | None) -> Any:
        infos = {key: self._info(key) for key in self.streams}
        waiting = [self._waiting(key, infos[key]) for key in self.streams]
        shares = split_budget(waiting, max_records)
        parallelism = self._sc.defaultParallelism
        planned = {}
        for key, share in zip(self.streams, shares, strict=True):
            position = self._position(key)
            per_task = max(1, -(-share // parallelism))
            slices = self._slice(key, f"({position['after']}", "+", share, per_task)
            count = sum(c for _first, _last, c in slices)
            planned[key] = {
                "after": slices[-1][1] if slices else position["after"],
                "index": position["index"] + count,
                "slices": slices,
            }
        self._advance_past({"streams": planned})
        return {"streams": planned}

    def _info(self, key: str) -> dict[str, Any]:
        with server_errors(self.url, self.retry_seconds):
            return self._client.xinfo_stream(key)

    def _slice(self, key: str, start: str, stop: str, want: int, per: int) -> list[list[Any]]:
        if want <= 0:
            return []
        return [list(s) for s in self._slices(keys=[key], args=[start, stop, want, per])]

    def _advance_past(self, planned: Any) -> None:
        for key, reached in planned["streams"].items():
            current = self._positions.get(key)
            if current is None or reached["index"] > current["index"]:
                self._positions[key] = {"after": reached["after"], "index": reached["index"]}

    def replay(self, time_ms: int, planned: Any) -> None:
        """Adopt a recorded range, after checking on the server that its entries are all there."""
        for key, reached in planned["streams"].items():
            for first, last, count in reached["slices"]:
                with server_errors(self.url, self.retry_seconds):
                    found = self._slice(key, first, last, count + 1, count + 1)
                if found != [[first, last, count]]:
                    raise SourceError(missing_message(key, first, last, count, found))
        super().replay(time_ms, planned)

    def records_in(self, planned: Any) -> int:
        return sum(c for s in planned["streams"].values() for _f, _l, c in s["slices"])

    def record_ages(self, time_ms: int, planned: Any) -> Ages | None:
        """Counted by the tasks from each entry ID's milliseconds (when Redis added it)."""
        return latency.reported_ages(self._age_reports, time_ms)

    # -- reading --------------------------------------------------------------------------

    def _read(self, time_ms: int, planned: Any) -> RDD:
        tasks = [
            (key, first, last, count)
            for key, reached in planned["streams"].items()
            for first, last, count in reached["slices"]
        ]
        if not tasks:
            return self._sc.emptyRDD()
        url, field, retry = self.url, self.field, self.retry_seconds
        deadletter = self._deadletter_dir(time_ms) if field else None
        malformed, reports = self._malformed, self._age_reports

        def read(split: int, items: Iterator[tuple[str, str, str, int]]) -> Iterator[Any]:
            ages: Ages = {}
            records = (
                record
                for task in items
                for record in read_range(
                    url, *task, field, deadletter, malformed, retry, ages, time_ms
                )
            )
            return latency.reporting(records, reports, (time_ms, split), ages)

        return self._sc.parallelize(tasks, len(tasks)).mapPartitionsWithIndex(read)


def missing_message(key: str, first: str, last: str, count: int, found: list[list[Any]]) -> str:
    seen = f"{found[0][2]} entries from {found[0][0]}" if found else "none of them"
    return (
        f"redis stream {key!r}: the recorded range {first}..{last} ({count} entries) was trimmed "
        f"before it was read (the stream still holds {seen}); the batch cannot be replayed "
        "exactly, so the job stops (start fresh with `dstream run --fresh` to skip the lost input)"
    )


def read_range(
    url: str,
    key: str,
    first: str,
    last: str,
    count: int,
    field: str | None,
    deadletter: str | None,
    malformed: Accumulator[int],
    retry_seconds: float,
    ages: Ages | None = None,
    batch_ms: int = 0,
) -> Iterator[Any]:
    """The records of entries first..last of `key` (a task); SourceError if any is gone. With
    `ages`, each record's age at batch_ms (from its entry ID's milliseconds, when Redis added
    it) is counted into it."""
    with server_errors(url, retry_seconds):
        entries = list(_entries(connect(url, retry_seconds), key, first, last, count))
    if len(entries) != count or (entries and entries[0][0] != first):
        got = [[entries[0][0], entries[-1][0], len(entries)]] if entries else []
        raise SourceError(missing_message(key, first, last, count, got))
    lacking = []
    added: list[str] = []  # entry IDs of the records yielded
    for entry_id, fields in entries:
        if field is None:
            added.append(entry_id)
            yield fields
        elif field in fields:
            added.append(entry_id)
            yield fields[field]
        else:
            problem = {"stream": key, "id": entry_id, "error": f"no field {field!r}"}
            lacking.append({**problem, "record": fields})
    if lacking:
        malformed.add(len(lacking))
        if deadletter is not None:
            body = "".join(json.dumps(m) + "\n" for m in lacking).encode()
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"redis-{key}-{first}")
            write_atomically(Path(deadletter) / f"{name}.jsonl", body)
    if ages is not None:
        for milliseconds, records in Counter(i.partition("-")[0] for i in added).items():
            latency.add_age(ages, batch_ms - int(milliseconds), records)


def _entries(
    client: redis.Redis, key: str, first: str, last: str, count: int
) -> Iterator[tuple[str, dict[str, str]]]:
    start = first
    left = count + 1  # one more than recorded: an extra entry would mean a different range
    while left > 0:
        chunk = client.xrange(key, start, last, count=min(left, READ_CHUNK))
        if not chunk:
            return
        yield from chunk
        left -= len(chunk)
        start = f"({chunk[-1][0]}"


def redis_source(ssc: StreamingContext, source: Source) -> InputDStream:
    assert source.redis is not None
    spec = source.redis
    return RedisInputDStream(ssc, spec.url, spec.streams, spec.field, spec.start_from)
