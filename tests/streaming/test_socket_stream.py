"""socketTextStream, the first program of Spark's streaming guide (network_wordcount): lines from
a real TCP server on a loopback port, counted per batch; the warning at start that a restart
loses them, and the loss itself, logged, when a batch is re-run from the checkpoint."""

from __future__ import annotations

import inspect
import logging
import socket
import threading
import warnings
from operator import add
from typing import Any

import pytest
from conditions import eventually
from dstream import StreamingContext
from dstream.runtime.control.failure import FailurePolicy
from dstream.runtime.scheduling.clock import ManualClock
from streams import BATCH_TIMEOUT_S, final_failure, manual_context

WAIT_S = 60


class LineServer:
    """A TCP server on a free loopback port that writes what it is given to the client that
    connected last (a restarted receiver connects again)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self._client: socket.socket | None = None
        self._connected = threading.Condition()
        threading.Thread(target=self._accept, name="line-server", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            with self._connected:
                self._client = client
                self.connections += 1
                self._connected.notify_all()

    def send(self, data: bytes, connection: int = 1) -> None:
        """Write `data` once the `connection`-th client has connected."""
        with self._connected:
            assert self._connected.wait_for(lambda: self.connections >= connection, WAIT_S)
            assert self._client is not None
            self._client.sendall(data)

    def close(self) -> None:
        self._listener.close()
        if self._client is not None:
            self._client.close()


@pytest.fixture
def server():
    line_server = LineServer()
    yield line_server
    line_server.close()


def advance_one(ssc: StreamingContext) -> None:
    ssc._clock.advance(ssc._batch_ms)
    ssc._scheduler.wait_for_batch(ssc._clock.now_ms(), BATCH_TIMEOUT_S)


def test_network_wordcount_counts_the_lines_received_per_batch(sc, server):
    """Each batch takes the lines received before it; \\n, \\r\\n and \\r end a line, as in
    Spark's receiver, and bytes that are not UTF-8 become U+FFFD."""
    ssc = manual_context(sc)
    counts: list[list[tuple[str, int]]] = []
    lines = ssc.socketTextStream("127.0.0.1", server.port)
    words = lines.flatMap(lambda line: line.split(" ")).map(lambda word: (word, 1))
    words.reduceByKey(add).foreachRDD(lambda rdd: counts.append(sorted(rdd.collect())))
    ssc.start()
    source = ssc.input_streams[0]
    for data, received in [
        (b"to be or\nnot to be\n", 2),
        (b"c\r\nc\rc\n\xff\n", 4),
        (b"", 0),
        (b"last line\n", 1),
    ]:
        server.send(data)
        eventually(lambda received=received: source.backlog(0) == received, WAIT_S)
        advance_one(ssc)
    ssc.stop(stopSparkContext=False)

    assert counts == [
        [("be", 2), ("not", 1), ("or", 1), ("to", 2)],
        [("c", 3), ("\ufffd", 1)],
        [],
        [("last", 1), ("line", 1)],
    ]


def test_start_warns_that_a_restart_loses_the_lines(sc, server, caplog):
    ssc = manual_context(sc)
    ssc.socketTextStream("127.0.0.1", server.port).foreachRDD(lambda rdd: None)
    with caplog.at_level(logging.WARNING, logger="dstream.sources"):
        ssc.start()
    ssc.stop(stopSparkContext=False)
    warned = [r.getMessage() for r in caplog.records if r.name == "dstream.sources"]
    assert len(warned) == 1
    assert warned[0].startswith(f"socketTextStream(127.0.0.1:{server.port}): the lines it")
    assert "a restart or a driver failure loses those not yet processed" in warned[0]


def test_a_restart_loses_the_lines_of_a_batch_not_yet_committed_and_says_so(
    sc, server, tmp_path, caplog
):
    """A batch whose output failed for good is re-run by the next start from its record, but
    the driver that held its lines is gone: it runs empty and the loss is logged. Lines sent
    to the new driver's receiver are counted again."""
    checkpoint = str(tmp_path / "checkpoint")
    seen: list[list[str]] = []
    store = {"down": True}

    def setup(now_ms: int) -> StreamingContext:
        ssc = StreamingContext(sc, 1, clock=ManualClock(now_ms))

        def keep(rdd: Any) -> None:
            if store["down"]:
                raise OSError("the store is down")
            seen.append(sorted(rdd.collect()))

        ssc.socketTextStream("127.0.0.1", server.port).foreachRDD(keep)
        return ssc

    ssc = StreamingContext.getOrCreate(checkpoint, lambda: setup(0))
    ssc.start()
    ssc._scheduler.failure_policy = FailurePolicy(retries=0)
    server.send(b"a\nb\nc\n")
    eventually(lambda: ssc.input_streams[0].backlog(0) == 3, WAIT_S)
    ssc._clock.advance(1000)
    final_failure(ssc)
    ssc.stop(stopSparkContext=False)

    store["down"] = False
    ssc = StreamingContext.getOrCreate(checkpoint, lambda: setup(1000), rebuild=True)
    with caplog.at_level(logging.WARNING, logger="dstream.sources"):
        ssc.start()
        ssc._scheduler.wait_for_batch(1000, BATCH_TIMEOUT_S)
    server.send(b"d\n", connection=2)
    eventually(lambda: ssc.input_streams[0].backlog(0) == 1, WAIT_S)
    advance_one(ssc)
    ssc.stop(stopSparkContext=False)

    assert seen == [[], ["d"]]
    lost = f"socketTextStream(127.0.0.1:{server.port}): the 3 lines of batch "
    assert any(r.getMessage().startswith(lost) for r in caplog.records)


def test_socket_and_binary_record_streams_take_pysparks_parameters():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from pyspark.streaming import StreamingContext as PySparkStreamingContext

    for name in ("socketTextStream", "binaryRecordsStream"):
        ours = inspect.signature(getattr(StreamingContext, name)).parameters.values()
        theirs = inspect.signature(getattr(PySparkStreamingContext, name)).parameters.values()
        assert [(p.name, p.default) for p in ours] == [(p.name, p.default) for p in theirs]
