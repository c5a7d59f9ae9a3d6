"""The soak: a stateful job on `local-cluster[2,1,1024]` under a seeded schedule of driver kills,
executor JVM kills and a sink outage, its whole output checked exactly at the end.

Each driver run is `dstream run` on the same checkpoint. A run dies by SIGKILL of its process
group at a random moment (as a lost pod), or at an exact spot through DSTREAM_FAULT_INJECT:
between a batch's outputs and its commit, while a commit or a batch record is being written.
Runs that die at a random moment also see executor JVMs killed mid-batch (Spark recomputes the
lost tasks from lineage on the worker's replacement executor). One run sees the files sink
unwritable for SOAK_OUTAGE_S seconds (a regular file where its directory goes): the failure
policy retries the batch until the sink is back. The next run starts right after each kill, as
the operator would restart the pod; the last one is stopped gracefully. Then every committed
batch is compared with the reference computed from the input offsets (harness.verify: the
batch's word counts, running totals and window), and one line is printed:

    soak: driver_kills=N executor_kills=M batches=B lost=L duplicated=D recovery_p50=Xs ...

`make test` runs 5 + 5 kills; `make soak` runs 20 + 20 (SOAK_DRIVER_KILLS, SOAK_EXECUTOR_KILLS,
SOAK_OUTAGE_S; DSTREAM_FAULT_SEED replays a schedule). Recovery is the time from a driver kill to
the first batch the next run commits: it includes starting the JVM and both executors.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
import pytest
from harness import Driver, RateJob, executor_pids, verify, wait_until

DRIVER_KILLS = int(os.environ.get("SOAK_DRIVER_KILLS", "5"))
EXECUTOR_KILLS = int(os.environ.get("SOAK_EXECUTOR_KILLS", "5"))
OUTAGE_S = float(os.environ.get("SOAK_OUTAGE_S", "5"))
DEATHS = ("random", "random", "before-commit", "commit-write", "batch-record-write")
STEP_TIMEOUT_S = 300


def is_batch(text: str) -> bool:
    return text.startswith("batch ") and "FAILED" not in text


@dataclass
class Run:
    """One driver run of the schedule: how it dies, and what happens while it lives."""

    death: str  # "random", or a fault point the driver is killed at (its `arrival`-th time)
    arrival: int = 0
    executor_kills: int = 0
    outage: bool = False


@dataclass
class Tally:
    driver_kills: int = 0
    executor_kills: int = 0
    killed_at: float | None = None  # the last driver kill not yet followed by a new commit
    driver_recoveries: list[float] = field(default_factory=list)
    executor_recoveries: list[float] = field(default_factory=list)

    def committed(self, at: float) -> None:
        """A driver run committed a batch at `at`: the last kill, if any, is recovered from."""
        if self.killed_at is not None:
            self.driver_recoveries.append(at - self.killed_at)
            self.killed_at = None


def schedule(rng: random.Random) -> list[Run]:
    """DRIVER_KILLS runs, each dying as DEATHS draws (at least one at a random moment); the
    executor kills spread over the runs that die at a random moment (a run killed at a fault
    point may die before it gets to them); the outage in one of those runs."""
    runs = [Run(rng.choice(DEATHS)) for _ in range(DRIVER_KILLS)]
    if not any(r.death == "random" for r in runs):
        runs[0].death = "random"
    for run in runs:
        if run.death != "random":
            run.arrival = rng.randint(1, 3) if run.death != "batch-record-write" else 2
    randoms = [r for r in runs if r.death == "random"]
    for _ in range(EXECUTOR_KILLS):
        rng.choice(randoms).executor_kills += 1
    rng.choice(randoms).outage = True
    return runs


def start_driver(job: RateJob, log: Path, fault: str | None = None) -> Driver:
    env = {"SPARK_LOCAL_IP": "127.0.0.1"}
    if fault:
        env["DSTREAM_FAULT_INJECT"] = fault
    master = ("--master", "local-cluster[2,1,1024]")
    return Driver(job.manifest, *master, env=env, log=log).start()


def next_batch(driver: Driver) -> float:
    """When the driver's next batch after now committed (monotonic seconds)."""
    return driver.wait_for_line(is_batch, STEP_TIMEOUT_S, after=len(driver.lines)).at


def kill_executors(driver: Driver, job: RateJob, run: Run, rng: random.Random, tally: Tally):
    for _ in range(run.executor_kills):
        executors = wait_until(lambda: executor_pids(driver.pid), STEP_TIMEOUT_S)
        time.sleep(rng.uniform(0, job.batch_s))  # somewhere inside a batch
        os.kill(rng.choice(sorted(executors)), signal.SIGKILL)
        killed_at = time.monotonic()
        tally.executor_kills += 1
        tally.executor_recoveries.append(next_batch(driver) - killed_at)


def sink_outage(driver: Driver, job: RateJob) -> None:
    """The files sink unwritable for OUTAGE_S: the running batches fail and are retried."""
    aside = job.root / "out-during-outage"
    job.out.rename(aside)
    job.out.write_text("the sink's volume is gone")
    try:
        time.sleep(OUTAGE_S)  # the outage itself, not a wait for a condition
    finally:
        job.out.unlink()
        aside.rename(job.out)
    next_batch(driver)


def live_through(run: Run, job: RateJob, log: Path, rng: random.Random, tally: Tally) -> None:
    """Start a driver, put it through the run's faults, and kill it."""
    fault = None if run.death == "random" else f"{run.death}:{run.arrival}"
    driver = start_driver(job, log, fault)
    try:
        if run.death == "random":
            tally.committed(next_batch(driver))
            kill_executors(driver, job, run, rng, tally)
            if run.outage:
                sink_outage(driver, job)
            time.sleep(rng.uniform(0, job.batch_s))
            driver.kill()
        else:
            assert driver.wait(STEP_TIMEOUT_S) == -signal.SIGKILL, f"{fault} did not kill it"
            batches = [line.at for line in driver.lines if is_batch(line.text)]
            if batches:  # it may die at its fault point before committing anything
                tally.committed(batches[0])
        tally.killed_at = time.monotonic()
        tally.driver_kills += 1
    finally:
        driver.kill()


def seconds(values: list[float], pick) -> str:
    return f"{pick(values):.1f}s" if values else "-"


@pytest.mark.slow
@pytest.mark.timeout(600 + 180 * (DRIVER_KILLS + EXECUTOR_KILLS))
def test_soak_under_driver_and_executor_kills_and_a_sink_outage(tmp_path):
    seed = int(os.environ.get("DSTREAM_FAULT_SEED", random.randrange(2**31)))
    print(f"\nDSTREAM_FAULT_SEED={seed}")
    rng = random.Random(seed)
    policy = {"retries": 8, "backoffSeconds": 1}
    job = RateJob(
        tmp_path,
        batch_s=3,
        window_s=15,
        checkpoint_interval_s=6,
        parallelism=2,
        seed=seed % 1000,
        extra_spec={"failurePolicy": policy},
    )
    job.write()
    log = tmp_path / "driver.log"
    tally = Tally()
    try:
        for run in schedule(rng):
            live_through(run, job, log, rng, tally)
        last = start_driver(job, log)
        try:
            tally.committed(next_batch(last))
            assert last.terminate(timeout_s=120) == 0
        finally:
            last.kill()
    finally:
        for work in (Path(pyspark.__file__).parent / "work").glob("app-*"):
            shutil.rmtree(work, ignore_errors=True)  # the standalone workers' directories
    verdict = verify(job)
    recoveries = tally.driver_recoveries
    print(
        f"soak: driver_kills={tally.driver_kills} executor_kills={tally.executor_kills} "
        f"batches={verdict.batches} lost={verdict.lost} duplicated={verdict.duplicated} "
        f"recovery_p50={seconds(recoveries, statistics.median)} "
        f"recovery_max={seconds(recoveries, max)} "
        f"executor_recovery_p50={seconds(tally.executor_recoveries, statistics.median)} "
        f"executor_recovery_max={seconds(tally.executor_recoveries, max)}"
    )
    assert (tally.driver_kills, tally.executor_kills) == (DRIVER_KILLS, EXECUTOR_KILLS)
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert verdict.lost == 0 and verdict.duplicated == 0
