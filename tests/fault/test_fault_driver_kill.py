"""Kill -9 the driver again and again while input keeps arriving; the output must stay exact.

Each round starts `dstream run` on the same checkpoint and kills it: at a random moment after its
first batch (the whole process group like a lost pod, or only the Python driver), or at an exact
spot through DSTREAM_FAULT_INJECT (between a batch's outputs and its commit; while a commit or a
batch record is being written). A last round runs until it has committed a batch of its own and
is stopped with SIGTERM. Then every batch directory is compared with the reference computed
straight from the input offsets. The seed is printed (and read from DSTREAM_FAULT_SEED) so that a
failure can be replayed.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fault.harness import PartialOutputWatch, RateJob, Verdict, fault_seed, verify
from running_driver import Driver

ROUND_TIMEOUT_S = 240
RECOVERED = re.compile(r"recovered from .*: re-running (\d+) uncommitted batches")


def is_batch(text: str) -> bool:
    return text.startswith("batch ") and "FAILED" not in text


def is_new_batch(text: str) -> bool:
    """A progress line of a batch this process planned itself (not one it replayed)."""
    return is_batch(text) and "replayed" not in text


@dataclass
class Round:
    fault: str
    exit_code: int | None
    ran_s: float  # process start to its end
    replayed: int | None  # uncommitted batches the restart found in the log
    recovered_s: float | None  # process start to recovery done (Spark up, log read, state loaded)
    first_batch_s: float | None  # process start to its first committed batch: processing resumed
    first_new_s: float | None  # process start to the first committed batch it planned itself
    batches: int  # batches it committed


def summarize(driver: Driver, fault: str, ended_at: float) -> Round:
    def since_start(predicate) -> float | None:
        lines = [line for line in driver.lines if predicate(line.text)]
        return lines[0].at - driver.started_at if lines else None

    found = [m for line in driver.lines if (m := RECOVERED.search(line.text))]
    assert driver.process is not None
    return Round(
        fault,
        driver.process.returncode,
        ended_at - driver.started_at,
        int(found[0].group(1)) if found else None,
        since_start(RECOVERED.search),
        since_start(is_batch),
        since_start(is_new_batch),
        sum(1 for line in driver.lines if is_batch(line.text)),
    )


def fault_plan(rng: random.Random) -> list[tuple[str, int]]:
    """Two random-time kills, one between a batch's outputs and its commit, and one while the
    log is written (a commit or a batch record: a restart plans the missed batch times first, so
    records come in a burst), each exact spot at its n-th arrival, in a seeded order."""
    log_write = rng.choice(
        [("commit-write", rng.randint(1, 3)), ("batch-record-write", rng.randint(2, 8))]
    )
    plan = [("random", 0), ("random", 0), ("before-commit", rng.randint(1, 3)), log_write]
    rng.shuffle(plan)
    return plan


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_driver_killed_repeatedly_output_exact(tmp_path):
    seed = fault_seed()
    rng = random.Random(seed)
    job = RateJob(tmp_path, batch_s=4, window_s=20, checkpoint_interval_s=8, seed=seed % 1000)
    job.write()
    log = tmp_path / "driver.log"
    rounds: list[Round] = []
    with PartialOutputWatch(job.out) as watch:
        for fault, arrival in fault_plan(rng):
            rounds.append(run_round(job, fault, arrival, rng, log))
        final = Driver(job.manifest, log=log).start()
        try:
            final.wait_for_line(is_new_batch, ROUND_TIMEOUT_S)
            code = final.terminate(timeout_s=90)
        finally:
            final.kill()
    rounds.append(summarize(final, "none: SIGTERM after a new batch", time.monotonic()))
    verdict = verify(job)
    print(report(seed, rounds, verdict, watch.polls))
    assert code == 0
    assert [r.exit_code for r in rounds[:-1]] == [-9] * (len(rounds) - 1)
    assert not watch.partial, f"partial batch directories seen: {sorted(set(watch.partial))}"
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert verdict.lost == 0 and verdict.duplicated == 0
    assert not [p.name for p in job.out.iterdir() if p.name.startswith(".")], "temp dirs left"
    assert not (job.out.parent / f".dstream-staging-{job.out.name}").exists(), "attempts left"


def run_round(job: RateJob, fault: str, arrival: int, rng: random.Random, log: Path) -> Round:
    """Start the driver on the job's checkpoint and kill it as `fault` says."""
    env = {}
    if fault != "random":
        env["DSTREAM_FAULT_INJECT"] = f"{fault}:{arrival}"
    driver = Driver(job.manifest, env=env, log=log).start()
    try:
        if fault == "random":
            driver.wait_for_line(is_batch, ROUND_TIMEOUT_S)
            time.sleep(rng.uniform(0, 2 * job.batch_s))
            whole_group = rng.random() < 0.7
            driver.kill(whole_group=whole_group)
            fault = "random time, " + ("process group" if whole_group else "python driver only")
        else:
            driver.wait(ROUND_TIMEOUT_S)
            fault = env["DSTREAM_FAULT_INJECT"]
        ended_at = time.monotonic()
    finally:
        driver.kill()
    return summarize(driver, fault, ended_at)


def report(seed: int, rounds: list[Round], verdict: Verdict, polls: int) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        f"DSTREAM_FAULT_SEED={seed}: {len(rounds) - 1} kills, then a graceful stop",
        f"  {'fault':<34} {'exit':>4} {'ran s':>6} {'replayed':>8} {'recovered s':>11} "
        f"{'1st batch s':>11} {'1st new s':>9} {'batches':>7}",
    ]
    for r in rounds:
        lines.append(
            f"  {r.fault:<34} {r.exit_code:>4} {r.ran_s:6.1f} {r.replayed or 0:>8} "
            f"{seconds(r.recovered_s):>11} {seconds(r.first_batch_s):>11} "
            f"{seconds(r.first_new_s):>9} {r.batches:>7}"
        )
    lines.append(
        f"  committed batches {verdict.batches}, records {verdict.records}, words "
        f"{verdict.words}: lost={verdict.lost} duplicated={verdict.duplicated}, "
        f"batches differing from the reference {len(verdict.mismatched_batches)}, "
        f"output polls without a partial directory {polls}"
    )
    return "\n".join(lines)
