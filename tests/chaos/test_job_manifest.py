"""The chaos suite's job: a valid StreamingJob with the restart policy asked for, and how its
restart count is checked."""

from pathlib import Path

import pytest
from dstream.spec import RestartPolicy, StreamingJob

from e2e.chaos.__main__ import job_manifest, parse_args, restarts_counted
from e2e.chaos.storage import HostPathStorage

REQUIRED = ["--kubeconfig", "k", "--image", "dstream:e2e", "--host-path", "/node/run"]


def manifest_of(*flags: str) -> StreamingJob:
    args = parse_args([*REQUIRED, *flags])
    return StreamingJob.model_validate(
        job_manifest(args, HostPathStorage("/node/run", Path("/node/run")))
    )


def test_each_replacement_starts_at_once_when_asked():
    """--restart-reset-seconds sets how long a driver must have been ready for its loss to count
    as a first one (restarted at once); without it the spec's default holds."""
    asked = manifest_of("--restart-reset-seconds", "10", "--no-standby").spec.restart_policy
    assert asked.reset_after_seconds == 10
    assert asked.backoff_seconds == 1
    default = manifest_of().spec.restart_policy
    assert default.reset_after_seconds == RestartPolicy().reset_after_seconds


def test_status_restarts_must_count_every_loss_unless_the_count_may_reset():
    assert restarts_counted(5, 5, may_reset=False)
    assert not restarts_counted(0, 5, may_reset=False)
    assert restarts_counted(0, 5, may_reset=True)
    assert not restarts_counted(6, 5, may_reset=True)
    assert not restarts_counted(None, 5, may_reset=True)


def test_a_driver_loss_keeps_the_pods_grace_period_unless_one_is_given():
    """--driver-kill-grace 0 shows a crash's restart apart from the old driver's graceful stop."""
    assert parse_args(REQUIRED).driver_kill_grace is None
    assert (
        parse_args([*REQUIRED, "--no-standby", "--driver-kill-grace", "0"]).driver_kill_grace == 0
    )


def test_a_grace_period_for_a_driver_loss_with_a_standby_is_refused(capsys):
    """With a standby the leader is always deleted with no grace period: the option would do
    nothing, so it is an error rather than silently ignored."""
    with pytest.raises(SystemExit):
        parse_args([*REQUIRED, "--driver-kill-grace", "0"])
    assert "--driver-kill-grace needs --no-standby" in capsys.readouterr().err


def test_spark_conf_entries_reach_the_job_and_a_malformed_one_is_refused(capsys):
    """--spark-conf adds to the job's sparkConf (e.g. an event log of each restart) without
    dropping the suite's own entries; an entry without '=' names itself in the error."""
    conf = manifest_of(
        "--spark-conf", "spark.eventLog.enabled=true", "--spark-conf", "spark.x=a=b"
    ).spec.spark_conf
    assert conf["spark.eventLog.enabled"] == "true"
    assert conf["spark.x"] == "a=b"
    assert conf["spark.default.parallelism"] == "2"
    with pytest.raises(SystemExit):
        manifest_of("--spark-conf", "spark.eventLog.enabled")
    assert "not 'spark.eventLog.enabled'" in capsys.readouterr().err
