"""Kill -9 an executor JVM in the middle of a batch of a windowed, stateful job.

`local-cluster[2,1,1024]` runs two real executor JVMs beside the driver (pip's pyspark carries
everything this needs: its jars, and the launcher finds them through SPARK_HOME = the package
directory). Every input task sleeps first, so the kill lands while the batch's tasks run; the lost
tasks, shuffle outputs and cached state blocks are recomputed from lineage (back to the last
state checkpoint) on the surviving executor and on the one the standalone worker starts in its
place. The output must equal the reference exactly. The window's reductions of the batches it
subtracts after the kill are read from their durable parts, not recomputed from the source: no
input older than a state checkpoint interval before the kill is read again (faultapp's
`readsLog`). The kill comes once the window is full, so that every batch after it subtracts
one. The report gives how long the affected batch took and how long after the kill the job was
back on schedule (a batch started within its own interval), when it was on schedule before.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import time
from pathlib import Path

import pytest
from fault.harness import RateJob, batch_dirs, executor_pids, fault_seed, verify
from running_driver import Driver, Line

BATCH_TIMEOUT_S = 240
MOST_BATCHES_BEFORE_KILL = 8  # to get on schedule after the executors' cold start
MOST_BATCHES_AFTER_KILL = 4  # to get back on schedule
PROGRESS = re.compile(r"processing\s+([\d.]+) s \| scheduling delay\s+([\d.]+) s")


def is_batch(text: str) -> bool:
    return text.startswith("batch ")


def delays(line: Line) -> tuple[float, float]:
    """(processing, scheduling delay) in seconds from a progress line."""
    match = PROGRESS.search(line.text)
    assert match, line.text
    return float(match.group(1)), float(match.group(2))


def next_batches(driver: Driver, most: int, until, least: int = 2) -> list[Line]:
    """Progress lines of the next batches: at least `least`, at most `most`, until one
    satisfies `until`."""
    seen: list[Line] = []
    while len(seen) < most and (len(seen) < least or not until(seen[-1])):
        seen.append(driver.wait_for_line(is_batch, BATCH_TIMEOUT_S, after=len(driver.lines)))
    return seen


def reread_batches(reads_log: Path) -> list[tuple[int, int]]:
    """(batch time, time of the later batch whose job read it again) for every input partition
    that a later batch's job computed again, from faultapp's reads log."""
    first_read: dict[str, int] = {}
    again: list[tuple[int, int]] = []
    notes = (json.loads(n) for f in reads_log.iterdir() for n in f.read_text().splitlines())
    for group, record in sorted(notes, key=lambda note: note[0]):
        read_ms = int(group.removeprefix("dstream-batch-"))
        own_ms = first_read.setdefault(record, read_ms)
        if read_ms > own_ms:
            again.append((own_ms, read_ms))
    return again


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_executor_killed_mid_batch_output_unchanged(tmp_path):
    seed = fault_seed()
    rng = random.Random(seed)
    job = RateJob(
        tmp_path,
        batch_s=6,
        window_s=30,
        checkpoint_interval_s=12,
        parallelism=2,
        task_sleep_s=1.5,
        seed=seed % 1000,
        reads_log=tmp_path / "reads",
    )
    job.reads_log.mkdir()
    job.write()

    def on_schedule(line: Line) -> bool:
        return delays(line)[1] < job.batch_s

    driver = Driver(
        job.manifest,
        "--master",
        "local-cluster[2,1,1024]",
        env={"SPARK_LOCAL_IP": "127.0.0.1"},
        log=tmp_path / "driver.log",
    ).start()
    try:
        before = next_batches(
            driver, MOST_BATCHES_BEFORE_KILL, on_schedule, least=job.window_batches + 1
        )
        executors = executor_pids(driver.pid)
        assert len(executors) == 2, executors
        victim = rng.choice(sorted(executors))
        affected_ms = max(batch_dirs(job.out)) + job.batch_s * 1000
        starts_at = max(time.time(), affected_ms / 1000)
        time.sleep(starts_at - time.time() + job.task_sleep_s / 2)  # inside the sleeping tasks
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        after = next_batches(driver, MOST_BATCHES_AFTER_KILL, on_schedule)
        replacement = set(executor_pids(driver.pid)) - set(executors)
    finally:  # no graceful stop (test_fault_cli has one): only committed batches are compared
        driver.kill()

    lost = [line.text for line in driver.lines if "Lost executor" in line.text]
    normal = statistics.median(delays(line)[0] for line in before[1:] + after[1:])
    back = next((line for line in after if on_schedule(line)), None)
    verdict = verify(job)
    checkpointed_ms = affected_ms - job.checkpoint_interval_s * 1000
    recomputed = [(own, at) for own, at in reread_batches(job.reads_log) if at >= affected_ms]
    print(
        f"executor {victim} killed {killed_at - driver.started_at:.1f} s after start, during "
        f"batch {affected_ms}; replaced by {sorted(replacement)}; {lost[:1]}\n"
        f"  before the kill: processing {[delays(line)[0] for line in before]} s, scheduling "
        f"delay {[delays(line)[1] for line in before]} s\n"
        f"  after the kill:  processing {[delays(line)[0] for line in after]} s, scheduling "
        f"delay {[delays(line)[1] for line in after]} s\n"
        f"  affected batch {delays(after[0])[0]:.2f} s against {normal:.2f} s median; committed "
        f"{after[0].at - killed_at:.1f} s after the kill; back on schedule "
        + (f"{back.at - killed_at:.1f} s after the kill" if back else "not within the run")
        + (" (it was on schedule before)" if on_schedule(before[-1]) else " (it was behind)")
        + f"\n  committed batches {verdict.batches}, records {verdict.records}: lost="
        f"{verdict.lost} duplicated={verdict.duplicated}, batches differing "
        f"{len(verdict.mismatched_batches)}\n  input read again after the kill (batch, by "
        f"batch): {recomputed}"
    )
    assert lost, "Spark never noticed the executor's loss"
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert verdict.lost == 0 and verdict.duplicated == 0
    assert not [(own, at) for own, at in recomputed if own < checkpointed_ms], recomputed
