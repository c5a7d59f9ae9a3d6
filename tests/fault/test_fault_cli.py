"""`dstream run` facing a checkpoint of another program, starting fresh, and stopping gracefully.

The checkpoint of program A (a 10 s window) is written in this process; `dstream run` of program
B (a 20 s window) on it must exit 3 naming the difference, and `--fresh` must move it aside and
start over. That fresh run is then stopped with SIGTERM while a batch is running (every input
task sleeps longer than the batch interval, so one always is): the batch completes and commits,
and the process exits 0.
"""

from __future__ import annotations

import shutil
import time

import pytest
from dstream.checkpoint import CheckpointDir
from harness import Driver, InProcessJob, RateJob, verify, zero_ms

TIMEOUT_S = 240


def newest_commit(job: RateJob) -> int | None:
    commits = CheckpointDir(job.checkpoint).load_log().commits
    return max(commits) if commits else None


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
        running_ms = newest_commit(program_b) + program_b.batch_s * 1000
        time.sleep(1)  # the next batch is queued behind the slow one, or already running
        code = fresh.terminate(timeout_s=120)
    finally:
        fresh.kill()

    assert code == 0
    assert any("SIGTERM received, finishing the current batch" in line.text for line in fresh.lines)
    assert newest_commit(program_b) >= running_ms
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("checkpoint.old-")]
    assert len(moved) == 1 and zero_ms(moved[0]) == zero_a
    assert zero_ms(program_b.checkpoint) != zero_a
    verdict = verify(program_b)
    assert not verdict.mismatched_batches and verdict.lost == verdict.duplicated == 0
