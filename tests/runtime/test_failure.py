"""The failure policy's settings: from a job spec through Spark's conf to the scheduler."""

from __future__ import annotations

import pytest
from dstream.runtime.control.failure import FailurePolicy
from dstream.service.job import spark_conf
from dstream.spec import parse_job
from pyspark import SparkConf

from tests.service.test_spec import WORDCOUNT, with_change


def test_the_spec_reaches_the_scheduler_through_spark_conf():
    job = parse_job(
        with_change(
            "spec.failurePolicy", {"retries": 2, "backoffSeconds": 0.5, "onExhausted": "skip"}
        )
    )
    policy = FailurePolicy.from_conf(spark_conf(job, "local[1]", {}))
    assert policy == FailurePolicy(retries=2, backoff_s=0.5, on_exhausted="skip")
    assert policy.skips


def test_a_program_without_settings_gets_the_spec_defaults():
    defaults = parse_job(WORDCOUNT).spec.failure_policy
    policy = FailurePolicy.from_conf(SparkConf(loadDefaults=False))
    assert (policy.retries, policy.backoff_s, policy.on_exhausted) == (
        defaults.retries,
        defaults.backoff_seconds,
        defaults.on_exhausted,
    )


def test_backoff_doubles_from_the_first_wait():
    policy = FailurePolicy(retries=4, backoff_s=1.5)
    assert [policy.backoff_before(retry) for retry in (1, 2, 3, 4)] == [1.5, 3.0, 6.0, 12.0]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("retries", "-1", "failurePolicy.retries must be >= 0"),
        ("backoffSeconds", "0", "failurePolicy.backoffSeconds must be > 0"),
        ("onExhausted", "ignore", "failurePolicy.onExhausted must be one of"),
    ],
)
def test_bad_conf_values_name_the_setting(key, value, message):
    conf = SparkConf(loadDefaults=False).set(f"spark.dstream.failurePolicy.{key}", value)
    with pytest.raises(ValueError, match=message):
        FailurePolicy.from_conf(conf)
