"""The recovery timeline's pieces that need no Spark: the executor count a master implies, the
process start time, and one line per phase."""

from __future__ import annotations

import logging
import time

import psutil
from dstream.runtime.scheduling import timeline


def test_expected_executors_follow_the_master():
    assert timeline.expected_executors("local-cluster[2,1,1024]", None) == 2
    assert timeline.expected_executors("local[2]", "5") == 0  # the driver runs the tasks
    assert timeline.expected_executors("k8s://https://api:6443", "3") == 3
    assert timeline.expected_executors("k8s://https://api:6443", None) == 2  # Spark's default


def test_the_process_start_time_is_the_kernels():
    started = timeline.process_start_time()
    assert started <= time.time()
    assert abs(started - psutil.Process().create_time()) < 1.5  # psutil rounds to boot seconds


def test_each_phase_is_logged_once(caplog):
    with caplog.at_level(logging.INFO, logger=timeline.__name__):
        timeline.mark("test_phase", at=1000.5)
        timeline.mark("test_phase")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "phase=test_phase at=1000.500" in lines[0]
