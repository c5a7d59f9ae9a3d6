"""`source.type: nats`: a NATS JetStream stream, read as recorded ranges of stream sequence numbers.

Planning, on the driver: the stream's state (first and last sequence, one STREAM.INFO request)
gives the backlog after the job's position; the batch admits the next `budget` sequences, cut into
one slice per task, and the slices go into the batch log.

Tasks read their slice by sequence number with the stream's message-get API, many requests in
flight at once, rather than through a consumer. Why: a get is stateless and idempotent, so a task
retried by Spark, run twice by speculation, or cut off by a dropped connection simply asks again;
there is no server-side consumer to create, leak or leave behind at a wrong position, and a
sequence that is no longer stored answers "not found", which is exactly the trimming check the
replay guarantee needs (an ordered consumer would silently skip to the next stored message).
The price is one request per message; replies are pipelined, which is enough for the rates the
tests and examples run. With `subjects`, messages on other subjects are dropped in the task (the
range, and so the rate limit, counts sequences). A lost connection or a restarting server is
retried with exponential backoff for `retry_seconds`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import nats
import nats.errors
import nats.js.errors
from nats.js.api import StreamState
from nats.js.client import JetStreamContext
from pyspark import RDD

from dstream.runtime.control import latency
from dstream.runtime.control.latency import Ages
from dstream.sources import InputDStream, SourceError
from dstream.spec import password_env

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.spec import Source

T = TypeVar("T")
IN_FLIGHT = 256  # message-get requests pipelined per task
TRANSIENT = (
    OSError,
    asyncio.TimeoutError,
    nats.errors.NoServersError,
    nats.errors.ConnectionClosedError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
)


def with_backoff(call: Callable[[], T], retry_seconds: float, what: str) -> T:
    """call(), again after 50 ms, 100 ms, ... (at most 2 s apart) while it fails transiently;
    SourceError naming `what` once `retry_seconds` have passed, or at once for an error the
    server answered with."""
    deadline = time.monotonic() + retry_seconds
    delay = 0.05
    while True:
        try:
            return call()
        except TRANSIENT as error:
            if time.monotonic() + delay > deadline:
                raise SourceError(
                    f"{what} unreachable for {retry_seconds:.0f} s: {error!r}"
                ) from None
        except nats.errors.Error as error:  # refused by the server: retrying will not help
            raise SourceError(f"{what}: {error}") from None
        time.sleep(delay)
        delay = min(2.0, delay * 2)


async def _quiet(error: Exception) -> None:
    """nats-py logs every failed attempt with a traceback; with_backoff reports the outcome."""


async def _with_jetstream(url: str, work: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    """One connection, one unit of work: one attempt to connect (with_backoff retries; a
    connection that fails other than by a refused login is transient). The password
    (source.nats.passwordSecret) comes from the environment: with a user in the URL it is that
    user's password, without one it is the server's token."""
    password = os.environ.get(password_env("nats"))
    user = urlsplit(url).username
    credentials = {}
    if password is not None:
        credentials = {"user": user, "password": password} if user else {"token": password}
    try:
        client = await nats.connect(
            url,
            **credentials,
            connect_timeout=2,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0,
            error_cb=_quiet,
        )
    except nats.errors.Error as error:
        if "authorization violation" in str(error).lower():
            raise SourceError(
                f"nats server {url} refused the login ({error}); the password or token comes "
                f"from {password_env('nats')} (source.nats.passwordSecret)"
            ) from None
        # e.g. a server that is shutting down or starting accepts and closes before its INFO
        raise ConnectionError(f"no session with the server: {error}") from error
    try:
        return await work(client.jetstream(timeout=10))
    finally:
        await client.close()


class NatsInputDStream(InputDStream):
    """Messages of one JetStream stream, as text; a planned range is
    `{"next": the first sequence of the following batch, "slices": [[first, last], ...]}`."""

    # This run's thread: not checkpointed; a restored graph opens its own (_attach).
    _UNPICKLED = (*InputDStream._UNPICKLED, "_thread")

    def __init__(
        self,
        ssc: StreamingContext,
        url: str,
        stream: str,
        subjects: list[str] | None = None,
        start_from: str = "earliest",
        name: str = "nats",
        retry_seconds: float = 60.0,
    ):
        super().__init__(ssc, name)
        self.url = url
        self.stream = stream
        self.subjects = list(subjects or [])
        self.retry_seconds = retry_seconds
        # asyncio.run needs a thread without an event loop; the API server's thread has one
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"dstream-{name}")
        state = self._state(retry_seconds=2.0)
        self._start = state.last_seq + 1 if start_from == "latest" else max(1, state.first_seq)
        self._next: int | None = None

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "stream": self.stream, "subjects": self.subjects}

    def _attach(self, ssc: StreamingContext) -> None:
        super()._attach(ssc)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"dstream-{self.name}")

    def _state(self, retry_seconds: float | None = None) -> StreamState:
        async def info(js: JetStreamContext) -> StreamState:
            try:
                return (await js.stream_info(self.stream)).state
            except nats.js.errors.NotFoundError:
                raise SourceError(
                    f"nats stream {self.stream!r} does not exist at {self.url}"
                ) from None

        def fetch() -> StreamState:
            return self._thread.submit(asyncio.run, _with_jetstream(self.url, info)).result()

        seconds = self.retry_seconds if retry_seconds is None else retry_seconds
        return with_backoff(fetch, seconds, f"nats server {self.url}")

    def _waiting(self, state: StreamState) -> int:
        """Sequences after the position; SourceError if unread ones are no longer stored."""
        position = self._start if self._next is None else self._next
        if state.first_seq > position and state.last_seq >= position:
            raise SourceError(
                f"nats stream {self.stream!r}: sequences {position}..{state.first_seq - 1} were "
                "removed (limits or purge) before this job read them; raise the stream's "
                "limits or consume faster"
            )
        return max(0, state.last_seq - position + 1)

    def backlog(self, now_ms: int) -> int | None:
        try:
            return self._waiting(self._state(retry_seconds=0))
        except SourceError:
            return None

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        waiting = self._waiting(self._state())
        admitted = waiting if max_records is None else min(waiting, max_records)
        first = self._start if self._next is None else self._next
        per_task = max(1, -(-admitted // self._sc.defaultParallelism))
        slices = [
            [start, min(start + per_task, first + admitted) - 1]
            for start in range(first, first + admitted, per_task)
        ]
        planned = {"next": first + admitted, "slices": slices}
        self._advance_past(planned)
        return planned

    def _advance_past(self, planned: Any) -> None:
        self._next = max(self._next or 0, planned["next"])

    def replay(self, time_ms: int, planned: Any) -> None:
        """Adopt a recorded range, after checking that the stream still stores its start."""
        if planned["slices"]:
            first, last = planned["slices"][0][0], planned["slices"][-1][1]
            stored_from = self._state().first_seq
            if stored_from > first:
                raise SourceError(
                    f"nats stream {self.stream!r}: the recorded range {first}..{last} was "
                    f"removed before it was read (the stream now starts at {stored_from}); the "
                    "batch cannot be replayed exactly, so the job stops (start fresh with "
                    "`dstream run --fresh` to skip the lost input)"
                )
        super().replay(time_ms, planned)

    def records_in(self, planned: Any) -> int:
        return sum(last - first + 1 for first, last in planned["slices"])

    def record_ages(self, time_ms: int, planned: Any) -> Ages | None:
        """Counted by the tasks from each message's stored timestamp."""
        return latency.reported_ages(self._age_reports, time_ms)

    def _read(self, time_ms: int, planned: Any) -> RDD:
        slices = [tuple(s) for s in planned["slices"]]
        if not slices:
            return self._sc.emptyRDD()
        url, stream, subjects, retry = self.url, self.stream, self.subjects, self.retry_seconds
        reports = self._age_reports

        def read(split: int, items: Iterator[tuple[int, int]]) -> Iterator[str]:
            ages: Ages = {}
            records = (
                record
                for first, last in items
                for record in read_range(url, stream, first, last, subjects, retry, ages, time_ms)
            )
            return latency.reporting(records, reports, (time_ms, split), ages)

        return self._sc.parallelize(slices, len(slices)).mapPartitionsWithIndex(read)


def read_range(
    url: str,
    stream: str,
    first: int,
    last: int,
    subjects: list[str],
    retry_seconds: float,
    ages: Ages | None = None,
    batch_ms: int = 0,
) -> Iterator[str]:
    """The messages with sequences first..last (a task); SourceError if one is gone. With
    `ages`, each message's age at batch_ms (from the time the server stored it) is counted into
    it."""
    start = first
    while start <= last:
        stop = min(last, start + IN_FLIGHT * 16 - 1)
        window = with_backoff(
            lambda a=start, b=stop: asyncio.run(_with_jetstream(url, _get(stream, a, b))),
            retry_seconds,
            f"nats server {url}",
        )
        for subject, data, stored in window:
            if not subjects or any(subject_matches(subject, s) for s in subjects):
                if ages is not None:
                    latency.add_age(ages, batch_ms - int(stored.timestamp() * 1000))
                yield data.decode("utf-8", errors="replace")
        start = stop + 1


def _get(stream: str, first: int, last: int) -> Callable[[JetStreamContext], Awaitable[list]]:
    async def get(js: JetStreamContext) -> list[tuple[str, bytes, datetime]]:
        found: list[tuple[str, bytes, datetime]] = []
        for start in range(first, last + 1, IN_FLIGHT):
            sequences = range(start, min(last, start + IN_FLIGHT - 1) + 1)
            replies = await asyncio.gather(
                *(js.get_msg(stream, seq) for seq in sequences), return_exceptions=True
            )
            for seq, reply in zip(sequences, replies, strict=True):
                if isinstance(reply, nats.js.errors.NotFoundError):
                    raise SourceError(
                        f"nats stream {stream!r}: sequence {seq} of the recorded range "
                        f"{first}..{last} is no longer stored (removed by limits, a purge or a "
                        "delete) so the batch cannot be read exactly; the job stops"
                    )
                if isinstance(reply, BaseException):
                    raise reply
                found.append((reply.subject, reply.data or b"", reply.time))
        return found

    return get


def subject_matches(subject: str, pattern: str) -> bool:
    """NATS subject matching: `*` stands for one token, a final `>` for one or more."""
    tokens, wanted = subject.split("."), pattern.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or (token != "*" and token != tokens[i]):
            return False
    return len(tokens) == len(wanted)


def nats_source(ssc: StreamingContext, source: Source) -> InputDStream:
    assert source.nats is not None
    spec = source.nats
    return NatsInputDStream(ssc, spec.url, spec.stream, spec.subjects, spec.start_from)
