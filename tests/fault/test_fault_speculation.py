"""Stragglers: spec-driven runs turn Spark speculation on by default with the D-Stream paper's
rule (a task 1.4x slower than its stage's median is re-launched), and the spec or --conf can
change it."""

from __future__ import annotations

from dstream.service.job import spark_conf
from dstream.spec import parse_job
from running_driver import manifest


def job(**spec_extra):
    return parse_job(
        manifest(
            "stragglers",
            {
                "batchInterval": "1s",
                "app": {"builtin": "wordcount"},
                "source": {"type": "rate", "rate": {"recordsPerSecond": 10}},
                **spec_extra,
            },
        )
    )


def speculation(conf) -> dict[str, str | None]:
    keys = ("spark.speculation", "spark.speculation.multiplier", "spark.speculation.quantile")
    return {key: conf.get(key) for key in keys}


def test_speculation_is_on_by_default_with_the_papers_multiplier():
    assert speculation(spark_conf(job(), None, {})) == {
        "spark.speculation": "true",
        "spark.speculation.multiplier": "1.4",
        "spark.speculation.quantile": "0.75",
    }


def test_the_spec_configures_speculation():
    conf = spark_conf(job(speculation={"multiplier": 2.0, "quantile": 0.5}), None, {})
    assert speculation(conf) == {
        "spark.speculation": "true",
        "spark.speculation.multiplier": "2.0",
        "spark.speculation.quantile": "0.5",
    }
    assert spark_conf(job(speculation={"enabled": False}), None, {}).get("spark.speculation") == (
        "false"
    )


def test_spark_conf_and_command_line_override_the_spec_in_that_order():
    spec_conf = job(sparkConf={"spark.speculation.multiplier": "3"})
    assert spark_conf(spec_conf, None, {}).get("spark.speculation.multiplier") == "3"
    overridden = spark_conf(spec_conf, None, {"spark.speculation": "false"})
    assert overridden.get("spark.speculation") == "false"
