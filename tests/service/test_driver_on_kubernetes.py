"""What a driver adds to its Spark settings on Kubernetes: its pod as the owner of its executors
through their pod template, not Spark's driver pod name (which costs every start a second's
wait for the pod's readiness; Spark's own use of the template against a real API server is
tests/k8s/test_executor_owner.py), and its JVM without C2, as its executors' (on every master)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml
from dstream.service import executor_owner
from dstream.service.job import spark_conf
from dstream.spec import StreamingJob

K8S = "k8s://https://10.0.0.1:443"
WORDCOUNT = Path(__file__).resolve().parents[2] / "examples" / "wordcount.yaml"
OPERATOR_TEMPLATE = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"labels": {"team": "a"}},
    "spec": {"containers": [{"name": "executor"}], "priorityClassName": "stream"},
}


@pytest.fixture
def in_a_pod(monkeypatch, tmp_path):
    monkeypatch.setenv("POD_NAME", "wc-driver-3")
    monkeypatch.setenv("POD_UID", "uid-3")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the driver writes its copy


def written(settings: dict[str, str]) -> dict:
    return yaml.safe_load(Path(settings[executor_owner.TEMPLATE_KEY]).read_text())


def test_the_operators_template_gains_the_driver_pod_as_owner(in_a_pod, tmp_path):
    path = tmp_path / "executor-pod-template.yaml"
    path.write_text(yaml.safe_dump(OPERATOR_TEMPLATE))
    added = executor_owner.owner_settings(
        [("spark.master", K8S), (executor_owner.TEMPLATE_KEY, str(path))]
    )
    assert set(added) == {executor_owner.TEMPLATE_KEY}  # no driver pod name: no wait
    template = written(added)
    assert template["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "wc-driver-3",
            "uid": "uid-3",
            "controller": True,
        }
    ]
    assert template["metadata"]["labels"] == {"team": "a"}
    assert template["spec"] == OPERATOR_TEMPLATE["spec"]
    assert yaml.safe_load(path.read_text()) == OPERATOR_TEMPLATE  # the mounted one is left alone


def test_without_a_template_the_driver_writes_one_holding_only_the_owner(in_a_pod):
    template = written(executor_owner.owner_settings([("spark.master", K8S)]))
    assert [o["name"] for o in template["metadata"]["ownerReferences"]] == ["wc-driver-3"]
    assert template["spec"] == {}  # Spark builds the executor container itself


@pytest.mark.parametrize(
    "conf",
    [
        [("spark.master", "local[2]")],  # not on Kubernetes
        [("spark.master", K8S), ("spark.kubernetes.driver.pod.name", "mine")],  # Spark's way
    ],
)
def test_nothing_is_added_off_kubernetes_or_when_the_job_names_its_pod(in_a_pod, conf):
    assert executor_owner.owner_settings(conf) == {}


def test_nothing_is_added_outside_a_pod(monkeypatch):
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("POD_UID", raising=False)
    assert executor_owner.owner_settings([("spark.master", K8S)]) == {}


def test_claims_made_per_executor_keep_spark_s_own_ownership(in_a_pod):
    claim = "spark.kubernetes.executor.volumes.persistentVolumeClaim.data.options.claimName"
    conf = [("spark.master", K8S), (claim, "OnDemand")]
    assert executor_owner.owner_settings(conf) == {
        "spark.kubernetes.driver.pod.name": "wc-driver-3"
    }


def test_a_template_that_is_not_a_pod_is_refused_naming_the_setting(in_a_pod, tmp_path):
    path = tmp_path / "template.yaml"
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="podTemplateFile.*does not hold a pod"):
        executor_owner.owner_settings(
            [("spark.master", K8S), (executor_owner.TEMPLATE_KEY, str(path))]
        )


def test_the_drivers_spark_settings_carry_the_owned_template(in_a_pod):
    job = StreamingJob.model_validate(yaml.safe_load(WORDCOUNT.read_text()))
    conf = spark_conf(job, K8S, {})
    assert conf.get("spark.kubernetes.driver.pod.name") is None
    template = yaml.safe_load(Path(conf.get(executor_owner.TEMPLATE_KEY)).read_text())
    assert template["metadata"]["ownerReferences"][0]["uid"] == "uid-3"


def test_executors_and_on_kubernetes_the_driver_compile_with_c1_only_unless_the_job_says_otherwise():
    job = StreamingJob.model_validate(yaml.safe_load(WORDCOUNT.read_text()))
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        job.spec.spark_conf[key] = "-XX:TieredStopAtLevel=4"
        options = spark_conf(job, K8S, {}).get(key).split()
        assert options[0] == "-XX:TieredStopAtLevel=1"
        assert options.index("-XX:TieredStopAtLevel=4") > 0  # the job's, later: the JVM takes it
    cluster = spark_conf(job, "local-cluster[2,1,1024]", {})
    assert cluster.get("spark.executor.extraJavaOptions").split()[0] == "-XX:TieredStopAtLevel=1"
    local = spark_conf(job, "local[2]", {}).get("spark.driver.extraJavaOptions").split()
    assert "-XX:TieredStopAtLevel=1" not in local  # the driver's JVM runs the tasks
