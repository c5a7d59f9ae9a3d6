"""Shared fixtures: one local SparkContext for the whole session keeps the suite fast."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

import psutil
import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Spark's Python workers must import the test modules whose functions they run, by the names
# pytest gives them (each folder's modules by their bare name), and the benchmark harness's
# programs, from the repository's root.
_TESTS = os.path.dirname(os.path.abspath(__file__))
_TEST_FOLDERS = sorted(str(p.parent) for p in Path(_TESTS).glob("*/test_*.py"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p
    for p in (
        _TESTS,
        *dict.fromkeys(_TEST_FOLDERS),
        os.path.dirname(_TESTS),
        os.environ.get("PYTHONPATH", ""),
    )
    if p
)


@pytest.fixture(scope="session")
def sc():
    """The session's SparkContext. Its JVM runs the quick JIT only, as the test drivers' do:
    it runs hundreds of small jobs on ever new code paths, so the optimizing compiler's work
    does not pay back. Measured side by side, the pytest process with its JVM: test_dstream_ops,
    test_pyspark_parity and test_context 116 -> 87 CPU seconds; Structured Streaming's checker
    test on a real job (structured-expert) 64 -> 44."""
    from dstream.worker.pydaemon import SPARK_CONF
    from pyspark import SparkConf, SparkContext
    from running_driver import QUICK_JIT_CONF, SPARK_TEST_CONF

    conf = (
        SparkConf()
        .setAll(list(SPARK_CONF.items()))
        .setAll(list(SPARK_TEST_CONF.items()))
        .setAll(list(QUICK_JIT_CONF.items()))
        .setMaster("local[2]")
        .setAppName("dstream-tests")
        .set("spark.default.parallelism", "2")
    )
    context = SparkContext.getOrCreate(conf)
    context.setLogLevel("ERROR")
    yield context
    context.stop()


# Tests that share one resource of this machine run on one xdist worker: the Kubernetes control
# plane (e2e/cluster/local.sh allows one cluster) and the image cache with its containerd.
SHARED_RESOURCES = {"k8s_cluster": "k8s", "image_tarball": "image"}


# The longest tests, in seconds in make test's parallel part on a 2-core machine (its --durations
# list, 2026-12-01; a name without [...] covers every parameter). xdist hands out tests in
# collection order, so a long one collected late starts late and the suite waits for it alone at
# the end: the workers take these first, longest first. Refresh it when that list changes a lot.
LONGEST_S = {
    "tests/streaming/test_example_programs.py::test_the_recoverable_example_restarts_without_calling_setup[pyspark]": 202,
    "tests/fault/test_soak.py::test_soak_under_driver_and_executor_kills_and_a_sink_outage[kafka]": 183,
    "tests/fault/test_soak.py::test_soak_under_driver_and_executor_kills_and_a_sink_outage": 139,
    "tests/fault/test_soak.py::test_soak_under_driver_and_executor_kills_and_a_sink_outage[files+standby]": 130,
    "tests/fault/test_soak.py::test_soak_under_driver_and_executor_kills_and_a_sink_outage[redis]": 123,
    "tests/streaming/test_example_programs.py::test_an_example_gives_the_same_output_on_both_engines_with_a_bare_path[windowed_counts]": 103,
    "tests/fault/test_fault_standby.py::test_a_leader_stopped_mid_batch_hands_the_lead_to_its_standby_at_once": 103,
    "tests/streaming/test_example_programs.py::test_an_example_gives_the_same_output_on_both_engines_with_a_bare_path[stateful_wordcount]": 94,
    "tests/fault/test_fault_driver_kill.py::test_driver_killed_repeatedly_output_exact": 91,
    "tests/fault/test_fault_standby.py::test_standby_takes_over_a_frozen_then_a_killed_leader_output_exact": 89,
    "tests/streaming/test_example_programs.py::test_the_recoverable_example_restarts_without_calling_setup[dstream]": 75,
    "tests/fault/test_fault_cli.py::test_mismatched_checkpoint_exit_3_then_fresh_run_stops_gracefully": 69,
    "tests/fault/test_fault_overload.py::test_sigkill_during_overload_loses_and_repeats_nothing": 68,
    "tests/fault/test_fault_executor_loss.py::test_executor_killed_mid_batch_output_unchanged": 67,
    "tests/connectors/test_exactly_once.py::test_kafka_to_kafka_exactly_once_through_kills_and_a_broker_restart": 65,
    "tests/connectors/test_exactly_once.py::test_kafka_to_postgres_exactly_once_through_kills_an_executor_kill_and_a_broker_restart": 65,
    "tests/streaming/test_example_programs.py::test_an_example_gives_the_same_output_on_both_engines_with_a_bare_path[transform_join]": 57,
    "tests/streaming/test_workers_without_dstream.py::test_keyed_and_windowed_operators_run_on_workers_without_dstream": 52,
    "tests/fault/test_fault_cli.py::test_a_batch_failing_for_good_exits_5_uncommitted_and_runs_again_after_a_restart": 48,
    "tests/connectors/test_exactly_once.py": 42,
    "tests/streaming/test_example_programs.py": 41,
    "tests/fault/test_fault_checkpoint.py::test_a_restarted_window_subtracts_its_durable_batches_instead_of_recomputing_them": 39,
}


def expected_seconds(nodeid: str) -> float:
    """The test's entry in LONGEST_S, the most specific that names it (0: a short test)."""
    names = [
        name for name in LONGEST_S if nodeid == name or nodeid.startswith((name + "[", name + "::"))
    ]
    return LONGEST_S[max(names, key=len)] if names else 0


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, group in SHARED_RESOURCES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker: the order is the order of dispatch
        items.sort(key=lambda item: -expected_seconds(item.nodeid))  # stable: the rest as is


def spark_work_dir() -> Path:
    """Where local-cluster's standalone workers put each application's executor directories."""
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0]) / "work"


_SESSION_STARTED = time.time()


def pytest_sessionfinish(session):
    """Remove the executor directories of the session's local-cluster runs, once, at the end.
    Not per test: two drivers started in the same second get the same application ID
    (`app-<time>-0000`, each from its own master), so a test removing "its" directory could
    remove the working directory of another test's live executor, whose Python workers then
    failed to import anything new (a soak in CI). Directories that a live process still works
    in (another pytest session's) are kept."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: the others may still run
        return
    in_use = set()
    for process in psutil.process_iter(["cwd"]):
        if process.info["cwd"]:
            in_use.add(Path(process.info["cwd"]))
    for app in spark_work_dir().glob("app-*"):
        try:
            made_now = app.stat().st_mtime >= _SESSION_STARTED
        except FileNotFoundError:
            continue
        if made_now and not any(app in cwd.parents or app == cwd for cwd in in_use):
            shutil.rmtree(app, ignore_errors=True)
