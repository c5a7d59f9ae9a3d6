"""The Helm chart renders, lints, validates against Kubernetes 1.30's schemas, and keeps its
promises: one Recreate replica, least privilege, hardened pods, the same CRD as crds/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from dstream_operator import resources

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "dstream"
KUBE_VERSION = "1.30"
# Kinds whose schemas kubernetes-validate cannot know: kopf's peering and the Prometheus operator.
CUSTOM_KINDS = {"ClusterKopfPeering", "KopfPeering", "ServiceMonitor", "PodMonitor"}
EVERYTHING_ON = {
    "watchNamespaces": ["streams", "more-streams"],
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
    "grafanaDashboard": {"enabled": True},
    "peering": {"enabled": False, "name": "dstream"},
    "sparkUI": {
        "ingress": {
            "enabled": True,
            "host": "{job}.{namespace}.ui.example.com",
            "className": "nginx",
            "annotations": {"nginx.ingress.kubernetes.io/auth-type": "basic"},
        }
    },
}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name="dstream", namespace="dstream-system")
    objects = []
    for name, text in manifests.items():
        if name.endswith(".yaml"):
            objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


@pytest.mark.parametrize("values", [{}, EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_lint_is_clean(values):
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}.0")
    assert report["errors"] == [] and report["messages"] == [], report


@pytest.mark.parametrize("values", [{}, EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_every_rendered_object_is_valid_kubernetes(values):
    for obj in render(values):
        if obj["kind"] in CUSTOM_KINDS:
            assert obj["metadata"]["name"]
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_crds_are_valid_and_the_same_as_the_repository_crds():
    """crds/ holds every CRD the chart installs (for `kubectl apply -f crds/` without Helm)."""
    chart_crds = {path.name: path.read_bytes() for path in (CHART / "crds").glob("*.yaml")}
    assert chart_crds == {path.name: path.read_bytes() for path in (ROOT / "crds").glob("*.yaml")}
    with helm.Chart.load(CHART) as chart:
        crds = [yaml.safe_load_all(c["data"]) for c in chart.crds]
    names = []
    for docs in crds:
        for crd in docs:
            kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
            names.append(crd["metadata"]["name"])
    assert sorted(names) == [
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
        "streamingjobs.dstream.dev",
    ]


PEERING = {"leaderElection": {"enabled": False, "leaseSeconds": 15}, "peering": {"enabled": True}}


def test_two_operators_elect_a_leader_through_a_lease_by_default():
    objects = render()
    spec = one(objects, "Deployment")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    args = spec["template"]["spec"]["containers"][0]["args"]
    assert "--lease=dstream-system/dstream" in args and "--lease-seconds=15" in args
    assert not [a for a in args if a.startswith(("--peering", "--standalone"))]
    assert not [o for o in objects if "KopfPeering" in o["kind"]]
    rules = granted(one(objects, "ClusterRole")["rules"])
    assert ("coordination.k8s.io", "leases", "patch") in rules
    assert not [r for r in rules if r[0] == "kopf.dev"]


def test_operator_deployment_without_leader_election_is_single_recreate_and_hardened():
    deployment = one(render(PEERING | {"replicas": 3}), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["limits"]["memory"]
    assert container["command"] == ["dstream-operator"]
    assert "--all-namespaces" in container["args"]
    assert "--peering=dstream" in container["args"]
    assert "--liveness=http://0.0.0.0:8081/healthz" in container["args"]
    assert container["livenessProbe"]["httpGet"]["port"] == "http-health"


def test_watch_namespaces_and_standalone():
    objects = render(EVERYTHING_ON | {"leaderElection": {"enabled": False, "leaseSeconds": 15}})
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=streams" in args and "--namespace=more-streams" in args
    assert "--all-namespaces" not in args and "--standalone" in args
    assert not [o for o in objects if "KopfPeering" in o["kind"]]


def test_peering_objects_follow_the_watched_namespaces():
    objects = render({"watchNamespaces": ["streams"]} | PEERING)
    (peering,) = [o for o in objects if "KopfPeering" in o["kind"]]
    assert (peering["kind"], peering["metadata"]["namespace"]) == ("KopfPeering", "streams")
    assert one(render(PEERING), "ClusterKopfPeering")["metadata"]["name"] == "dstream"


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_cluster_role_is_what_the_operator_needs():
    rules = granted(one(render(), "ClusterRole")["rules"])
    assert ("dstream.dev", "streamingjobs", "watch") in rules
    assert ("dstream.dev", "streamingjobs/status", "patch") in rules
    assert ("", "events", "create") in rules
    assert ("rbac.authorization.k8s.io", "roles", "create") in rules
    assert ("policy", "poddisruptionbudgets", "delete") in rules
    assert not [r for r in rules if "*" in r]
    assert not [r for r in rules if r[1] in ("secrets", "nodes", "clusterroles")]
    # Kubernetes lets the operator grant a driver only what it holds itself.
    assert granted(resources.driver_rules()) <= rules
    binding = one(render(), "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == one(render(), "ServiceAccount")["metadata"]["name"]


def test_monitors_are_off_by_default_and_scrape_when_on():
    kinds = {o["kind"] for o in render()}
    assert not kinds & {"ServiceMonitor", "PodMonitor"}
    objects = render(EVERYTHING_ON)
    service = one(objects, "Service")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    drivers = one(objects, "PodMonitor")["spec"]
    assert drivers["selector"]["matchLabels"] == {"dstream.dev/role": "driver"}
    assert drivers["namespaceSelector"]["matchNames"] == ["streams", "more-streams"]
    assert drivers["podMetricsEndpoints"][0]["port"] == "http-api"


def test_grafana_dashboard_config_map_loads_the_dashboards():
    config_map = one(render(EVERYTHING_ON), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    assert sorted(config_map["data"]) == files
    dashboard = json.loads(config_map["data"]["dstream.json"])
    assert dashboard["title"] and dashboard["uid"] and dashboard["panels"]
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert any("dstream_batches_completed_total" in q for q in queries)
    assert not [o for o in render() if o["kind"] == "ConfigMap"]


GOOD_VALUES = [
    {},
    EVERYTHING_ON,
    {"image": {"repository": "registry.local/dstream", "tag": "1.2.3", "pullPolicy": "Always"}},
    {"operator": {"driverHost": "pod-ip", "pollSeconds": 2.5}},
    {"operator": {"apiServer": "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"}},
    {"resources": {"requests": {"cpu": "100m", "memory": "200Mi"}, "limits": {"memory": "1Gi"}}},
]
BAD_VALUES = [
    ({"image": {"repository": "d", "pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"watchNamespaces": "streams"}, "watchNamespaces"),
    ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
    ({"replicas": 0}, "replicas"),
    ({"leaderElection": {"enabled": True, "leaseSeconds": 1}}, "leaseSeconds"),
    ({"metrics": {"port": 0}}, "port"),
    ({"operator": {"driverHost": "ip"}}, "driverHost"),
    ({"operator": {"apiServer": "kubernetes.default.svc"}}, "apiServer"),
    ({"metrics": {"port": 8080, "serviceMonitor": {"interval": "often"}}}, "interval"),
    ({"resources": {"limits": {"memory": "lots"}}}, "memory"),
    ({"sparkUI": {"ingress": {"enabled": True, "host": ""}}}, "host"),
]


@pytest.mark.parametrize("values", GOOD_VALUES)
def test_schema_accepts_good_values(values):
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)


@pytest.mark.parametrize(("values", "field"), BAD_VALUES)
def test_schema_rejects_bad_values_naming_them(values, field):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as error:
        chart.validate_schema(values)
    assert field in str(error.value)


def test_the_spark_ui_ingress_is_off_by_default_and_passed_to_the_operator_when_on():
    def args(values):
        return one(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]

    assert not [a for a in args({}) if a.startswith("--ui-ingress")]
    assert [a for a in args(EVERYTHING_ON) if a.startswith("--ui-ingress")] == [
        "--ui-ingress-host={job}.{namespace}.ui.example.com",
        "--ui-ingress-class=nginx",
        "--ui-ingress-annotation=nginx.ingress.kubernetes.io/auth-type=basic",
    ]
    rules = granted(one(render(), "ClusterRole")["rules"])
    for verb in ("create", "patch", "delete"):  # delete: those made before the option went off
        assert ("networking.k8s.io", "ingresses", verb) in rules
