"""What platform teams need from the operator, against the real Kubernetes 1.20 API server: pod
customisation the API server accepts and keeps, disruption budgets the disruption controller
can count, and a job that says why when the API server rejects its driver pod."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from tests.k8s import test_operator
from tests.k8s.test_operator import Harness

# The operator harness's module fixtures: this file gets an operator of its own.
chart_crds = test_operator.chart_crds
namespace = test_operator.namespace
chart_release = test_operator.chart_release
operator_process = test_operator.operator_process
k8s = test_operator.k8s

pytestmark = pytest.mark.k8s

SIDECAR = {"name": "log-shipper", "image": "busybox:1.36", "args": ["sleep", "3600"]}


def budgets(k8s: Harness) -> Any:
    """PodDisruptionBudgets through policy/v1beta1, all that Kubernetes 1.20 serves."""
    dynamic = DynamicClient(k8s.cluster.api_client)
    return dynamic.resources.get(api_version="policy/v1beta1", kind="PodDisruptionBudget")


def budget_status(k8s: Harness, name: str) -> dict[str, Any]:
    budget = budgets(k8s).get(name=name, namespace=k8s.namespace).to_dict()
    return budget.get("status") or {}


def warnings_about(k8s: Harness, kind: str, name: str) -> list[client.CoreV1Event]:
    events = k8s.core.list_namespaced_event(
        k8s.namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return [e for e in events if e.involved_object.kind == kind and e.type == "Warning"]


def test_pod_customisation_reaches_the_driver_pod_and_the_executor_template(k8s: Harness):
    node = k8s.cluster.node_name
    driver = {
        "cores": 1,
        "memory": "512m",
        "coresLimit": "1",
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "streaming"}],
        "labels": {"team": "analytics"},
        "annotations": {"cost-center": "4711"},
        "env": [{"name": "TZ", "value": "UTC"}],
        "envFrom": [{"configMapRef": {"name": "tuning", "optional": True}}],
        "podTemplate": {
            "spec": {"containers": [{"name": "driver", "command": ["sh"]}, SIDECAR]},
        },
    }
    executor = {"instances": 1, "nodeSelector": {"pool": "streaming"}}
    job = k8s.create_job("placed", driver=driver, executor=executor)
    # the CRD schema keeps every field (Kubernetes 1.20 silently prunes unknown ones)
    assert job["spec"]["driver"] == driver

    pod = k8s.running_driver("placed")
    assert pod.spec.node_selector == {"kubernetes.io/hostname": node}
    assert [c.name for c in pod.spec.containers] == ["driver", "log-shipper"]
    main = pod.spec.containers[0]
    assert main.command[:2] == ["python", "-m"]  # the operator's, not the template's ["sh"]
    assert main.resources.limits["cpu"] == "1"
    assert {e.name for e in main.env} >= {"TZ", "POD_IP"}
    assert main.env_from[0].config_map_ref.name == "tuning"
    assert ("dedicated", "streaming") in [(t.key, t.value) for t in pod.spec.tolerations]
    assert pod.metadata.labels["team"] == "analytics"
    assert pod.metadata.annotations["cost-center"] == "4711"
    assert "4040" in str([p.container_port for p in main.ports])

    warning = k8s.wait_for(
        "a PodTemplateOverridden warning",
        lambda: [w for w in warnings_about(k8s, "StreamingJob", "placed")],
    )
    assert warning[0].reason == "PodTemplateOverridden"
    assert "spec.containers[driver].command" in warning[0].message

    config = k8s.core.read_namespaced_config_map("placed-job", k8s.namespace)
    template = yaml.safe_load(config.data["executor-pod-template.yaml"])
    assert template["spec"]["nodeSelector"] == {"pool": "streaming"}
    assert "spark.kubernetes.executor.podTemplateFile=/etc/dstream/executor-pod-template.yaml" in (
        main.args
    )


def test_disruption_budgets_are_counted_by_the_disruption_controller(k8s: Harness):
    """minAvailable budgets over the job's pods are evaluated (expectedPods is known); a
    maxUnavailable budget over the same pods is not, which is why the operator writes the
    former: the disruption controller cannot scale a StreamingJob."""
    k8s.create_job(
        "budget", driver={"cores": 1, "memory": "512m", "disruptionBudget": {"maxUnavailable": 0}}
    )
    k8s.running_driver("budget")
    status = k8s.wait_for(
        "the driver budget evaluated",
        lambda: (s := budget_status(k8s, "budget-driver")).get("expectedPods") == 1 and s,
    )
    assert status["desiredHealthy"] == 1  # maxUnavailable 0: a drain waits for the driver
    assert status["disruptionsAllowed"] == 0

    k8s.patch_spec("budget", {"driver": {"disruptionBudget": {"maxUnavailable": 1}}})
    k8s.wait_for(
        "the driver budget follows the spec",
        lambda: budget_status(k8s, "budget-driver").get("desiredHealthy") == 0,
    )

    by_max_unavailable = {
        "apiVersion": "policy/v1beta1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "by-max-unavailable"},
        "spec": {
            "maxUnavailable": 1,
            "selector": {
                "matchLabels": {"dstream.dev/job": "budget", "dstream.dev/role": "driver"}
            },
        },
    }
    budgets(k8s).create(body=by_max_unavailable, namespace=k8s.namespace)
    k8s.wait_for(
        "the disruption controller gives up on the maxUnavailable budget",
        lambda: any(
            w.reason == "CalculateExpectedPodCountFailed"
            for w in warnings_about(k8s, "PodDisruptionBudget", "by-max-unavailable")
        ),
    )
    assert budget_status(k8s, "by-max-unavailable").get("disruptionsAllowed", 0) == 0


def test_a_driver_pod_the_api_server_rejects_fails_the_job_until_the_spec_is_fixed(
    k8s: Harness,
):
    imageless = {"name": "log-shipper", "args": ["sleep", "3600"]}
    template = {"spec": {"containers": [imageless]}}
    driver = {"cores": 1, "memory": "512m", "podTemplate": template}
    k8s.create_job("rejected", driver=driver)
    status = k8s.wait_for("phase Failed", k8s.phase_is("rejected", "Failed"))
    assert "rejected the driver pod" in status["message"]
    assert "image" in status["message"]
    assert "DriverPodRejected" in k8s.event_reasons("rejected")
    assert k8s.driver("rejected") is None

    template["spec"]["containers"][0]["image"] = "busybox:1.36"
    k8s.patch_spec("rejected", {"driver": driver})
    pod = k8s.running_driver("rejected")
    assert [c.name for c in pod.spec.containers] == ["driver", "log-shipper"]
