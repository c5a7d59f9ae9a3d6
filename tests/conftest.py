"""Shared fixtures: one local SparkContext for the whole session keeps the suite fast."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Spark's Python workers must import the test modules whose functions they run (and the
# benchmark harness's programs, from the repository's root).
_TESTS = os.path.dirname(os.path.abspath(__file__))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_TESTS, os.path.dirname(_TESTS), os.environ.get("PYTHONPATH", "")) if p
)


@pytest.fixture(scope="session")
def sc():
    from dstream.worker.pydaemon import SPARK_CONF
    from pyspark import SparkConf, SparkContext
    from running_driver import SPARK_TEST_CONF

    conf = (
        SparkConf()
        .setAll(list(SPARK_CONF.items()))
        .setAll(list(SPARK_TEST_CONF.items()))
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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, group in SHARED_RESOURCES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
