"""Storage faults under a running job: its checkpoint directory turning read-only, its checkpoint
or its files sink's volume running full.

Each volume is a small tmpfs of the test's own (it needs root, and fails saying so without),
made read-only by a remount or filled up by a file that takes every free byte. A batch whose
record cannot be written must not run its outputs, and one whose commit marker cannot be
written must not count as committed; the failure policy retries either, so storage that comes
back within the retries only delays the job. Storage that does not come back stops the driver
with the batch uncommitted and an error naming the file and the OS's reason, and a restart on
working storage runs the batch again: the output is exact either way.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conditions import eventually
from fault.harness import (
    InProcessJob,
    RateJob,
    fill_up,
    remount,
    tmpfs,
    verify,
)
from running_driver import Driver
from streams import final_failure

RIDE_OUT = {"retries": 4, "backoffSeconds": 0.2}
GIVE_UP = {"retries": 1, "backoffSeconds": 0.2}


def in_process(sc, root: Path, policy: dict[str, float], **settings: float) -> InProcessJob:
    """1 s batches on one input partition, state checkpoints every 2 s (at batch 2, the one
    each test breaks, unless `settings` say otherwise), a 4 s window."""
    shape = {"batch_s": 1, "partitions": 1, "window_s": 4, "checkpoint_interval_s": 2}
    return InProcessJob(
        sc, RateJob(root, extra_spec={"failurePolicy": policy}, **{**shape, **settings})
    )


def log_entries(job: InProcessJob, time_ms: int) -> list[str]:
    """The batch's files in the log: its record, its commit marker, their temporary files."""
    return sorted(
        p.name for p in (job.job.checkpoint / "log").iterdir() if f"-{time_ms}." in p.name
    )


def sink_entries(job: InProcessJob, time_ms: int) -> list[str]:
    """The batch's directories in the sink."""
    return sorted(p.name for p in job.job.out.iterdir() if f"batch-{time_ms}" in p.name)


def durable_parts(job: InProcessJob) -> set[Path]:
    """The part files of the durable batches the window subtracts (dstream/runtime/checkpoint/durable.py)."""
    return set((job.job.checkpoint / "state").glob("*/rdd-*/part-*"))


def assert_exact(job: InProcessJob, batches: int) -> None:
    verdict = verify(job.job)
    assert verdict.batches == batches and not verdict.mismatched_batches, verdict
    assert verdict.lost == verdict.duplicated == 0


def test_a_checkpoint_read_only_for_a_while_holds_the_batch_back_then_it_runs_exactly(sc, tmp_path):
    """Batch 2 cannot write its record: none of its outputs runs while the retries wait; once
    the directory is writable again it runs and commits, the job goes on, the output is exact."""
    job = in_process(sc, tmp_path, RIDE_OUT)
    with tmpfs(job.job.checkpoint):
        ssc = job.start()
        job.run(ssc, 1)
        remount(job.job.checkpoint, "ro")
        time_ms = job.advance(ssc)
        job.wait_for_retry(ssc)
        assert log_entries(job, time_ms) == [] and sink_entries(job, time_ms) == []
        remount(job.job.checkpoint, "rw")
        held_back = ssc._scheduler.wait_for_batch(time_ms, 60)
        job.run(ssc, 1)
        ssc.stop(stopSparkContext=False)
        assert held_back.retries >= 1 and held_back.error is None
        assert_exact(job, 3)


def test_a_checkpoint_read_only_past_the_retries_leaves_the_batch_uncommitted_for_a_restart(
    sc, tmp_path
):
    """The directory turns read-only once batch 2's outputs have written its durable window
    batch (its output tasks then take a second more, and no state checkpoint is due): its
    commit marker cannot be written, the retries run out, and the run stops with the batch's
    output written but not committed. The restart on the writable directory replays it from
    its record and replaces that output with the same one."""
    job = in_process(sc, tmp_path, GIVE_UP, output_sleep_s=1, checkpoint_interval_s=3)
    with tmpfs(job.job.checkpoint):
        ssc = job.start()
        job.run(ssc, 1)
        written = durable_parts(job)
        per_batch = len(written) // len({part.parent for part in written})
        time_ms = job.advance(ssc)
        eventually(lambda: len(durable_parts(job) - written) == per_batch, 60)
        remount(job.job.checkpoint, "ro")
        failed = final_failure(ssc)
        ssc.stop(stopSparkContext=False)
        commit = job.job.checkpoint / "log" / f"commit-{time_ms}.json"
        assert f"cannot write checkpoint file {commit}: Read-only file system" in str(failed)
        assert log_entries(job, time_ms) == [f"batch-{time_ms}.json"]
        assert f"batch-{time_ms}" in sink_entries(job, time_ms)

        remount(job.job.checkpoint, "rw")
        ssc = job.start()
        assert ssc._scheduler.recovery.replayed == [time_ms]
        ssc._scheduler.wait_for_batch(time_ms, 60)
        ssc.stop(stopSparkContext=False)
        assert_exact(job, 2)


def test_a_full_checkpoint_volume_is_reported_leaves_no_part_and_is_ridden_out(
    sc, tmp_path, caplog
):
    """With the checkpoint's volume full, batch 2's record fails with ENOSPC, named with its
    file; no temporary or partial record stays, no output runs, and once space is freed the
    batch runs and the output is exact."""
    job = in_process(sc, tmp_path, RIDE_OUT)
    with tmpfs(job.job.checkpoint):
        ssc = job.start()
        job.run(ssc, 1)
        filler = fill_up(job.job.checkpoint)
        time_ms = job.advance(ssc)
        job.wait_for_retry(ssc)
        record = job.job.checkpoint / "log" / f"batch-{time_ms}.json"
        assert f"cannot write checkpoint file {record}: No space left on device" in caplog.text
        assert log_entries(job, time_ms) == [] and sink_entries(job, time_ms) == []
        filler.unlink()
        ssc._scheduler.wait_for_batch(time_ms, 60)
        ssc.stop(stopSparkContext=False)
        assert_exact(job, 2)


def test_a_full_sink_volume_fails_the_batch_uncommitted_and_a_restart_writes_it_whole(sc, tmp_path):
    """The files sink's volume is full: batch 2's output fails with ENOSPC, named with its
    directory, and after the retries the run stops with the batch recorded, uncommitted and
    nothing of it visible in the sink. With space freed, the restart writes it whole."""
    job = in_process(sc, tmp_path, GIVE_UP)
    with tmpfs(job.job.out, size_kb=1024):
        ssc = job.start()
        job.run(ssc, 1)
        filler = fill_up(job.job.out)
        time_ms = job.advance(ssc)
        failed = final_failure(ssc)
        ssc.stop(stopSparkContext=False)
        assert f"writing {job.job.out}/batch-{time_ms} failed: " in str(failed)
        assert "No space left on device" in str(failed)
        assert log_entries(job, time_ms) == [f"batch-{time_ms}.json"]
        assert sink_entries(job, time_ms) == []  # a task still running may leave a part staged

        filler.unlink()
        ssc = job.start()
        assert ssc._scheduler.recovery.replayed == [time_ms]
        ssc._scheduler.wait_for_batch(time_ms, 60)
        ssc.stop(stopSparkContext=False)
        assert_exact(job, 2)


@pytest.mark.slow
def test_dstream_run_exits_5_naming_the_read_only_checkpoint_file(tmp_path):
    """A real `dstream run` whose checkpoint turns read-only: once the retries are spent it
    exits 5, its error names the checkpoint file (the batch record, the commit marker, or a
    part of the durable batch its output tasks write) and the OS's reason, and that batch has
    no commit marker."""
    job = RateJob(
        tmp_path, batch_s=1, partitions=1, window_s=2, extra_spec={"failurePolicy": GIVE_UP}
    )
    job.write()
    with tmpfs(job.checkpoint):
        driver = Driver(job.manifest, log=tmp_path / "driver.log").start()
        try:
            driver.wait_for_line(lambda text: text.startswith("batch "), 120)
            remount(job.checkpoint, "ro")
            assert driver.wait(120) == 5
        finally:
            driver.kill()
        output = "\n".join(line.text for line in driver.lines)
        failed = re.search(
            r"\((\d+)\) failed after 1 retries and was not committed: CheckpointWriteError: "
            rf"cannot write checkpoint file {re.escape(str(job.checkpoint))}/"
            r"(?:log/(?:batch|commit)-\1\.json|state/[^/]+/rdd-\d+/part-\d+): "
            r"Read-only file system",
            output,
        )
        assert failed, output
        assert not (job.checkpoint / "log" / f"commit-{failed.group(1)}.json").exists()
