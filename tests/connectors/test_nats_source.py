"""The NATS JetStream source against a real nats-server: sequence ranges read exactly, replays,
removed messages detected, a restarting server ridden out, bad input named."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid

import nats
import pytest
from dstream import StreamingContext
from dstream.connectors.nats import NatsInputDStream, subject_matches
from dstream.runtime.scheduling.clock import ManualClock
from dstream.sources import SourceError
from dstream.spec import password_env
from servers import NatsServer
from streams import assert_stamped_between


def publish(url: str, stream: str, messages: list[tuple[str, str]], create: bool = False) -> None:
    async def go() -> None:
        client = await nats.connect(url)
        js = client.jetstream()
        if create:
            await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        for subject, data in messages:
            await js.publish(subject, data.encode())
        await client.close()

    asyncio.run(go())


def purge(url: str, stream: str, keep: int) -> None:
    async def go() -> None:
        client = await nats.connect(url)
        await client.jetstream().purge_stream(stream, keep=keep)
        await client.close()

    asyncio.run(go())


def new_stream(url: str, lines: list[str]) -> str:
    name = f"EV{uuid.uuid4().hex[:8]}"
    publish(url, name, [(f"{name}.lines", line) for line in lines], create=True)
    return name


@pytest.fixture
def ssc(sc):
    return StreamingContext(sc, 1, clock=ManualClock())


def source_for(ssc, url: str, stream: str, **options) -> NatsInputDStream:
    return NatsInputDStream(ssc, url, stream, retry_seconds=10, **options)


def test_ranges_follow_the_budget_and_read_exactly(ssc, nats_server):
    stream = new_stream(nats_server.url, [f"m{i}" for i in range(100)])
    source = source_for(ssc, nats_server.url, stream)
    assert source.backlog(0) == 100
    planned = source.plan(1000, 60)
    assert source.records_in(planned) == 60 and planned["next"] == 61
    assert source.backlog(0) == 40
    assert source.compute(1000).collect() == [f"m{i}" for i in range(60)]
    source.plan(2000, None)
    assert source.compute(2000).collect() == [f"m{i}" for i in range(60, 100)]
    assert source.records_in(source.plan(3000, None)) == 0


def test_a_restarted_driver_replays_the_same_messages(sc, nats_server):
    stream = new_stream(nats_server.url, [f"m{i}" for i in range(20)])
    first = source_for(StreamingContext(sc, 1, clock=ManualClock()), nats_server.url, stream)
    planned = first.plan(1000, 8)
    publish(nats_server.url, stream, [(f"{stream}.lines", "late")])
    again = source_for(StreamingContext(sc, 1, clock=ManualClock()), nats_server.url, stream)
    again.replay(1000, json.loads(json.dumps(planned)))
    assert again.compute(1000).collect() == [f"m{i}" for i in range(8)]
    assert again.records_in(again.plan(2000, None)) == 13


def test_subjects_filter_and_start_from_latest(ssc, nats_server):
    stream = new_stream(nats_server.url, ["before"])
    source = source_for(
        ssc, nats_server.url, stream, subjects=[f"{stream}.keep.*"], start_from="latest"
    )
    publish(
        nats_server.url,
        stream,
        [(f"{stream}.keep.a", "yes1"), (f"{stream}.drop", "no"), (f"{stream}.keep.b", "yes2")],
    )
    source.plan(1000, None)
    assert source.compute(1000).collect() == ["yes1", "yes2"]


def test_subject_wildcards():
    assert subject_matches("a.b.c", "a.*.c") and subject_matches("a.b.c", "a.>")
    assert not subject_matches("a", "a.>") and not subject_matches("a.b", "a.*.c")
    assert subject_matches("a.b", "a.b") and not subject_matches("a.b.c", "a.b")


def test_messages_removed_before_a_replay_stop_the_job(sc, nats_server):
    stream = new_stream(nats_server.url, [f"m{i}" for i in range(10)])
    planned = source_for(
        StreamingContext(sc, 1, clock=ManualClock()), nats_server.url, stream
    ).plan(1000, None)
    purge(nats_server.url, stream, keep=3)
    again = source_for(StreamingContext(sc, 1, clock=ManualClock()), nats_server.url, stream)
    with pytest.raises(SourceError, match=rf"nats stream '{stream}': the recorded range 1\.\.10"):
        again.replay(1000, planned)


def test_messages_removed_before_planning_or_reading_are_named(ssc, nats_server):
    stream = new_stream(nats_server.url, [f"m{i}" for i in range(10)])
    source = source_for(ssc, nats_server.url, stream)
    source.plan(1000, 4)
    purge(nats_server.url, stream, keep=2)
    with pytest.raises(
        Exception,
        match=rf"'{stream}': sequence [13] of the recorded range [13]\.\.[24] is no longer",
    ):
        source.compute(1000).collect()
    with pytest.raises(SourceError, match=rf"'{stream}': sequences 5\.\.8 were removed"):
        source.plan(2000, None)


def test_a_server_restart_during_a_read_is_retried_and_loses_nothing(ssc, nats_server):
    stream = new_stream(nats_server.url, [f"m{i}" for i in range(300)])
    source = source_for(ssc, nats_server.url, stream)
    source.plan(1000, None)
    nats_server.stop()
    result: list[list[str]] = []
    reader = threading.Thread(target=lambda: result.append(source.compute(1000).collect()))
    reader.start()
    nats_server.start()
    reader.join(60)
    assert result == [[f"m{i}" for i in range(300)]]


def test_an_unreachable_server_or_a_missing_stream_is_named(ssc, nats_server):
    with pytest.raises(SourceError, match=r"nats server nats://127\.0\.0\.1:1 unreachable"):
        source_for(ssc, "nats://127.0.0.1:1", "EVENTS")
    with pytest.raises(SourceError, match=r"nats stream 'NOSUCH' does not exist"):
        source_for(ssc, nats_server.url, "NOSUCH")


def test_a_server_that_closes_before_its_greeting_is_retried_as_unreachable(ssc):
    """Regression: a nats-server shutting down for a restart accepted a connection and closed
    it before sending INFO; nats-py's plain Error for that was taken for a refusal, and the
    driver stopped instead of retrying until the server was back."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        closer = threading.Thread(target=close_every_connection, args=(listener,), daemon=True)
        closer.start()
        with pytest.raises(SourceError, match=rf"nats://127\.0\.0\.1:{port} unreachable") as caught:
            NatsInputDStream(ssc, f"nats://127.0.0.1:{port}", "EVENTS", retry_seconds=1)
    assert "empty response from server" in str(caught.value)


def close_every_connection(listener: socket.socket) -> None:
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return  # the listener was closed
        connection.close()


@pytest.mark.parametrize(
    "login, secret_in_url, user_in_url",
    [
        (("--user", "app", "--pass", "s3cret"), "app:s3cret@", "app@"),
        (("--auth", "s3cret"), "s3cret@", ""),
    ],
    ids=["user-and-password", "token"],
)
def test_the_password_or_token_comes_from_the_environment(
    ssc, tmp_path, monkeypatch, login, secret_in_url, user_in_url
):
    server = NatsServer(tmp_path / "nats", login)
    server.start()
    try:
        stream = new_stream(f"nats://{secret_in_url}127.0.0.1:{server.port}", ["a", "b", "c"])
        url = f"nats://{user_in_url}127.0.0.1:{server.port}"
        with pytest.raises(SourceError, match="refused the login.*DSTREAM_NATS_PASSWORD"):
            source_for(ssc, url, stream)
        monkeypatch.setenv(password_env("nats"), "s3cret")
        source = source_for(ssc, url, stream)
        assert source.records_in(source.plan(1000, None)) == 3
    finally:
        server.stop()


def test_each_message_is_measured_from_its_stored_timestamp_once_however_often_read(
    ssc, nats_server
):
    """The server stamps a message when it stores it, between the publisher's clock readings
    before and after publishing; a range read twice still reports each message once."""
    before_ms = int(time.time() * 1000)
    stream = new_stream(nats_server.url, [f"m{i}" for i in range(20)])
    after_ms = int(time.time() * 1000)
    source = source_for(ssc, nats_server.url, stream)
    assert_stamped_between(source, 20, before_ms, after_ms)
