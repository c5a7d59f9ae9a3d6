"""The e2e's reading of restarted drivers' first batches from Spark event logs: which batch is a
driver's first, when its executors registered, each executor's first task."""

import json
from pathlib import Path

import pytest

from e2e.chaos.first_batch import drivers_in, main, report


def write_log(run: Path, name: str, start: int, executors: list[int], batches: list[dict]) -> None:
    """A rolled event log (`eventlog_v2_<name>/events_1_<name>`) of a driver that started at
    `start` ms, whose executors registered at `executors`, and that ran `batches`: each
    {time, submitted, ended, tasks: [(executor, launch, finish, deserialize, run)]}, one job
    and one stage per batch."""
    events = [{"Event": "SparkListenerApplicationStart", "Timestamp": start}]
    events += [
        {"Event": "SparkListenerExecutorAdded", "Timestamp": t, "Executor ID": str(n)}
        for n, t in enumerate(executors, 1)
    ]
    for job, batch in enumerate(batches):
        group = {"spark.jobGroup.id": f"dstream-batch-{batch['time']}"}
        events.append(
            {
                "Event": "SparkListenerJobStart",
                "Job ID": job,
                "Submission Time": batch["submitted"],
                "Stage Infos": [{"Stage ID": job}],
                "Properties": group,
            }
        )
        for executor, launch, finish, deserialize, run_ms in batch["tasks"]:
            events.append(
                {
                    "Event": "SparkListenerTaskEnd",
                    "Stage ID": job,
                    "Task Info": {
                        "Executor ID": executor,
                        "Launch Time": launch,
                        "Finish Time": finish,
                    },
                    "Task Metrics": {
                        "Executor Deserialize Time": deserialize,
                        "Executor Run Time": run_ms,
                    },
                }
            )
        events.append(
            {
                "Event": "SparkListenerStageCompleted",
                "Stage Info": {"Stage ID": job, "Submission Time": batch["submitted"]},
            }
        )
        events.append(
            {"Event": "SparkListenerJobEnd", "Job ID": job, "Completion Time": batch["ended"]}
        )
    directory = run / f"eventlog_v2_{name}"
    directory.mkdir()
    (directory / f"events_1_{name}").write_text("\n".join(json.dumps(e) for e in events) + "\n")


def batch(time: int, submitted: int, ended: int, tasks: list[tuple]) -> dict:
    return {"time": time, "submitted": submitted, "ended": ended, "tasks": tasks}


def test_a_restarted_drivers_first_batch_is_read_against_its_executors_registration(tmp_path):
    write_log(
        tmp_path,
        "first",
        1_000,
        [2_000],
        [batch(6_000, 6_000, 7_000, [("1", 6_000, 6_500, 5, 400)])],
    )
    restarted = [
        # the first batch, submitted before the executors registered (at 12 and 12.5 s)
        batch(
            9_000,
            11_000,
            16_000,
            [
                ("1", 12_100, 14_000, 400, 1_400),
                ("2", 12_600, 14_200, 500, 1_000),
                ("1", 14_000, 14_100, 10, 80),
            ],
        ),
        batch(12_000, 16_100, 17_000, [("1", 16_200, 16_300, 20, 70)]),
        batch(18_000, 18_000, 19_200, [("2", 18_100, 18_300, 20, 150)]),
        batch(24_000, 24_000, 25_000, [("1", 24_100, 24_200, 20, 60)]),
    ]
    write_log(tmp_path, "second", 10_000, [12_000, 12_500], restarted)

    drivers = drivers_in(tmp_path)
    assert [d.name for d in drivers] == ["eventlog_v2_first", "eventlog_v2_second"]
    lines = report(drivers)
    assert lines[0].startswith("eventlog_v2_second: executors registered at 2.00, 2.50 s")
    assert "first batch 1 stages, ended 3.50 s after the last registration" in lines[0]
    assert "first tasks 1.90 s (400 + 1400 ms), 1.60 s (500 + 1000 ms)" in lines[0]
    assert "first_batch_after_registration_p50=3.50s" in lines[1]
    assert lines[2] == "first_task_p50=1.75s deserialize_p50=450ms run_p50=1200ms (n=2)"
    assert (
        lines[3] == "warm_batch_jobs_p50=1.10s stages_p50=1 (n=2)"
    )  # the third and fourth batches


def test_a_run_without_a_restart_is_refused(tmp_path, capsys):
    write_log(tmp_path, "only", 1_000, [2_000], [batch(6_000, 6_000, 7_000, [])])
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "1 driver event log(s): no restart to read" in capsys.readouterr().err


def test_a_killed_drivers_cut_last_line_is_left_out(tmp_path):
    write_log(tmp_path, "first", 1_000, [2_000], [batch(6_000, 6_000, 7_000, [])])
    write_log(tmp_path, "second", 10_000, [12_000], [batch(9_000, 11_000, 13_000, [])])
    log = tmp_path / "eventlog_v2_second" / "events_1_second"
    log.write_text(log.read_text() + '{"Event": "SparkListenerTaskEnd", "Stage')
    assert "ended 1.00 s after the last registration" in report(drivers_in(tmp_path))[0]
