"""Pod customisation: first-class fields and pod templates for the driver and the executors."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from dstream.spec import SpecError
from dstream_operator import resources
from dstream_operator.pod_merge import merge_under
from dstream_operator.reconcile import Observation, plan
from dstream_operator.status import JobStatus

from tests.operator.test_crd import validator
from tests.operator.test_resources import OWNER, conf_of, job

PLACEMENT = {
    "serviceAccountName": "analytics",
    "labels": {"team": "data", "dstream.dev/job": "other"},
    "annotations": {"iam.example.com/role": "reader"},
    "nodeSelector": {"pool": "streaming"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "spark"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "priorityClassName": "streaming",
    "imagePullSecrets": [{"name": "registry"}],
    "env": [{"name": "TZ", "value": "UTC"}],
    "envFrom": [{"configMapRef": {"name": "tuning"}}],
    "coresLimit": "1500m",
}
SIDECAR = {"name": "log-shipper", "image": "fluent-bit:2", "args": ["--quiet"]}
TEMPLATE = {
    "metadata": {"labels": {"sidecar": "yes"}},
    "spec": {
        "nodeSelector": {"pool": "batch", "disk": "ssd"},
        "initContainers": [{"name": "wait", "image": "busybox", "command": ["true"]}],
        "containers": [{"name": "driver", "command": ["sh"], "workingDir": "/work"}, SIDECAR],
        "volumes": [{"name": "logs", "emptyDir": {}}],
        "restartPolicy": "Always",
    },
}


def containers(pod) -> dict:
    return {c["name"]: c for c in pod["spec"]["containers"]}


def test_merge_keeps_the_generated_value_and_names_what_it_overrode():
    template = {
        "spec": {
            "containers": [{"name": "main", "command": ["x"], "tty": True}, {"name": "side"}],
            "tolerations": [{"key": "a"}],
            "nodeSelector": {"pool": "x", "disk": "ssd"},
        }
    }
    generated = {
        "spec": {
            "containers": [{"name": "main", "command": ["run"], "ports": [{"containerPort": 1}]}],
            "tolerations": [{"key": "b"}],
            "nodeSelector": {"pool": "y"},
        }
    }
    merged, overridden = merge_under(template, generated)
    assert merged["spec"]["containers"] == [
        {"name": "main", "command": ["run"], "tty": True, "ports": [{"containerPort": 1}]},
        {"name": "side"},
    ]
    assert merged["spec"]["tolerations"] == [{"key": "a"}, {"key": "b"}]
    assert merged["spec"]["nodeSelector"] == {"pool": "y", "disk": "ssd"}
    assert overridden == ["spec.containers[main].command", "spec.nodeSelector.pool"]


def test_first_class_fields_place_and_secure_the_driver():
    spec_job = job(driver={"cores": 1, **PLACEMENT})
    pod = resources.driver_pod(spec_job, OWNER)
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "analytics"
    assert spec["nodeSelector"] == {"pool": "streaming"}
    assert spec["tolerations"] == PLACEMENT["tolerations"]
    assert spec["affinity"] == PLACEMENT["affinity"]
    assert spec["priorityClassName"] == "streaming"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    labels = pod["metadata"]["labels"]
    assert labels["team"] == "data"
    assert labels["dstream.dev/job"] == "wc"  # the operator's label wins
    assert pod["metadata"]["annotations"]["iam.example.com/role"] == "reader"
    assert resources.SPEC_HASH_ANNOTATION in pod["metadata"]["annotations"]
    driver = containers(pod)["driver"]
    env = {e["name"]: e for e in driver["env"]}
    assert env["TZ"] == {"name": "TZ", "value": "UTC"}
    assert "POD_IP" in env
    assert driver["envFrom"] == [{"configMapRef": {"name": "tuning"}}]
    assert driver["resources"]["limits"] == {"cpu": "1500m", "memory": "1434Mi"}
    assert resources.template_overrides(spec_job, OWNER) == [
        "driver pod metadata.labels.dstream.dev/job"
    ]
    kubernetes_validate.validate(pod, "1.30", strict=True)


def test_a_users_service_account_gets_the_drivers_role():
    binding = resources.role_binding(job(driver={"serviceAccountName": "analytics"}), OWNER)
    assert [s["name"] for s in binding["subjects"]] == ["analytics"]
    assert binding["roleRef"]["name"] == "dstream-driver"  # the namespace's shared Role
    assert binding["metadata"]["ownerReferences"][0]["name"] == "wc"
    assert resources.role_binding(job(), OWNER) is None  # the shared account is bound already


def test_the_driver_template_adds_sidecars_and_cannot_change_what_the_operator_owns():
    spec_job = job(driver={"nodeSelector": {"pool": "streaming"}, "podTemplate": TEMPLATE})
    pod = resources.driver_pod(spec_job, OWNER)
    assert list(containers(pod)) == ["driver", "log-shipper"]
    assert containers(pod)["log-shipper"] == SIDECAR
    driver = containers(pod)["driver"]
    generated = resources.driver_pod(job(), OWNER)["spec"]["containers"][0]
    assert driver["command"] == generated["command"] != ["sh"]
    assert driver["workingDir"] == "/work"
    assert pod["spec"]["initContainers"][0]["name"] == "wait"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["nodeSelector"] == {"pool": "streaming", "disk": "ssd"}
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"dstream-job", "dstream-tmp", "logs"}
    assert pod["metadata"]["labels"]["sidecar"] == "yes"
    assert resources.template_overrides(spec_job, OWNER) == [
        "driver pod spec.nodeSelector.pool",
        "driver pod spec.restartPolicy",
        "driver pod spec.containers[driver].command",
    ]
    kubernetes_validate.validate(pod, "1.30", strict=True)


def test_executors_get_a_spark_pod_template_from_the_jobs_config_map():
    executor = {"instances": 2, "cores": 1, **PLACEMENT}
    executor["podTemplate"] = {"spec": {"containers": [SIDECAR]}}
    spec_job = job(executor=executor)
    data = resources.config_map(spec_job, OWNER)["data"]
    template = yaml.safe_load(data[resources.EXECUTOR_TEMPLATE_KEY])
    assert template == resources.executor_pod_template(spec_job)
    assert [c["name"] for c in template["spec"]["containers"]] == ["executor", "log-shipper"]
    spec = template["spec"]
    assert (spec["nodeSelector"], spec["tolerations"]) == (
        {"pool": "streaming"},
        PLACEMENT["tolerations"],
    )
    assert spec["serviceAccountName"] == "analytics"
    assert template["metadata"]["labels"]["team"] == "data"
    assert template["spec"]["containers"][0]["env"] == [{"name": "TZ", "value": "UTC"}]
    kubernetes_validate.validate(
        {**template, "metadata": {"name": "x", **template["metadata"]}}, "1.30", strict=False
    )
    conf = conf_of(resources.driver_pod(spec_job, OWNER))
    assert conf["spark.kubernetes.executor.podTemplateFile"] == (
        "/etc/dstream/executor-pod-template.yaml"
    )
    assert conf["spark.kubernetes.executor.podTemplateContainerName"] == "executor"
    assert conf["spark.kubernetes.executor.limit.cores"] == "1500m"


def test_a_cpu_request_below_cores_reserves_less_for_either_role():
    spec_job = job(
        driver={"cores": 1, "coresRequest": "250m", "standby": True},
        executor={"coresRequest": "100m"},
    )
    for attempt in (1, 2):
        pod = resources.driver_pod(spec_job, OWNER, pod=resources.driver_name("wc", attempt))
        assert containers(pod)["driver"]["resources"]["requests"]["cpu"] == "250m"
        conf = conf_of(pod)
        assert conf["spark.driver.cores"] == "1"  # what Spark plans with is unchanged
        assert conf["spark.kubernetes.executor.request.cores"] == "100m"
    assert resources.executor_pod_template(spec_job) is None  # Spark's conf carries it
    default = containers(resources.driver_pod(job(), OWNER))["driver"]
    assert default["resources"]["requests"]["cpu"] == "1"
    assert "spark.kubernetes.executor.request.cores" not in conf_of(
        resources.driver_pod(job(), OWNER)
    )


def test_executors_without_customisation_get_no_template():
    assert resources.executor_pod_template(job()) is None
    assert list(resources.config_map(job(), OWNER)["data"]) == ["job.yaml"]
    assert "spark.kubernetes.executor.podTemplateFile" not in conf_of(
        resources.driver_pod(job(), OWNER)
    )


@pytest.mark.parametrize(
    ("driver", "problem"),
    [
        ({"cores": 2, "coresLimit": "1500m"}, "coresLimit 1500m is below cores (2)"),
        ({"coresLimit": "lots"}, "driver.coresLimit"),
        ({"coresLimit": "1", "coresRequest": "1500m"}, "coresLimit 1 is below coresRequest 1500m"),
        ({"coresRequest": "0.25c"}, "driver.coresRequest"),
        ({"podTemplate": {"spec": {"nodeSelectr": {}}}}, "driver.podTemplate.spec.nodeSelectr"),
        ({"tolerations": [{"effect": "Sometimes"}]}, "driver.tolerations[0].effect"),
        ({"podTemplate": {"spec": {"containers": [{"image": "x"}]}}}, "containers[0].name"),
    ],
)
def test_bad_pod_customisation_is_rejected_naming_the_field(driver, problem):
    with pytest.raises(SpecError) as raised:
        job(driver=driver)
    assert problem in str(raised.value)


def test_the_crd_schema_checks_the_pod_templates_shape():
    spec = resources.job_manifest(job(driver={"podTemplate": TEMPLATE, **PLACEMENT}))["spec"]
    assert not list(validator("spec").iter_errors(spec))
    bad = copy.deepcopy(spec)
    bad["driver"]["podTemplate"]["spec"]["containers"][1]["tty"] = "yes"
    bad["executor"] = {"tolerations": [{"operator": "Maybe"}]}
    errors = {".".join(map(str, e.absolute_path)) for e in validator("spec").iter_errors(bad)}
    assert errors == {"driver.podTemplate.spec.containers.1.tty", "executor.tolerations.0.operator"}


def test_a_driver_created_over_a_template_warns_what_was_ignored():
    spec_job = job(driver={"podTemplate": TEMPLATE})
    seen = Observation(
        job=spec_job,
        job_uid="uid-1",
        problems=(),
        status=JobStatus(),
        driver=None,
        vanished=None,
        executors_ready=0,
        report=None,
        spec_hash=resources.spec_hash(spec_job),
        now=datetime(2026, 1, 1, tzinfo=UTC),
        template_overrides=tuple(resources.template_overrides(spec_job, OWNER)),
    )
    step = plan(seen)
    assert step.create_driver
    (warning,) = [e for e in step.events if e.reason == "PodTemplateOverridden"]
    assert warning.type == "Warning"
    assert "driver pod spec.containers[driver].command" in warning.message


def test_the_pod_templates_example_places_both_roles_and_adds_a_sidecar():
    from dstream.spec import load_job

    example = load_job(Path(__file__).resolve().parents[2] / "examples" / "pod-templates.yaml")
    owner = resources.Owner(example.metadata.name, "analytics", "uid-1")
    pod = resources.driver_pod(example, owner)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["driver", "log-shipper"]
    assert pod["spec"]["nodeSelector"] == {"pool": "streaming"}
    assert pod["spec"]["serviceAccountName"] == "wordcount-reader"
    kubernetes_validate.validate(pod, "1.30", strict=True)
    template = resources.executor_pod_template(example)
    assert "podAntiAffinity" in template["spec"]["affinity"]
    assert template["spec"]["priorityClassName"] == "streaming-high"
    assert resources.template_overrides(example, owner) == []


def test_spark_reads_the_executor_template_and_takes_the_executor_container(sc, tmp_path):
    """Spark's own loader (what the driver runs with spark.kubernetes.executor.podTemplateFile)
    parses the file the operator writes and picks the `executor` container, keeping the rest."""
    executor = {"instances": 1, **PLACEMENT, "podTemplate": {"spec": {"containers": [SIDECAR]}}}
    template = resources.executor_pod_template(job(executor=executor))
    path = tmp_path / resources.EXECUTOR_TEMPLATE_KEY
    path.write_text(yaml.safe_dump(template))
    jvm = sc._jvm
    kubernetes = jvm.io.fabric8.kubernetes.client.KubernetesClientBuilder().build()
    try:
        loaded = jvm.org.apache.spark.deploy.k8s.KubernetesUtils.loadPodFromTemplate(
            kubernetes, str(path), jvm.scala.Option.apply("executor"), sc._jsc.sc().conf()
        )
    finally:
        kubernetes.close()
    container, pod = loaded.container(), loaded.pod()
    assert container.getName() == "executor"
    assert [(e.getName(), e.getValue()) for e in container.getEnv()] == [("TZ", "UTC")]
    assert [c.getName() for c in pod.getSpec().getContainers()] == ["log-shipper"]
    assert dict(pod.getSpec().getNodeSelector()) == {"pool": "streaming"}
    assert pod.getSpec().getServiceAccountName() == "analytics"
    assert [t.getKey() for t in pod.getSpec().getTolerations()] == ["dedicated"]
