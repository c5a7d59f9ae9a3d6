"""What the restart path without a standby changes in a driver's Spark settings
(docs/fault-tolerance.md, "The restart path without a standby"): the JVMs' class archive
(dstream.service.jvm_archive) and no wait for executors before the SparkContext is up; and
that the JVMs of a driver and of its executors really take Spark's classes from the archive
`make setup` made for this installation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from dstream.service import jvm_archive
from dstream.service.job import spark_conf
from dstream.spec import parse_job
from running_driver import manifest

ARCHIVED = "source: shared objects file (top)"  # -Xlog:class+load's word for the archive's


RATE_WORDCOUNT = {
    "batchInterval": "1s",
    "app": {"builtin": "wordcount"},
    "source": {"type": "rate", "rate": {"recordsPerSecond": 10}},
}


def job(**spec_extra):
    return parse_job(manifest("restart", {**RATE_WORDCOUNT, **spec_extra}))


def test_the_archive_goes_to_the_driver_and_executor_jvms_after_the_jobs_options(
    tmp_path, monkeypatch
):
    archive = tmp_path / "classes.jsa"
    archive.write_bytes(b"an archive")
    monkeypatch.setenv(jvm_archive.ENV, str(archive))
    conf = spark_conf(job(sparkConf={"spark.executor.extraJavaOptions": "-Dmine=1"}), None, {})
    # a SparkConf starts from a running JVM's settings (the test session's, its JIT option)
    assert conf.get("spark.driver.extraJavaOptions").endswith(f"-XX:SharedArchiveFile={archive}")
    assert conf.get("spark.executor.extraJavaOptions") == (
        f"-XX:TieredStopAtLevel=1 -Dmine=1 -XX:SharedArchiveFile={archive}"
    )


def test_the_archives_class_path_heads_the_driver_and_executor_class_paths(tmp_path, monkeypatch):
    """A JVM maps the archive only if its class path begins with the dump's: Spark's jars one
    by one in a fixed order, before the job's own class path."""
    archive = tmp_path / "classes.jsa"
    archive.write_bytes(b"an archive")
    monkeypatch.setenv(jvm_archive.ENV, str(archive))
    head = jvm_archive.class_path()
    jars = head.split(os.pathsep)
    assert len(jars) > 100 and jars == sorted(jars)
    assert all(jar.endswith(".jar") and os.path.isfile(jar) for jar in jars)
    assert any(os.path.basename(jar).startswith("spark-core_") for jar in jars)
    conf = spark_conf(job(sparkConf={"spark.executor.extraClassPath": "/opt/mine.jar"}), None, {})
    assert conf.get("spark.driver.extraClassPath") == head
    assert conf.get("spark.executor.extraClassPath") == f"{head}{os.pathsep}/opt/mine.jar"


def test_no_archive_file_or_an_empty_setting_adds_no_option(tmp_path, monkeypatch):
    for setting in (str(tmp_path / "missing.jsa"), ""):
        monkeypatch.setenv(jvm_archive.ENV, setting)
        conf = spark_conf(job(), None, {"spark.driver.extraJavaOptions": "-Dmine=1"})
        assert conf.get("spark.driver.extraJavaOptions") == "-Dmine=1"
        assert "SharedArchiveFile" not in (conf.get("spark.executor.extraJavaOptions") or "")
        assert jvm_archive.with_archive({"spark.master": "local"}) == {"spark.master": "local"}


def test_the_spark_context_does_not_wait_for_executors_unless_the_spec_says_so():
    key = "spark.scheduler.minRegisteredResourcesRatio"
    assert spark_conf(job(), None, {}).get(key) == "0"
    assert spark_conf(job(sparkConf={key: "0.8"}), None, {}).get(key) == "0.8"


# A driver as `dstream run` configures it, on local-cluster with one executor, each JVM logging
# where its classes came from.
DRIVER = textwrap.dedent(
    """
    import sys
    from pyspark import SparkContext
    from dstream.service.job import spark_conf
    from dstream.spec import load_job

    driver_log, executor_log, manifest = sys.argv[1:]
    conf = spark_conf(load_job(manifest), "local-cluster[1,1,1024]", {
        "spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={driver_log}",
        "spark.executor.extraJavaOptions": f"-Xlog:class+load=info:file={executor_log}",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
    })
    sc = SparkContext(conf=conf)
    assert sc.parallelize(range(100), 2).map(lambda n: (n % 3, n)).reduceByKey(max).count() == 3
    sc.stop()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_driver_and_executor_jvms_load_spark_from_the_installations_archive(tmp_path):
    assert jvm_archive.archive_path() is not None, "no archive: `make setup` makes it"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest("restart", RATE_WORDCOUNT)))
    driver_log, executor_log = tmp_path / "driver.log", tmp_path / "executor.log"
    subprocess.run(
        [sys.executable, "-c", DRIVER, str(driver_log), str(executor_log), str(path)],
        check=True,
        timeout=180,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert f"org.apache.spark.SparkContext {ARCHIVED}" in driver_log.read_text()
    executor = executor_log.read_text()
    assert f"org.apache.spark.executor.Executor {ARCHIVED}" in executor
    assert f"org.apache.spark.shuffle.sort.SortShuffleManager {ARCHIVED}" in executor


# A driver with a Kubernetes master and an executor pod template, as the operator's, against the
# archive's own stand-in API server, logging where its classes came from, until Spark has made
# an executor pod.
KUBERNETES_DRIVER = textwrap.dedent(
    """
    import sys
    from pyspark import SparkConf, SparkContext
    from dstream.service import jvm_archive

    class_log, template = sys.argv[1:]
    with jvm_archive.api_server_stand_in() as (url, pod_made):
        settings = jvm_archive.with_archive({
            **jvm_archive.KUBERNETES_DUMP_SETTINGS,
            "spark.kubernetes.executor.podTemplateFile": template,
            "spark.driver.extraJavaOptions": (
                f"-Xlog:class+load=info:file={class_log} {jvm_archive.NO_PROXY_OPTION}"
            ),
        })
        sc = SparkContext(conf=SparkConf().setAll(list(settings.items())).setMaster(f"k8s://{url}"))
        assert pod_made.wait(jvm_archive.POD_TIMEOUT_S)
        sc.stop()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_driver_on_kubernetes_loads_sparks_kubernetes_backend_from_the_archive(tmp_path):
    """A driver in a pod loads about two thousand classes a local one does not: the archive's
    run loads them too (jvm_archive.load_kubernetes_backend)."""
    class_log, template = tmp_path / "classes.log", tmp_path / "executor-pod-template.yaml"
    template.write_text(yaml.safe_dump(jvm_archive.EXECUTOR_POD_TEMPLATE))
    subprocess.run(
        [sys.executable, "-c", KUBERNETES_DRIVER, str(class_log), str(template)],
        check=True,
        timeout=180,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    loaded = class_log.read_text()
    for name in (
        "org.apache.spark.scheduler.cluster.k8s.KubernetesClusterSchedulerBackend",
        "org.apache.spark.scheduler.cluster.k8s.ExecutorPodsAllocator",
        "io.fabric8.kubernetes.client.impl.KubernetesClientImpl",
        "io.fabric8.kubernetes.api.model.Pod",
        "io.vertx.core.impl.VertxImpl",
        "org.snakeyaml.engine.v2.api.Load",  # the template's parser
    ):
        assert f"{name} {ARCHIVED}" in loaded, name
