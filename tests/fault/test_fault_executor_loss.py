"""Kill -9 an executor JVM in the middle of a batch of a windowed, stateful job.

`local-cluster[2,1,1024]` runs two real executor JVMs beside the driver (pip's pyspark carries
everything this needs: its jars, and the launcher finds them through SPARK_HOME = the package
directory). Every input task sleeps first, so the kill lands while the batch's tasks run; the lost
tasks, shuffle outputs and cached state blocks are recomputed from lineage (back to the last
state checkpoint) on the surviving executor and the one the standalone worker starts in its place.
The output must equal the reference exactly; the report gives how long the affected batches took.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import statistics
import time
from pathlib import Path

import pyspark
import pytest
from harness import Driver, Line, RateJob, batch_dirs, executor_pids, verify

START_TIMEOUT_S = 240
BATCHES_AFTER_KILL = 4
PROGRESS = re.compile(r"processing\s+([\d.]+) s \| scheduling delay\s+([\d.]+) s")


def is_batch(text: str) -> bool:
    return text.startswith("batch ")


def delays(line: Line) -> tuple[float, float]:
    """(processing, scheduling delay) in seconds from a progress line."""
    match = PROGRESS.search(line.text)
    assert match, line.text
    return float(match.group(1)), float(match.group(2))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_executor_killed_mid_batch_output_unchanged(tmp_path):
    seed = int(os.environ.get("DSTREAM_FAULT_SEED", random.randrange(2**31)))
    print(f"\nDSTREAM_FAULT_SEED={seed}")
    rng = random.Random(seed)
    job = RateJob(
        tmp_path,
        batch_s=4,
        window_s=20,
        checkpoint_interval_s=8,
        parallelism=2,
        task_sleep_s=1.5,
        seed=seed % 1000,
    )
    job.write()
    driver = Driver(
        job.manifest,
        "--master",
        "local-cluster[2,1,1024]",
        env={"SPARK_LOCAL_IP": "127.0.0.1"},
        log=tmp_path / "driver.log",
    ).start()
    app_ids: set[str] = set()
    try:
        for _ in range(2):  # executors up and warm
            driver.wait_for_line(is_batch, START_TIMEOUT_S, after=len(driver.lines))
        executors = executor_pids(driver.pid)
        app_ids.update(executors.values())
        assert len(executors) == 2, executors
        victim = rng.choice(sorted(executors))
        affected_ms = max(batch_dirs(job.out)) + job.batch_s * 1000
        starts_at = max(time.time(), affected_ms / 1000)
        time.sleep(starts_at - time.time() + job.task_sleep_s / 2)  # inside the sleeping tasks
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        lines_at_kill = len(driver.lines)
        for _ in range(BATCHES_AFTER_KILL):
            driver.wait_for_line(is_batch, START_TIMEOUT_S, after=len(driver.lines))
        replacement = set(executor_pids(driver.pid)) - set(executors)
        app_ids.update(executor_pids(driver.pid).values())
        code = driver.terminate(timeout_s=90)
    finally:
        driver.kill()
        for app_id in app_ids:  # the standalone workers' directories under SPARK_HOME/work
            shutil.rmtree(Path(pyspark.__file__).parent / "work" / app_id, ignore_errors=True)

    before = [line for line in driver.lines[:lines_at_kill] if is_batch(line.text)]
    after = [line for line in driver.lines[lines_at_kill:] if is_batch(line.text)]
    lost = [line.text for line in driver.lines if "Lost executor" in line.text]
    normal = statistics.median(delays(line)[0] for line in before[1:] + after[2:])
    affected = delays(after[0])[0]
    back_to_normal = next(line for line in after[1:] if delays(line)[0] <= 1.2 * normal)
    verdict = verify(job)
    print(
        f"executor {victim} killed {killed_at - driver.started_at:.1f} s after start, during "
        f"batch {affected_ms}; replaced by {sorted(replacement)}\n"
        f"  batch processing: {normal:.2f} s median before the kill, {affected:.2f} s for the "
        f"affected batch, then {[delays(line)[0] for line in after[1:]]}\n"
        f"  kill to the affected batch's commit {after[0].at - killed_at:.1f} s, to the first "
        f"batch processed in normal time {back_to_normal.at - killed_at:.1f} s; scheduling "
        f"delay {delays(before[-1])[1]:.1f} s before the kill, "
        f"{[delays(line)[1] for line in after]} after\n"
        f"  Spark: {lost[:1]}\n"
        f"  committed batches {verdict.batches}, records {verdict.records}: lost={verdict.lost} "
        f"duplicated={verdict.duplicated}, batches differing {len(verdict.mismatched_batches)}"
    )
    assert code == 0
    assert lost, "Spark never noticed the executor's loss"
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert verdict.lost == 0 and verdict.duplicated == 0
