"""The searches for each system's maximum rate, interleaved on this machine (`python -m bench`
runs them and writes their tables, bench/run.py).

For one worker daemon, one worker process per system (`python -m bench.throughput worker`, its
own JVM) stays up, and the searches of all (system, variant) pairs for a workload advance
together, one trial each in turn (the order reversed every round), so that a change in the
machine's load reaches all of them alike. Every search starts from the same fixed rates, never
from earlier results. Each trial runs under the load gate (`bench.machine`): a trial during
which other processes used the CPU is redone, at most `Gate.retries` times, then reported as
"machine busy".
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from bench.common import ENGINES, LOGS, kill_group, start_process
from bench.machine import LoadMonitor, busy_reason, others_now, summarize_load
from bench.throughput.ceiling import ceiling_rate
from bench.throughput.same_rate import plan_comparisons, row_name, trial_figures
from bench.throughput.search import RateSearch
from bench.throughput.systems import SYSTEM_CLASSES
from bench.throughput.trial import (
    BUSY,
    Verdict,
    latency_target_ms,
    measured_latency,
    percentile,
)

START_RATES = {"grep": 200_000, "grep-jvm": 200_000, "wordcount": 50_000, "topk": 50_000}
CORES = 2  # the workers' local[2]
NO_KAFKA_SOURCE = {
    "status": "no Kafka source",
    "rate": None,
    "reason": "PySpark removed its Kafka DStream API (KafkaUtils) in Spark 3.0, SPARK-25705",
}
CEILING_LINES, CEILING_ROUNDS = 200_000, 2
# Kept for every trial, not only the deciding one: two systems' latencies at one rate compare.
TRIAL_FIGURES = ("processing_p50_ms", "processing_p90_ms", "latency_p99_ms", "within_target")


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

    def at_interval(self, batch_ms: int) -> Plan:
        """This plan (written for 1 s batches) for batches of batch_ms, its stretches as long in
        seconds: with 500 ms batches a confirmation still fills the 30 s window, and a warm-up
        still gives an engine's first slow batches as long to drain."""

        def batches(count_at_1s: int) -> int:
            return math.ceil(count_at_1s * 1000 / batch_ms)

        return replace(
            self,
            warmup=batches(self.warmup),
            measured=batches(self.measured),
            confirm_warmup=batches(self.confirm_warmup),
            confirm_measured=batches(self.confirm_measured),
            batch_ms=batch_ms,
        )


PLANS = {
    # Quick: a few short trials per search, no confirmation: proves the harness, not a result.
    "quick": Plan(3, 6, 3, 0.3, False, 0, 0, 3),
    # Full: p90 over 30 batches; a confirmation runs 15 + 45 batches, so the 30 s window is
    # full (from batch 30 on) for 31 of its 45 measured batches.
    "full": Plan(5, 30, 6, 0.1, True, 15, 45, 4),
}


class Worker:
    """A `bench.throughput.worker` process: one system's JVM, taking trial commands one at a
    time."""

    def __init__(
        self, system: str, daemon: str, master: str = "local[2]", kafka: str | None = None
    ):
        self.process = start_process(
            [sys.executable, "-m", "bench.throughput", "worker", "--system", system]
            + ["--daemon", daemon]
            + ["--master", master]
            + (["--kafka", kafka] if kafka else []),
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
    kind = event.get("label") or ("confirm" if event["confirmation"] else "search")
    load = event.get("load", {})
    p99 = v.get("latency_p99_ms")
    return (
        f"  {event['workload']:9} {system:17} {variant:8} {event['rate']:>9,}/s {kind:7} "
        f"p50 {v['processing_p50_ms']:5.0f} p90 {v['processing_p90_ms']:5.0f} ms "
        f"{'' if p99 is None else f'latency p99 {p99:5.0f} ms '}"
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

    Before each round of trials the ceiling of each DStream program (`bench.throughput.ceiling`) is
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
            command = trial_command(workload, pair[1], rate, confirmation, plan)
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


def trial_command(
    workload: str, variant: str, rate: int, confirmation: bool, plan: Plan
) -> dict[str, Any]:
    """A worker's command for one trial: a confirmation is longer, with the window full."""
    return {
        "workload": workload,
        "variant": variant,
        "rate": rate,
        "confirmation": confirmation,
        "warmup": plan.confirm_warmup if confirmation else plan.warmup,
        "measured": plan.confirm_measured if confirmation else plan.measured,
        "samples": plan.samples,
        "batch_ms": plan.batch_ms,
    }


def compare_at_dstream_rates(
    workers: dict[str, Worker],
    rows: dict[str, Any],
    pairs: list[tuple[str, str]],
    suffix: str,
    workload: str,
    plan: Plan,
    gate: Gate,
    warm: frozenset[tuple[str, str]] = frozenset(),
) -> None:
    """At each confirmed dstream rate among `rows`, dstream's trial and then each peer's that
    its search did not settle (`same_rate`), confirmation-length; the figures go into the
    dstream row's `at_this_rate`, by row name. A pair not in `warm` (after the searches every
    pair is) first runs one search-length trial at half the rate, not counted: from a cold JVM
    a trial at a system's maximum spends itself draining the start-up queue of the JIT."""
    warmed = set(warm)
    for comparison in plan_comparisons(rows, pairs, suffix):
        at_rate = dict(comparison.settled)
        for pair in [comparison.ours, *comparison.peers] if comparison.peers else []:
            if pair not in warmed:
                command = trial_command(workload, pair[1], comparison.rate // 2, False, plan)
                progress(trial_line(*pair, workers[pair[0]].trial(command | {"label": "warm-up"})))
                warmed.add(pair)
            command = trial_command(workload, pair[1], comparison.rate, True, plan)
            event = gated_trial(workers[pair[0]], command | {"label": "at rate"}, gate)
            progress(trial_line(*pair, event))
            at_rate[row_name(pair, suffix)] = trial_figures(event)
        rows[row_name(comparison.ours, suffix)]["at_this_rate"] = at_rate


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
        | {k: e["verdict"].get(k) for k in TRIAL_FIGURES}
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
            **measured_latency(trial["batches"], latency_target_ms(trial.get("batch_ms", 1000))),
        )
    return row


def run_table(
    daemon: str,
    systems: list[str],
    workloads: list[str],
    variants: set[str] | None,
    plan: Plan,
    gate: Gate,
    table: dict[str, Any],
    measured: Callable[[str], None],
    kafka: str | None = None,
    master: str = "local[2]",
    search: bool = True,
) -> None:
    """Every (system, variant) on `daemon` into `table` ({workload: {"system/variant": row}}),
    calling `measured` with each workload when its rows are in. With `kafka` (a broker's
    bootstrap), every trial reads a topic fed on it (rows named "(kafka)"); a system without
    a Kafka source gets a row saying so, and Structured Streaming runs its expert formulation.
    Every system's JVM runs `master`; rows of another than local[2] are named after it. After
    a workload's searches (with `search` false, instead of them, on the rows `table` holds)
    every peer's latency is measured at dstream's confirmed rates (`compare_at_dstream_rates`)."""
    readers = [s for s in systems if kafka is None or SYSTEM_CLASSES[s].reads_kafka]
    progress(f"== worker daemon {daemon}: starting {', '.join(readers)}")
    workers = {system: Worker(system, daemon, master, kafka) for system in readers}
    pairs = [
        (system, variant)
        for system in readers
        for variant in SYSTEM_CLASSES[system].variants
        if (variants is None or variant in variants) and (kafka is None or variant != "plain")
    ]
    source = " (kafka)" if kafka else ""
    try:
        for workload in workloads:
            suffix = source + ("" if plan.batch_ms == 1000 else f" ({plan.batch_ms} ms batches)")
            suffix += "" if master == "local[2]" else f" ({master})"
            rows = table.setdefault(workload, {})
            if search:
                progress(f"== {workload} on {daemon}: {len(pairs)} searches, interleaved")
                found = search_workload(workers, pairs, workload, plan, gate)
                rows.update({row_name(pair, suffix): row for pair, row in found.items()})
                for system in sorted(set(systems) - set(readers)):
                    rows[f"{system}{suffix}"] = NO_KAFKA_SOURCE
            if plan.confirm:
                progress(f"== {workload} on {daemon}: every peer at dstream's rates")
                warm = frozenset(pairs if search else ())
                compare_at_dstream_rates(workers, rows, pairs, suffix, workload, plan, gate, warm)
            measured(workload)
    finally:
        for worker in workers.values():
            worker.close()


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
