"""The chaos suite's reading of a new driver's and its executors' logs (e2e/chaos/startup.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from e2e.chaos.startup import EXECUTOR_MARKS, first_marks, parse_timestamp

EXECUTOR_LOG = """\
2026-11-26T06:37:01.250000000Z 26/11/26 06:37:01 INFO KubernetesExecutorBackend: Started daemon with process name: 14@wc-exec-1
2026-11-26T06:37:02.5Z 26/11/26 06:37:02 INFO KubernetesExecutorBackend: Connecting to driver: spark://CoarseGrainedScheduler@10.244.0.9:7078
2026-11-26T06:37:03.000000001Z 26/11/26 06:37:03 INFO KubernetesExecutorBackend: Connecting to driver: again
2026-11-26T06:37:04Z 26/11/26 06:37:04 INFO KubernetesExecutorBackend: Successfully registered with driver
"""


def test_the_kubelets_timestamps_are_read_to_the_nanosecond():
    whole = datetime(2026, 11, 26, 6, 37, 1, tzinfo=UTC).timestamp()
    assert parse_timestamp("2026-11-26T06:37:01.250000000Z") == whole + 0.25
    assert parse_timestamp("2026-11-26T06:37:01Z") == whole


def test_each_mark_is_the_first_line_that_shows_it_and_a_missing_one_is_left_out():
    start = parse_timestamp("2026-11-26T06:37:01Z")
    marks = first_marks(EXECUTOR_LOG, EXECUTOR_MARKS)
    assert {name: round(at - start, 2) for name, at in marks.items()} == {
        "jvm_logging": 0.25,
        "connecting": 1.5,
        "registered": 3.0,
    }
    assert first_marks(EXECUTOR_LOG.splitlines()[0], EXECUTOR_MARKS).keys() == {"jvm_logging"}
