"""`profile --py4j` (bench/throughput/py4j_calls.py): py4j commands counted while installed,
by thread and call site, and py4j left as it was afterwards."""

from __future__ import annotations

import threading

from py4j.java_gateway import GatewayClient

from bench.throughput.py4j_calls import Py4JCalls, call_site


def test_each_py4j_call_of_this_thread_is_counted_once_and_py4j_is_restored(sc):
    original = GatewayClient.send_command
    calls = Py4JCalls()
    with calls:
        for _ in range(3):
            sc.setLocalProperty("bench.py4j.test", "x")  # one call each
            calls.batch_completed(None)
    assert GatewayClient.send_command is original
    assert calls.threads[threading.current_thread().name] == 3
    assert calls.kinds["call"] >= 3 and len(calls.at_batch) == 3
    sc.setLocalProperty("bench.py4j.test", None)


def test_a_call_site_names_the_innermost_frame_of_ours():
    from bench.throughput import profile

    def frame_in(function):  # a frame whose code lives in bench/throughput/profile.py
        return type("F", (), {"f_code": function.__code__, "f_back": None})()

    assert call_site(frame_in(profile.covered_ms)) == "bench/throughput/profile.py:covered_ms"
