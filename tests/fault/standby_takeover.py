"""Where a standby's takeover goes, measured locally (docs/fault-tolerance.md, "Standby
takeover, measured"; the runs in bench/results/2026-11-25-recovery.md): the job of the chaos e2e
(faultapp: counts, running totals, an incrementally kept window; the rate source at 100 records/s;
6 s batches; state checkpoints every 3 batches) with a leader and a `dstream run --standby`, each
on `local-cluster[2,1,1024]` (executors of its own) and the JVMs'
compilers as `dstream run` sets them there (the test drivers' quick JIT undone: the executors
C1 only, the driver both; on pods the driver runs C1 only too). For each kill: wait for the
standby to be warm and for two batches of the leader on time, SIGKILL the leader's process
group a random 0-5 s after its batch, and print a JSON line with the machine's load, the
standby's timeline phases after the kill and its first three batches: when each was due and
committed (seconds after the kill), its processing time and its delay (commit minus batch
time; a live leader's is its processing time), and whether it took over from the state it
shadowed (runtime/shadow.py). Spark's event log of every driver is kept under DIR/events
(jobs, stages, tasks).

    .venv/bin/python tests/fault/standby_takeover.py DIR [--kills N] [--baseline-code DIR2]

With `--baseline-code`, every second standby runs the `driver/` tree under DIR2 instead (e.g.
`git archive <commit> driver | tar -x -C DIR2`), so that two versions are compared under the
same load: each line says which one took over.

Not a test: a measurement, run by hand (it takes a few minutes per kill).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # running_driver, fault.harness

from fault.harness import RateJob  # noqa: E402
from running_driver import Driver, python_path  # noqa: E402

BATCH = re.compile(
    r"batch (\d\d:\d\d:\d\d) .*processing\s+([\d.]+) s \| scheduling delay\s+([\d.]+) s"
)
TIMELINE = re.compile(r"recovery timeline: phase=(\w+) at=([\d.]+)")
STEP_TIMEOUT_S = 900


def on_time(text: str) -> bool:
    found = BATCH.search(text)
    return bool(found) and float(found.group(3)) < 0.5 and "catch-up" not in text


def wall_of(monotonic: float) -> float:
    return time.time() - (time.monotonic() - monotonic)


def batch_figures(driver: Driver, after: int, killed: float) -> list[dict[str, float]]:
    """The driver's batches from line `after`: due, committed (after the kill), processing,
    delay (all seconds)."""
    figures = []
    day = time.localtime(killed)[:3]
    for line in driver.lines[after:]:
        found = BATCH.search(line.text)
        if not found:
            continue
        hours, minutes, seconds = map(int, found.group(1).split(":"))
        due = time.mktime((*day, hours, minutes, seconds, 0, 0, -1))
        committed = wall_of(line.at)
        figures.append(
            {
                "due": round(due - killed, 2),
                "committed": round(committed - killed, 2),
                "processing": float(found.group(2)),
                "delay": round(committed - due, 2),
            }
        )
    return figures


class Pair:
    """A leader and its standby on one job, started with the measurement's settings."""

    def __init__(self, root: Path, rate: int = 100):
        self.job = RateJob(
            root, batch_s=6, window_s=18, checkpoint_interval_s=18, seed=7, rate=rate
        )
        self.job.parallelism = 2
        self.job.write()
        events = root / "events"
        events.mkdir(exist_ok=True)
        settings = {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": f"file://{events}",
            "spark.eventLog.compress": "false",
            "spark.dstream.lease.durationSeconds": "5",
            "spark.driver.extraJavaOptions": "",  # dstream run's own JIT settings
            "spark.executor.extraJavaOptions": "",
        }
        self.args = ["--master", "local-cluster[2,1,1024]"]
        self.args += [arg for k, v in settings.items() for arg in ("--conf", f"{k}={v}")]
        self.log = root / "drivers.log"
        self.drivers: list[Driver] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> Driver:
        driver = Driver(self.job.manifest, *self.args, *args, env=env, log=self.log).start()
        self.drivers.append(driver)
        return driver

    def kill_all(self) -> None:
        for driver in self.drivers:
            driver.kill()


def takeover(leader: Driver, standby: Driver, number: int) -> dict[str, object]:
    """Kill the leader once the standby is warm and the leader on time; the standby's figures."""
    standby.wait_for_line(lambda text: "standby: warm" in text, STEP_TIMEOUT_S)
    leader.wait_for_line(on_time, STEP_TIMEOUT_S, after=len(leader.lines))
    line = leader.wait_for_line(on_time, STEP_TIMEOUT_S, after=len(leader.lines))
    steady = [float(BATCH.search(x.text).group(2)) for x in leader.lines if on_time(x.text)]
    time.sleep(max(0.0, line.at + random.uniform(0, 5) - time.monotonic()))
    killed = time.time()
    os.killpg(leader.pid, signal.SIGKILL)
    load = os.getloadavg()[0]
    after = len(standby.lines)
    for _ in range(3):
        standby.wait_for_line(
            lambda text: bool(BATCH.search(text)), STEP_TIMEOUT_S, len(standby.lines)
        )
    phases = {
        found.group(1): round(float(found.group(2)) - killed, 2)
        for x in standby.lines
        if (found := TIMELINE.search(x.text)) and float(found.group(2)) >= killed - 1
    }
    return {
        "kill": number,
        "load1": round(load, 1),
        "leader_processing": steady[-3:],
        "phases": phases,
        "shadowed": any("taking over with the state it shadowed" in x.text for x in standby.lines),
        "batches": batch_figures(standby, after, killed)[:3],
    }


def code_env(baseline: Path | None, code: str) -> dict[str, str] | None:
    """The environment of a standby running the baseline's driver code (first on the path of
    the driver and of its Python workers)."""
    if baseline is None or code != "baseline":
        return None
    return {"PYTHONPATH": f"{baseline.resolve() / 'driver'}{os.pathsep}{python_path()}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "root", type=Path, help="a directory for the job, its drivers' log and events"
    )
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument(
        "--baseline-code", type=Path, help="a tree whose driver/ every second standby runs"
    )
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    pair = Pair(args.root)
    try:
        leader = pair.start()
        leader.wait_for_line(lambda text: "leading checkpoint" in text, STEP_TIMEOUT_S)
        code = "current"
        standby = pair.start("--standby")
        for number in range(1, args.kills + 1):
            print(json.dumps({"code": code} | takeover(leader, standby, number)), flush=True)
            leader = standby
            if number < args.kills:
                code = "baseline" if args.baseline_code and code == "current" else "current"
                standby = pair.start("--standby", env=code_env(args.baseline_code, code))
    finally:
        pair.kill_all()


if __name__ == "__main__":
    main()
