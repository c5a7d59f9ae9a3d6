"""Two operators as the chart runs them (2 replicas, a Lease): exactly one acts; the other stands
by without watching or writing anything, and takes over when the leader is killed (once the
Lease expires) or stops cleanly (once it released the Lease), adopting the running driver
instead of starting a second one."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from tests.k8s import test_operator
from tests.k8s.conftest import LocalCluster
from tests.k8s.test_operator import Harness, OperatorProcess, Release

pytestmark = pytest.mark.k8s

chart_crds = test_operator.chart_crds
namespace = test_operator.namespace
chart_release = test_operator.chart_release

TAKEOVER_SLACK_SECONDS = 8.0  # retry period, process start-up and a loaded 2-core machine


def lease_seconds(release: Release) -> float:
    (arg,) = [a for a in release.args if a.startswith("--lease-seconds=")]
    return float(arg.split("=", 1)[1])


def acted(operator: OperatorProcess) -> float:
    """Every handler and supervision run the operator counted, over all handlers."""
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "dstream_operator_reconciliations_total"
    )


def leads(operator: OperatorProcess) -> bool:
    return operator.metric("dstream_operator_leader") == 1


@pytest.fixture
def operators(
    k8s_cluster: LocalCluster, namespace: str, chart_release: Release, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, OperatorProcess]]:
    pair = tuple(
        OperatorProcess(chart_release.args, chart_release.kubeconfig, tmp_path / f"{n}.log")
        for n in ("first", "second")
    )
    try:
        yield pair
    finally:
        for process in pair:
            process.stop()
        test_operator._remove_jobs(Harness(k8s_cluster, namespace, pair[0]))


def _elect_first(k8s: Harness, first: OperatorProcess, second: OperatorProcess) -> None:
    first.start()
    k8s.wait_for("the first operator leads", lambda: leads(first))
    second.start()  # live (the liveness probe passes) while standing by
    k8s.holds_for(
        "the second operator stands by, acting on nothing",
        lambda: not leads(second) and acted(second) == 0,
        seconds=3,
    )


def _config_map_exists(k8s: Harness, name: str) -> bool:
    try:
        k8s.core.read_namespaced_config_map(f"{name}-job", k8s.namespace)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def test_a_killed_leader_is_replaced_once_its_lease_expires(
    k8s_cluster: LocalCluster, namespace: str, chart_release: Release, operators
):
    first, second = operators
    k8s = Harness(k8s_cluster, namespace, first)
    _elect_first(k8s, first, second)
    k8s.create_job("ha")
    driver = k8s.running_driver("ha")
    k8s.wait_for("the leader supervises the job", lambda: acted(first) >= 2)
    assert acted(second) == 0 and not leads(second)

    assert first.process is not None
    os.kill(first.process.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    first.process.wait()
    k8s.operator = second
    limit = lease_seconds(chart_release) + TAKEOVER_SLACK_SECONDS
    k8s.wait_for("the standby takes over", lambda: leads(second), timeout=limit + 30)
    takeover = time.monotonic() - killed_at
    print(f"takeover after SIGKILL: {takeover:.1f}s (lease {lease_seconds(chart_release):.0f}s)")
    assert takeover <= limit
    assert takeover >= lease_seconds(chart_release) * 2 / 3  # it waited for the Lease to expire

    k8s.create_job("after", suspend=True)
    k8s.wait_for("the new leader sets up a new job", lambda: _config_map_exists(k8s, "after"))
    k8s.holds_for(
        "the running driver adopted, not replaced",
        lambda: [p.metadata.uid for p in k8s.pods("ha")] == [driver.metadata.uid],
        seconds=3,
    )
    assert k8s.status("ha")["restarts"] == 0


def test_a_leader_that_stops_cleanly_hands_over_without_waiting_for_the_lease(
    k8s_cluster: LocalCluster, namespace: str, chart_release: Release, operators
):
    first, second = operators
    k8s = Harness(k8s_cluster, namespace, first)
    _elect_first(k8s, first, second)
    stopped_at = time.monotonic()
    first.stop()  # SIGTERM: kopf stops gracefully, then the Lease is released
    k8s.wait_for("the standby takes over", lambda: leads(second), timeout=30)
    handover = time.monotonic() - stopped_at
    print(f"handover after SIGTERM: {handover:.1f}s")
    assert handover < lease_seconds(chart_release)  # released, not expired
    k8s.operator = second
    k8s.create_job("handed", suspend=True)
    k8s.wait_for("the new leader acts", lambda: _config_map_exists(k8s, "handed"))
