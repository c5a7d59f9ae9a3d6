"""The project's image, built offline from the repository's Dockerfile (e2e/image/build.sh), works
without Kubernetes: its docker-archive names dstream:<the project's version>, and unpacked and
started the way a container runtime starts it (entrypoint, env, workdir, non-root user) it
imports the project, validates the example job, runs it on local Spark, and starts Spark's
Kubernetes executor backend for the `executor` argument, whose JVM maps the class archive made
at the build as a driver in the image gives it. The archive also loads into containerd
(e2e/image/load.sh, the same script a real kubelet node uses)."""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import subprocess
import tarfile

import pytest
from debian_packages import require_binary

pytestmark = [pytest.mark.slow, pytest.mark.image]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
LOAD_SH = REPO_ROOT / "e2e" / "image" / "load.sh"
SPARK_USER = "185"
# dstream:<version> as containerd names it (e2e/image/tag.sh)
IMAGE_NAME = "docker.io/library/dstream:" + importlib.metadata.version("dstream")


def test_archive_is_a_docker_archive_tagged_with_the_version(image_tarball):
    with tarfile.open(image_tarball) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))
        config = json.load(archive.extractfile(manifest[0]["Config"]))
    assert IMAGE_NAME in manifest[0]["RepoTags"]
    assert len(config["rootfs"]["diff_ids"]) == len(manifest[0]["Layers"])
    assert config["config"]["User"] == SPARK_USER
    assert config["config"]["Entrypoint"] == [
        "/usr/bin/tini",
        "--",
        "/usr/local/bin/dstream-entrypoint",
    ]


def test_project_imports_as_the_non_root_user(image):
    result = image.run(
        "python",
        "-c",
        "import os, pyspark, dstream, dstream_api, dstream_operator;"
        "print(os.getuid(), os.getgid(), pyspark.__version__)",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [SPARK_USER, SPARK_USER, "4.0.1"]


def test_validates_the_example_job(image):
    result = image.run("dstream", "validate", "examples/wordcount.yaml")
    assert result.returncode == 0, result.stderr
    assert "valid StreamingJob 'wordcount'" in result.stdout


def test_java_is_debians_openjdk_17(image):
    result = image.run("java", "-version")
    assert result.returncode == 0, result.stderr
    assert 'version "17.' in result.stderr


# An executor as Spark on Kubernetes describes it to the entrypoint, of a driver that is not
# there: its JVM starts, then exits once it fails to connect. SPARK_CONF_DIR is set for every
# executor, and names a directory only where the executors' ConfigMap is mounted (the operator
# turns it off).
EXECUTOR_ENV = {
    "SPARK_EXECUTOR_MEMORY": "512m",
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.0.0.1:9",
    "SPARK_EXECUTOR_ID": "1",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_APPLICATION_ID": "spark-image-test",
    "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_EXECUTOR_POD_NAME": "image-test-exec-1",
    "SPARK_CONF_DIR": "/opt/spark/conf",
}
# What a driver in the image gives its executors for the class archive (spark_conf).
EXECUTOR_ARCHIVE_SETTINGS = (
    "import json; from dstream.service.jvm_archive import with_archive;"
    "from dstream.service.job import jit_settings;"
    "print(json.dumps(with_archive(jit_settings([]))))"
)


def test_executor_argument_starts_the_kubernetes_executor_backend(image):
    """No driver listens at the URL, so the JVM exits once it fails to connect: far enough to
    show that the entrypoint found Java and Spark's jars and started the right class as spark."""
    result = image.run("executor", env=EXECUTOR_ENV, timeout=240)
    assert "KubernetesExecutorBackend: Started daemon" in result.stderr, result.stderr
    assert "Changing view acls to: spark" in result.stderr
    assert "Failed to connect to /127.0.0.1:9" in result.stderr
    assert result.returncode != 0


def test_java_home_is_set_so_the_entrypoint_starts_no_jvm_to_find_it(image):
    result = image.run("sh", "-c", 'test -x "$JAVA_HOME/bin/java" && echo "$JAVA_HOME"')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "/opt/java"


def test_an_executor_jvm_takes_sparks_classes_from_the_images_archive(image):
    """The archive made at the image's build, given to an executor the way a driver in the
    image gives it (its options, C1 only among them, as SPARK_JAVA_OPT_n, its class path as
    SPARK_CLASSPATH, which Spark sets from spark.executor.extraClassPath): the executor JVM the
    entrypoint starts maps it, so the class path the archive was made with heads the one the
    entrypoint builds, and the JIT option does not keep the JVM from mapping it."""
    found = image.run("python", "-c", EXECUTOR_ARCHIVE_SETTINGS)
    assert found.returncode == 0, found.stderr
    settings = json.loads(found.stdout)
    options = settings["spark.executor.extraJavaOptions"].split()
    assert options == [
        "-XX:TieredStopAtLevel=1",
        "-XX:SharedArchiveFile=/opt/venv/share/dstream/spark-classes.jsa",
    ]
    env = {
        **EXECUTOR_ENV,
        "SPARK_CLASSPATH": settings["spark.executor.extraClassPath"],
        **{f"SPARK_JAVA_OPT_{n}": option for n, option in enumerate(options)},
        f"SPARK_JAVA_OPT_{len(options)}": "-Xlog:class+load=info",
    }
    result = image.run("executor", env=env, timeout=240)
    archived = "source: shared objects file (top)"
    assert f"org.apache.spark.SparkConf {archived}" in result.stdout, result.stdout[-3000:]
    assert f"org.apache.spark.rpc.netty.NettyRpcEnv {archived}" in result.stdout


@pytest.mark.timeout(900, func_only=True)
def test_runs_the_example_job_on_local_spark(image):
    result = image.run(
        "dstream", "run", "examples/wordcount.yaml",
        "--duration", "10", "--port", "0", "--checkpoint", "/tmp/checkpoint",
        env={"SPARK_LOCAL_IP": "127.0.0.1"},
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    batches = [line for line in result.stdout.splitlines() if line.startswith("batch ")]
    assert batches and "records" in batches[0], result.stdout
    assert "dstream: job wordcount stopped" in result.stdout
    # the driver's JVM maps the image's class archive (the JVM warns when it cannot)
    assert "Unable to use shared archive" not in result.stdout + result.stderr


@pytest.mark.timeout(1200, func_only=True)
def test_archive_loads_into_containerd(image_tarball, tmp_path):
    require_binary("containerd", "containerd")
    result = subprocess.run(
        ["bash", str(LOAD_SH), "--standalone", str(image_tarball)],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert IMAGE_NAME in result.stdout.split()
