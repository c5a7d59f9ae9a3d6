"""`python -m bench`: every system and variant, interleaved on this machine, and the report.

Two tables, one per Python worker daemon (dstream.worker.pydaemon, then pyspark.daemon): for each, one
worker process per system (`bench.worker`, its own JVM) stays up, and the searches of all
(system, variant) pairs for a workload advance together, one trial each in turn (the order
reversed every round), so that a change in the machine's load reaches all of them alike. Every
search starts from the same fixed rates, never from earlier results. Each trial runs under the
load gate (`bench.machine`): a trial during which other processes used the CPU is redone, at
most `--retries` times, then reported as "machine busy".

`--quick` (make bench-quick) runs short search trials without confirmations and prints what
they found, labelled as not a result; it writes nothing. The full run (make bench) confirms
every maximum, runs the recovery experiments and writes bench/results/<date>.md and .json.
`--allow-load` lets trials count although others loaded the machine: a smoke run of the
harness, labelled so, never written to bench/results. `--merge` adds this run's rows to the
day's results instead of replacing them (a table that takes hours can be measured in another
run); `--recovery-only` runs only the recovery experiments, at half of the maxima the day's
results already hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from bench.ceiling import ENGINES, ceiling_rate
from bench.common import LOGS, RESULTS, kill_group, start_process
from bench.machine import (
    LoadMonitor,
    busy_reason,
    describe_machine,
    git_commit,
    others_now,
    summarize_load,
)
from bench.report import load_report, write_report
from bench.search import RateSearch
from bench.systems import DAEMONS, SYSTEM_CLASSES, SYSTEMS, WORKLOADS
from bench.trial import BUSY, Verdict, percentile

START_RATES = {"grep": 200_000, "wordcount": 50_000, "topk": 50_000}
CORES = 2  # the workers' local[2]
CEILING_LINES, CEILING_ROUNDS = 200_000, 2


@dataclass(frozen=True)
class Plan:
    """How long trials are and how hard a search tries."""

    warmup: int
    measured: int
    max_trials: int
    tolerance: float
    confirm: bool
    confirm_warmup: int
    confirm_measured: int
    samples: int  # batches whose output is checked per trial
    batch_ms: int = 1000  # the batch interval (--batch-interval)


PLANS = {
    # Quick: a few short trials per search, no confirmation: proves the harness, not a result.
    "quick": Plan(3, 6, 3, 0.3, False, 0, 0, 3),
    # Full: p90 over 30 batches; a confirmation runs 15 + 45 batches, so the 30 s window is
    # full (from batch 30 on) for 31 of its 45 measured batches.
    "full": Plan(5, 30, 6, 0.1, True, 15, 45, 4),
}


class Worker:
    """A `bench.worker` process: one system's JVM, taking trial commands one at a time."""

    def __init__(self, system: str, daemon: str, master: str = "local[2]"):
        self.process = start_process(
            [sys.executable, "-m", "bench.worker", "--system", system, "--daemon", daemon]
            + ["--master", master],
            f"{system}-{daemon}.log",
            stdin=True,
        )
        self._next_event()  # ready

    def _next_event(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"worker exited ({self.process.poll()}); see {LOGS}")

    def trial(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._next_event()

    def close(self) -> None:
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({"quit": True}) + "\n")
            self.process.stdin.close()
            self.process.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        kill_group(self.process)  # its JVM and Python workers, if left
        self.process.wait()


@dataclass(frozen=True)
class Gate:
    """The load gate: others' CPU limit over stretches of block_s, and how often to redo."""

    limit_cores: float
    block_s: float
    retries: int
    allow_load: bool


def gated_trial(worker: Worker, command: dict[str, Any], gate: Gate) -> dict[str, Any]:
    """Run a trial under the load gate; redo it while others load the machine."""
    for attempt in range(gate.retries + 1):
        with LoadMonitor() as monitor:
            event = worker.trial(command)
        event["load"] = summarize_load(monitor.samples)
        event["attempt"] = attempt + 1
        busy = busy_reason(monitor.samples, gate.limit_cores, gate.block_s)
        event["busy"] = busy
        if busy is None or gate.allow_load:
            return event
        if attempt < gate.retries:
            progress(f"    redo ({busy})")
            wait_for_quiet(gate, max_wait_s=120)
    event["verdict"].update(kind=BUSY, reason=busy)
    return event


def wait_for_quiet(gate: Gate, max_wait_s: float) -> None:
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline and others_now(5) > gate.limit_cores:
        pass


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def trial_line(system: str, variant: str, event: dict[str, Any]) -> str:
    v = event["verdict"]
    kind = "confirm" if event["confirmation"] else "search"
    load = event.get("load", {})
    return (
        f"  {event['workload']:9} {system:17} {variant:8} {event['rate']:>9,}/s {kind:7} "
        f"p50 {v['processing_p50_ms']:5.0f} p90 {v['processing_p90_ms']:5.0f} ms "
        f"load {load.get('load1_max', 0):.1f} others {load.get('others_cores_mean', 0):.2f}: "
        f"{v['kind'] if v['kind'] != 'ok' else 'ok'}{'' if v['kind'] == 'ok' else ' (' + v['reason'] + ')'}"
    )


def search_workload(
    workers: dict[str, Worker],
    pairs: list[tuple[str, str]],
    workload: str,
    plan: Plan,
    gate: Gate,
) -> dict[tuple[str, str], dict[str, Any]]:
    """All pairs' searches for one workload, interleaved; per pair its result and trials.

    Before each round of trials the ceiling of each DStream program (`bench.ceiling`) is
    measured in this process while the workers idle, so every maximum can be set against what
    the machine allowed while it was searched: the ceiling has varied by a quarter between
    hours on the same machine."""
    searches = {
        pair: RateSearch(
            START_RATES[workload],
            plan.max_trials,
            plan.tolerance,
            plan.confirm,
            interval_ms=plan.batch_ms,
        )
        for pair in pairs
    }
    events: dict[tuple[str, str], list[dict[str, Any]]] = {pair: [] for pair in pairs}
    ceilings: dict[str, list[float]] = {v: [] for system, v in pairs if system in ENGINES}
    order = list(pairs)
    while any(s.result is None for s in searches.values()):
        planned = {pair: searches[pair].next_trial() for pair in order}
        if any(planned.values()):
            for variant, samples in ceilings.items():
                samples.append(
                    ceiling_rate(workload, variant, CORES, CEILING_LINES, CEILING_ROUNDS)
                )
        for pair in order:
            if planned[pair] is None:
                continue
            rate, confirmation = planned[pair]
            command = {
                "workload": workload,
                "variant": pair[1],
                "rate": rate,
                "confirmation": confirmation,
                "warmup": plan.confirm_warmup if confirmation else plan.warmup,
                "measured": plan.confirm_measured if confirmation else plan.measured,
                "samples": plan.samples,
                "batch_ms": plan.batch_ms,
            }
            event = gated_trial(workers[pair[0]], command, gate)
            progress(trial_line(*pair, event))
            events[pair].append(event)
            searches[pair].record(rate, confirmation, Verdict(**event["verdict"]))
        order.reverse()
    return {
        pair: summarize_search(
            searches[pair], events[pair], ceilings[pair[1]] if pair[0] in ENGINES else []
        )
        for pair in pairs
    }


def summarize_ceiling(samples: list[float]) -> dict[str, Any]:
    """The ceilings measured during a search: their median and range, in lines per second."""
    return {
        "median": round(percentile(samples, 0.5)),
        "range": [round(min(samples)), round(max(samples))],
        "samples": len(samples),
    }


def summarize_search(
    search: RateSearch, events: list[dict[str, Any]], ceilings: list[float]
) -> dict[str, Any]:
    """The row of a table: status, and figures only from the trial that established the rate."""
    assert search.result is not None
    row: dict[str, Any] = {"status": search.result.status, "rate": search.result.rate}
    if ceilings:
        row["ceiling"] = summarize_ceiling(ceilings)
    loads = [e["load"] for e in events if e.get("load")]
    if loads:
        row["load1"] = [min(x["load1_min"] for x in loads), max(x["load1_max"] for x in loads)]
        row["others_cores_max_mean"] = max(x["others_cores_mean"] for x in loads)
    row["trials"] = [
        {k: e.get(k) for k in ("rate", "confirmation", "seconds", "attempt", "busy", "load")}
        | {k: e["verdict"][k] for k in ("processing_p50_ms", "processing_p90_ms")}
        | {"verdict": e["verdict"]["kind"], "reason": e["verdict"]["reason"]}
        for e in events
    ]
    if search.result.status in ("wrong output", "machine busy"):
        row["reason"] = events[-1]["verdict"]["reason"]
    deciding = [
        e for e in events if e["rate"] == search.result.rate and e["verdict"]["kind"] == "ok"
    ]
    if search.result.rate is not None and deciding:
        trial = deciding[-1]
        processing = [b["processing_ms"] for b in trial["batches"]]
        row.update(
            batches=len(processing),
            processing_p50_ms=percentile(processing, 0.5),
            processing_p90_ms=percentile(processing, 0.9),
            checked_batches=trial["checked_batches"],
            **measured_latency(trial["batches"]),
        )
    return row


def measured_latency(batches: list[dict[str, Any]]) -> dict[str, float]:
    """The trial's end-to-end latency from each batch's measured percentiles over its records:
    the median of the batches' medians, and the worst batch's p99 (an upper bound of the p99
    over all the trial's records: every batch has at least 99% of its records within it). {}
    for a system whose batches carry none (Structured)."""
    p50s = [b["latency_p50_ms"] for b in batches if b.get("latency_p50_ms") is not None]
    p99s = [b["latency_p99_ms"] for b in batches if b.get("latency_p99_ms") is not None]
    if not p50s:
        return {}
    return {
        "latency_p50_ms": round(percentile(p50s, 0.5)),
        "latency_p99_ms": round(max(p99s)),
        "latency_measured": True,  # rows of earlier runs hold a modelled latency
    }


def run_table(
    daemon: str,
    systems: list[str],
    workloads: list[str],
    variants: set[str] | None,
    plan: Plan,
    gate: Gate,
    table: dict[str, Any],
    measured: Callable[[str], None],
) -> None:
    """Every (system, variant) on `daemon` into `table` ({workload: {"system/variant": row}}),
    calling `measured` with each workload when its rows are in."""
    progress(f"== worker daemon {daemon}: starting {', '.join(systems)}")
    workers = {system: Worker(system, daemon) for system in systems}
    pairs = [
        (system, variant)
        for system in systems
        for variant in SYSTEM_CLASSES[system].variants
        if variants is None or variant in variants
    ]
    try:
        for workload in workloads:
            progress(f"== {workload} on {daemon}: {len(pairs)} searches, interleaved")
            rows = search_workload(workers, pairs, workload, plan, gate)
            suffix = "" if plan.batch_ms == 1000 else f" ({plan.batch_ms} ms batches)"
            table.setdefault(workload, {}).update(
                {f"{s}/{v}{suffix}": row for (s, v), row in rows.items()}
            )
            measured(workload)
    finally:
        for worker in workers.values():
            worker.close()


def tag_rows(tables: dict[str, dict[str, Any]], run: int) -> None:
    """Rows measured by run number `run` say so; rows of earlier runs keep their number."""
    for table in tables.values():
        for rows in table.values():
            for row in rows.values():
                row.setdefault("run", run)


def summary_lines(table: dict[str, Any], label: str) -> list[str]:
    lines = [label]
    for workload, rows in table.items():
        for name, row in rows.items():
            if row["rate"] is not None:
                figure = (
                    f"{row['rate']:>9,}/s  p50 {row.get('processing_p50_ms', 0):.0f} ms, "
                    f"p90 {row.get('processing_p90_ms', 0):.0f} ms over {row.get('batches', 0)}"
                )
            else:
                figure = f"no figure: {row['status']}" + (
                    f" ({row['reason']})" if row.get("reason") else ""
                )
            lines.append(f"  {workload:9} {name:28} {row['status']:15} {figure}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short searches, no confirmation")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--variants", default=None, help="comma list (default: all)")
    parser.add_argument("--daemons", default=",".join(DAEMONS))
    parser.add_argument("--no-recovery", action="store_true", help="skip recovery experiments")
    parser.add_argument(
        "--batch-interval",
        type=int,
        default=1000,
        metavar="MS",
        help="batch interval of the DStream systems' trials, in ms (e.g. 500); other than "
        "1000 excludes Structured Streaming (1 s triggers) and the recovery experiments",
    )
    parser.add_argument("--busy-cores", type=float, default=0.25, help="others' CPU limit")
    parser.add_argument("--busy-block", type=float, default=10.0, help="seconds per stretch")
    parser.add_argument("--retries", type=int, default=2, help="redos of a busy trial")
    parser.add_argument(
        "--allow-load",
        action="store_true",
        help="smoke run: count trials despite others' load (labelled, never written)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="add to today's results: rows this run does not measure stay as written",
    )
    parser.add_argument(
        "--recovery-only",
        action="store_true",
        help="only recovery, at half of today's dstream.worker.pydaemon maxima (implies --merge)",
    )
    args = parser.parse_args(argv)
    plan = replace(PLANS["quick" if args.quick else "full"], batch_ms=args.batch_interval)
    gate = Gate(args.busy_cores, args.busy_block, args.retries, args.allow_load)
    systems, workloads = args.systems.split(","), args.workloads.split(",")
    recovers = not (args.quick or args.allow_load or args.no_recovery)
    if plan.batch_ms != 1000 and ("structured" in systems or recovers):
        parser.error(
            f"--batch-interval {plan.batch_ms}: runs the DStream systems' trials only; add "
            "--systems dstream,pyspark.streaming --no-recovery"
        )
    variants = set(args.variants.split(",")) if args.variants else None
    machine = describe_machine()
    started = time.time()
    daemons = [] if args.recovery_only else args.daemons.split(",")
    writes = not (args.quick or args.allow_load)
    stamp = datetime.now().strftime("%Y-%m-%d")
    earlier = load_report(RESULTS, stamp) if args.merge or args.recovery_only else None
    tables: dict[str, dict[str, Any]] = earlier["tables"] if earlier else {}
    recovery: dict[str, Any] = earlier["recovery"] if earlier else {}
    runs: list[dict[str, Any]] = earlier["runs"] if earlier else []
    runs.append(
        {
            "started": datetime.now().isoformat(timespec="minutes"),
            "commit": git_commit(),
            "command": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
            "batch_interval_ms": plan.batch_ms,
            "load_at_start": os.getloadavg(),
        }
    )
    pending = [f"{workload} on {daemon}" for daemon in daemons for workload in workloads]
    pending += [] if args.no_recovery else ["recovery"]

    def write() -> None:
        """The results so far: a run of hours may be stopped, and what it measured stays."""
        if writes:
            runs[-1]["load_at_end"] = os.getloadavg()
            tag_rows(tables, len(runs))
            path = write_report(
                RESULTS, stamp, machine, runs, tables, recovery, gate, plan, pending
            )
            progress(f"results{' so far' if pending else ''}: {path}")

    for daemon in daemons:

        def measured(workload: str, daemon: str = daemon) -> None:
            pending.remove(f"{workload} on {daemon}")
            write()

        run_table(
            daemon,
            systems,
            workloads,
            variants,
            plan,
            gate,
            tables.setdefault(daemon, {}),
            measured,
        )
    label = "QUICK RUN: search trials only, no confirmation; NOT A RESULT" if args.quick else ""
    if args.allow_load:
        label = "SMOKE RUN with --allow-load (other processes loaded the machine); NOT A RESULT"
    for daemon in daemons:
        print(
            "\n".join(summary_lines(tables[daemon], f"{label or 'RESULT'}: worker daemon {daemon}"))
        )
    print(f"({time.time() - started:.0f} s)", flush=True)
    if writes and not args.no_recovery:
        from bench.recovery import run_recovery

        recovery.clear()
        recovery.update(run_recovery(systems, tables.get(DAEMONS[0], {}), DAEMONS[0]))
        recovery["run"] = len(runs)
        pending.remove("recovery")
        write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
