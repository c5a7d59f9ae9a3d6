"""The desired objects of a job, as pure functions of its spec."""

from __future__ import annotations

import argparse
import importlib.metadata
from datetime import UTC, datetime

import kubernetes_validate
import pytest
import yaml
from dstream.spec import parse_job
from dstream_operator import resources
from dstream_operator.main import parse_args, ui_ingress
from dstream_operator.resources import Owner, Platform

OWNER = Owner("wc", "jobs", "uid-1")


def job(**spec):
    base = {
        "batchInterval": "2s",
        "app": {"builtin": "wordcount"},
        "source": {"type": "rate", "rate": {"recordsPerSecond": 10}},
    }
    return parse_job(
        {
            "apiVersion": "dstream.dev/v1alpha1",
            "kind": "StreamingJob",
            "metadata": {"name": "wc", "namespace": "jobs"},
            "spec": base | spec,
        }
    )


def conf_of(pod) -> dict[str, str]:
    args = pod["spec"]["containers"][0]["args"]
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--conf"]
    return dict(p.split("=", 1) for p in pairs)


def test_children_are_owned_labelled_and_ordered():
    kinds = [c["kind"] for c in resources.children(job(), OWNER, Platform())]
    assert kinds == [
        "ConfigMap",
        "Service",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
    ]
    for child in resources.children(job(), OWNER, Platform()):
        meta = child["metadata"]
        assert meta["namespace"] == "jobs"
        assert meta["labels"]["dstream.dev/job"] == "wc"
        (ref,) = meta["ownerReferences"]
        assert ref == {
            "apiVersion": "dstream.dev/v1alpha1",
            "kind": "StreamingJob",
            "name": "wc",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_the_drivers_of_a_namespace_share_one_minimal_identity():
    account, role, binding = resources.driver_identity("jobs")
    assert [o["kind"] for o in (account, role, binding)] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
    ]
    assert {o["metadata"]["name"] for o in (account, role, binding)} == {"dstream-driver"}
    assert not [o for o in (account, role, binding) if "ownerReferences" in o["metadata"]]
    pods, leases = role["rules"]  # Spark's driver, and a standby job's Lease election
    assert pods["apiGroups"] == [""]
    assert pods["resources"] == ["pods", "services", "configmaps", "persistentvolumeclaims"]
    assert leases["resources"] == ["leases"] and "delete" not in leases["verbs"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dstream-driver", "namespace": "jobs"}
    ]
    kinds = {c["kind"] for c in resources.children(job(), OWNER, resources.Platform())}
    assert not kinds & {"ServiceAccount", "Role", "RoleBinding"}  # nothing per job


def test_service_is_headless_with_spark_api_and_ui_ports():
    spec = resources.service(OWNER)["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True
    assert {p["port"] for p in spec["ports"]} == {7078, 7079, 8000, 4040}
    ports = resources.driver_pod(job(), OWNER)["spec"]["containers"][0]["ports"]
    assert {"name": "http-spark-ui", "containerPort": 4040} in ports
    assert conf_of(resources.driver_pod(job(), OWNER))["spark.ui.port"] == "4040"
    assert spec["selector"] == {"dstream.dev/job": "wc", "dstream.dev/role": "driver"}


def test_config_map_holds_a_manifest_the_driver_can_load():
    text = resources.config_map(job(), OWNER)["data"]["job.yaml"]
    reloaded = parse_job(yaml.safe_load(text))
    assert reloaded.spec == job().spec


def test_driver_pod_runs_the_driver_cli_contract():
    pod = resources.driver_pod(job(), OWNER)
    container = pod["spec"]["containers"][0]
    assert pod["metadata"]["name"] == "wc-driver-1"  # the first attempt's
    assert container["command"] == ["python", "-m", "dstream.service.driver"]
    assert container["args"][:8] == [
        "/etc/dstream/job.yaml",
        "--port",
        "8000",
        "--master",
        "k8s://https://kubernetes.default.svc",
        "--host",
        "0.0.0.0",
        "--standby",  # waits for its checkpoint's lead: a lost driver may still be stopping
    ]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"].get("automountServiceAccountToken", True)  # the API's token
    assert pod["spec"]["serviceAccountName"] == "dstream-driver"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8000}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8000}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/etc/dstream"] == "dstream-job"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dstream-job"]["configMap"]["name"] == "wc-job"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30


def test_pods_name_their_non_root_user():
    """runAsNonRoot alone makes the kubelet check the image's USER, and a named or missing one
    fails with CreateContainerConfigError (seen on a real kubelet): the uid is explicit."""
    owner_job = job(volumes=[{"name": "ck", "mountPath": "/ck", "hostPath": {"path": "/srv"}}])
    pods = [
        resources.driver_pod(owner_job, OWNER),
        resources.cleanup_pod(owner_job, OWNER, "/ck/wc"),
    ]
    for pod in pods:
        assert pod["spec"]["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 185,
            "runAsGroup": 185,
            "fsGroup": 185,
        }


def test_the_driver_api_is_read_at_the_service_name_or_the_pod_ip():
    assert resources.driver_url(OWNER) == "http://wc-driver.jobs.svc:8000"
    assert resources.driver_url(OWNER, "10.244.0.7") == "http://10.244.0.7:8000"


def test_the_drivers_api_server_is_configurable():
    pod = resources.driver_pod(job(), OWNER, "https://10.244.0.1:6443")
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--master") + 1] == "k8s://https://10.244.0.1:6443"


def test_spark_is_configured_for_kubernetes_client_mode():
    conf = conf_of(resources.driver_pod(job(executor={"instances": 3}), OWNER))
    assert conf["spark.submit.deployMode"] == "client"
    assert conf["spark.driver.host"] == "$(POD_IP)"  # not the Service: see the next test
    assert conf["spark.driver.port"] == "7078"
    assert conf["spark.blockManager.port"] == "7079"
    assert conf["spark.kubernetes.namespace"] == "jobs"
    assert conf["spark.kubernetes.container.image"] == resources.OWN_IMAGE
    # The driver owns its executors through their template (executor_owner), not the name.
    assert "spark.kubernetes.driver.pod.name" not in conf
    assert conf["spark.kubernetes.executor.podNamePrefix"] == "wc-driver-1"
    assert conf["spark.kubernetes.executor.label.dstream.dev/job"] == "wc"
    assert conf["spark.executor.instances"] == "3"
    assert conf["spark.executor.memory"] == "1g"
    assert conf["spark.speculation"] == "true"
    assert conf["spark.speculation.multiplier"] == "1.4"


def test_executors_reach_their_own_driver_at_its_pod_ip():
    """The Service may hold two drivers at once (a lost one still stopping beside its
    replacement): each driver's executors are named after it and reach it at its pod IP."""
    pods = [resources.driver_pod(job(), OWNER, pod=f"wc-driver-{n}") for n in (1, 2)]
    assert [conf_of(p)["spark.driver.host"] for p in pods] == ["$(POD_IP)"] * 2
    prefixes = [conf_of(p)["spark.kubernetes.executor.podNamePrefix"] for p in pods]
    assert prefixes == ["wc-driver-1", "wc-driver-2"]
    env = {e["name"]: e for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_user_spark_conf_comes_last_and_wins():
    conf = resources.spark_conf(
        job(sparkConf={"spark.executor.memory": "3g", "spark.ui.enabled": "false"}),
        OWNER,
    )
    assert conf["spark.executor.memory"] == "3g"
    assert list(conf)[-1] == "spark.ui.enabled"


def test_executors_get_no_config_map_unless_the_job_asks():
    """Mounted, the ConfigMap's directory would head the executors' class path (SPARK_CONF_DIR
    comes first in the entrypoint's), and their JVMs would refuse the class archive."""
    key = "spark.kubernetes.executor.disableConfigMap"
    assert resources.spark_conf(job(), OWNER)[key] == "true"
    assert resources.spark_conf(job(sparkConf={key: "false"}), OWNER)[key] == "false"


def test_volumes_reach_driver_and_executors():
    spec_job = job(
        volumes=[
            {"name": "ckpt", "mountPath": "/ckpt", "persistentVolumeClaim": {"claimName": "c"}},
            {"name": "in", "mountPath": "/in", "hostPath": {"path": "/srv/in"}},
        ]
    )
    pod = resources.driver_pod(spec_job, OWNER)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["ckpt"]["persistentVolumeClaim"]["claimName"] == "c"
    assert volumes["in"]["hostPath"]["path"] == "/srv/in"
    conf = conf_of(pod)
    pvc = "spark.kubernetes.executor.volumes.persistentVolumeClaim.ckpt"
    assert conf[f"{pvc}.mount.path"] == "/ckpt"
    assert conf[f"{pvc}.options.claimName"] == "c"
    assert conf["spark.kubernetes.executor.volumes.hostPath.in.options.path"] == "/srv/in"


@pytest.mark.parametrize(
    ("memory", "pod_mib"), [("1g", 1024 + 410), ("512m", 512 + 384), ("4g", 4096 + 1639)]
)
def test_pod_memory_includes_overhead(memory, pod_mib):
    assert resources.pod_memory_mib(memory) == pod_mib


def test_names_are_valid_dns_labels():
    assert resources.service_name("7up") == "sj-7up-driver"
    long = "a" * 63
    assert len(resources.service_name(long)) == 63
    assert len(resources.executor_pod_prefix(long)) <= 47
    assert resources.service_name(long) != resources.service_name("a" * 62)


def test_only_driver_fields_need_a_restart():
    old = job().model_dump(mode="json", by_alias=True)["spec"]
    assert resources.restart_fields(old, old | {"suspend": True}) == []
    assert resources.restart_fields(old, old | {"restartPolicy": {"type": "Never"}}) == []
    changed = old | {"executor": {"instances": 5}, "sparkConf": {"a": "b"}}
    assert resources.restart_fields(old, changed) == ["executor", "sparkConf"]


def test_spec_hash_ignores_operator_only_fields():
    assert resources.spec_hash(job()) == resources.spec_hash(job(suspend=True))
    no_budget = {"disruptionBudget": {"enabled": False}}
    assert resources.spec_hash(job()) == resources.spec_hash(job(executor=no_budget))
    assert resources.spec_hash(job()) != resources.spec_hash(job(batchInterval="1s"))


def test_checkpoint_cleanup_only_inside_a_volume():
    volumes = [{"name": "d", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "d"}}]
    on_volume = job(checkpoint={"path": "/data/ckpt"}, volumes=volumes)
    assert resources.shared_checkpoint(on_volume) == "/data/ckpt"
    assert resources.shared_checkpoint(job(checkpoint={"path": "/tmp/ckpt"})) is None
    assert resources.shared_checkpoint(job(checkpoint={"path": "/data"}, volumes=volumes)) is None
    escape = job(checkpoint={"path": "/data/../etc"}, volumes=volumes)
    assert resources.shared_checkpoint(escape) is None
    pod = resources.cleanup_pod(on_volume, OWNER, "/data/ckpt")
    assert pod["spec"]["containers"][0]["command"] == ["rm", "-rf", "--", "/data/ckpt"]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "d"


def test_a_job_without_an_image_runs_the_operators():
    """The operator's `--image` (the chart passes the operator's own) reaches every pod of a
    job that names none: the driver, its executors (Spark's image setting), the cleanup pod."""
    volumes = [{"name": "d", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "d"}}]
    unnamed = job(checkpoint={"path": "/data/ckpt"}, volumes=volumes)
    named = job(checkpoint={"path": "/data/ckpt"}, volumes=volumes, image="registry/mine:7")
    for spec_job, image in ((unnamed, "registry/dstream:0.1.0"), (named, "registry/mine:7")):
        driver = resources.driver_pod(
            spec_job, OWNER, pod="wc-driver-1", image="registry/dstream:0.1.0"
        )
        assert driver["spec"]["containers"][0]["image"] == image
        assert conf_of(driver)["spark.kubernetes.container.image"] == image
        cleanup = resources.cleanup_pod(spec_job, OWNER, "/data/ckpt", "registry/dstream:0.1.0")
        assert cleanup["spec"]["containers"][0]["image"] == image
    assert resources.OWN_IMAGE == f"dstream:{importlib.metadata.version('dstream')}"
    assert parse_args(["-A"]).image == resources.OWN_IMAGE
    assert parse_args(["-A", "--image", "registry/dstream:0.1.0"]).image == "registry/dstream:0.1.0"


def test_event_names_the_job():
    event = resources.event(
        OWNER, "Warning", "DriverLost", "gone", datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert event["involvedObject"]["uid"] == "uid-1"
    assert event["lastTimestamp"] == "2026-01-01T00:00:00Z"


def test_every_object_is_valid_kubernetes():
    volumes = [{"name": "d", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "d"}}]
    full = job(checkpoint={"path": "/data/ckpt"}, volumes=volumes, sparkConf={"a": "b"})
    objects = [
        *resources.children(full, OWNER, Platform()),
        resources.driver_pod(full, OWNER),
        resources.cleanup_pod(full, OWNER, "/data/ckpt"),
        resources.event(OWNER, "Normal", "DriverCreated", "ok", datetime(2026, 1, 1, tzinfo=UTC)),
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.30", strict=True)


def test_driver_command_passes_the_drivers_own_checks(tmp_path, monkeypatch):
    """The driver parses the pod's arguments, and its API may listen on every interface
    because the pod's environment names a token file (the ServiceAccount token, here a stand-in
    file)."""
    from dstream.service.cli import add_run_arguments
    from dstream_api.auth import refuse_open_to_network

    container = resources.driver_pod(job(), OWNER)["spec"]["containers"][0]
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, default_master=None)
    args = parser.parse_args(container["args"])
    assert (args.host, args.port) == ("0.0.0.0", resources.API_PORT)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DSTREAM_API_TOKEN_FILE"] == resources.API_TOKEN_FILE
    token = tmp_path / "token"
    token.write_text("a-service-account-token\n")
    monkeypatch.setenv("DSTREAM_API_TOKEN_FILE", str(token))
    monkeypatch.delenv("DSTREAM_API_TOKEN", raising=False)
    refuse_open_to_network(args.host)


def postgres_job():
    sink = {
        "type": "postgres",
        "postgres": {
            "dsn": "postgresql://app@db.jobs.svc:5432/analytics",
            "table": "counts",
            "passwordSecret": {"name": "pg-credentials", "key": "password"},
        },
    }
    return job(sink=sink)


def test_a_connector_password_reaches_driver_and_executors_from_the_secret():
    pod = resources.driver_pod(postgres_job(), OWNER)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["DSTREAM_POSTGRES_PASSWORD"] == {
        "name": "DSTREAM_POSTGRES_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "pg-credentials", "key": "password"}},
    }
    conf = conf_of(pod)
    executor_secret = "spark.kubernetes.executor.secretKeyRef.DSTREAM_POSTGRES_PASSWORD"
    assert conf[executor_secret] == "pg-credentials:password"
    stored = resources.job_manifest(postgres_job())["spec"]["sink"]["postgres"]
    assert set(stored) == {"dsn", "table", "passwordSecret"}
    kubernetes_validate.validate(pod, "1.30", strict=True)


def test_a_job_without_secrets_gets_no_secret_env():
    pod = resources.driver_pod(job(), OWNER)
    env = pod["spec"]["containers"][0]["env"]
    assert not [e for e in env if "secretKeyRef" in e.get("valueFrom", {})]
    assert not [k for k in conf_of(pod) if "secretKeyRef" in k]


def test_the_driver_role_reads_no_secrets():
    assert not [r for r in resources.driver_rules() if "secrets" in r["resources"]]


@pytest.mark.parametrize("policy_version", resources.POLICY_VERSIONS)
def test_disruption_budgets_let_one_driver_and_one_executor_go_at_a_time(policy_version):
    """minAvailable, not maxUnavailable: the disruption controller cannot count pods whose
    controller (the StreamingJob) has no scale subresource, and would refuse every eviction."""
    spec_job = job(executor={"instances": 3})
    driver, executor = (
        resources.disruption_budget(spec_job, OWNER, role, policy_version)
        for role in ("driver", "executor")
    )
    assert driver["apiVersion"] == policy_version
    assert driver["metadata"]["name"] == "wc-driver"
    assert driver["spec"] == {
        "minAvailable": 0,  # one driver, and it may go
        "selector": {"matchLabels": {"dstream.dev/job": "wc", "dstream.dev/role": "driver"}},
    }
    assert executor["spec"]["minAvailable"] == 2
    assert executor["spec"]["selector"]["matchLabels"]["dstream.dev/role"] == "executor"
    if policy_version == "policy/v1":  # the schemas start at 1.25, which dropped v1beta1
        kubernetes_validate.validate(driver, "1.30", strict=True)
    held = job(driver={"disruptionBudget": {"maxUnavailable": 0}})
    assert (
        resources.disruption_budget(held, OWNER, "driver", policy_version)["spec"]["minAvailable"]
        == 1
    )
    off = job(driver={"disruptionBudget": {"enabled": False}})
    assert resources.disruption_budget(off, OWNER, "driver", policy_version) is None


def test_the_spark_ui_gets_an_ingress_only_when_the_operator_is_told_a_host():
    assert "Ingress" not in [c["kind"] for c in resources.children(job(), OWNER, Platform())]
    settings = resources.UiIngress("{job}.{namespace}.ui.example.com", "nginx", (("a", "b"),))
    (ingress,) = [
        c
        for c in resources.children(job(), OWNER, Platform(ui_ingress=settings))
        if c["kind"] == "Ingress"
    ]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "wc.jobs.ui.example.com"
    (route,) = rule["http"]["paths"]
    assert route["backend"]["service"] == {"name": "wc-driver", "port": {"number": 4040}}
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["metadata"]["annotations"] == {"a": "b"}
    kubernetes_validate.validate(ingress, "1.30", strict=True)


def test_ui_ingress_options():
    args = parse_args(["-A", "--ui-ingress-host", "{job}.x", "--ui-ingress-annotation", "k=v=w"])
    assert ui_ingress(args) == resources.UiIngress("{job}.x", None, (("k", "v=w"),))
    assert ui_ingress(parse_args(["-A"])) is None
    with pytest.raises(SystemExit):
        parse_args(["-A", "--ui-ingress-annotation", "novalue"])
