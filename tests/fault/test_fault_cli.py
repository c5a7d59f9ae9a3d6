"""`dstream run` facing a checkpoint of another program, starting fresh, and stopping gracefully.

The checkpoint of program A (a 10 s window) is written in this process; `dstream run` of program
B (a 20 s window) on it must exit 3 naming the difference, and `--fresh` must move it aside and
start over. That fresh run's whole process group (Python, the Spark JVM, the Python workers) is
then sent SIGTERM, as Kubernetes does, while a batch is running (every input task sleeps longer
than the batch interval, so one always is): the batch completes and commits, and the process
exits 0. A restart then runs the batch times the stopped run left, and the output is exact.
"""

from __future__ import annotations

import shutil

import pytest
from conditions import eventually
from fault.harness import InProcessJob, RateJob, verify, zero_ms
from running_driver import Driver

TIMEOUT_S = 240


def logged(job: RateJob, kind: str) -> set[int]:
    """Times of the batch log's `batch` or `commit` files, read by name only: a live driver's log
    must not be loaded (loading removes temporary files, which a running writer still owns)."""
    return {int(p.stem.split("-")[1]) for p in (job.checkpoint / "log").glob(f"{kind}-*.json")}


def newest_commit(job: RateJob) -> int | None:
    return max(logged(job, "commit"), default=None)


def running_batch(job: RateJob) -> int | None:
    """The batch whose record is written and whose commit is not: the one running."""
    return min(logged(job, "batch") - logged(job, "commit"), default=None)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mismatched_checkpoint_exit_3_then_fresh_run_stops_gracefully(sc, tmp_path):
    program_a = InProcessJob(sc, RateJob(tmp_path, batch_s=2, window_s=10, task_sleep_s=3))
    ssc = program_a.start()
    program_a.run(ssc, 1)
    ssc.stop(stopSparkContext=False)
    zero_a = zero_ms(program_a.job.checkpoint)
    shutil.rmtree(program_a.job.out)  # its checkpoint stays: that is what B must refuse

    program_b = RateJob(tmp_path, batch_s=2, window_s=20, task_sleep_s=3)
    program_b.write()
    refused = Driver(program_b.manifest, log=tmp_path / "mismatch.log").start()
    assert refused.wait(TIMEOUT_S) == 3
    message = "\n".join(line.text for line in refused.lines)
    assert "was written by a different streaming graph" in message
    assert "(ReducedWindowedDStream): windowMs was 10000, now 20000" in message
    assert "--fresh" in message

    fresh = Driver(program_b.manifest, "--fresh", log=tmp_path / "fresh.log").start()
    try:
        fresh.wait_for_line(lambda text: text.startswith("batch "), TIMEOUT_S)
        eventually(lambda: running_batch(program_b), TIMEOUT_S)
        running_ms = running_batch(program_b)
        code = fresh.terminate(timeout_s=120, whole_group=True)
    finally:
        fresh.kill()

    output = "\n".join(line.text for line in fresh.lines)
    assert code == 0, output
    assert "SIGTERM received, finishing the current batch" in output
    assert "cancelled" not in output, output
    assert newest_commit(program_b) >= running_ms
    assert running_batch(program_b) is None, "the stop left a batch uncommitted"

    stopped_at = newest_commit(program_b)
    again = Driver(program_b.manifest, log=tmp_path / "again.log").start()
    try:
        eventually(lambda: newest_commit(program_b) > stopped_at + 2000, TIMEOUT_S)
        assert again.terminate(timeout_s=120, whole_group=True) == 0
    finally:
        again.kill()
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("checkpoint.old-")]
    assert len(moved) == 1 and zero_ms(moved[0]) == zero_a
    assert zero_ms(program_b.checkpoint) != zero_a
    verdict = verify(program_b)
    assert not verdict.mismatched_batches and verdict.lost == verdict.duplicated == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_batch_failing_for_good_exits_5_uncommitted_and_runs_again_after_a_restart(tmp_path):
    """The files sink cannot write (a regular file stands where its directory goes): the first
    batch fails, is retried once, and `dstream run` exits 5 without committing it. With the
    sink writable again, a restart runs that batch from its record, and the output is exact."""
    policy = {"retries": 1, "backoffSeconds": 0.5}
    job = RateJob(tmp_path, batch_s=2, extra_spec={"failurePolicy": policy})
    job.write()
    job.out.write_text("not a directory")
    failing = Driver(job.manifest, log=tmp_path / "failing.log").start()
    assert failing.wait(TIMEOUT_S) == 5
    output = "\n".join(line.text for line in failing.lines)
    assert "retry 1 of 1 in 0.5 s" in output, output
    assert "failed after 1 retries and was not committed" in output, output
    (failed_ms,) = logged(job, "batch") - logged(job, "commit")
    assert logged(job, "commit") == set()

    job.out.unlink()
    again = Driver(job.manifest, log=tmp_path / "again.log").start()
    try:
        eventually(lambda: (newest_commit(job) or 0) >= failed_ms + 4000, TIMEOUT_S)
        assert again.terminate(timeout_s=120, whole_group=True) == 0
    finally:
        again.kill()
    replayed = [line.text for line in again.batch_lines() if "replayed" in line.text]
    assert len(replayed) == 1, replayed
    verdict = verify(job)
    assert verdict.batches >= 3 and not verdict.mismatched_batches
    assert verdict.lost == verdict.duplicated == 0
