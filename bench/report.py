"""bench/results/<date>.md and <date>.json: only what was measured, each row naming its run.

A day's results come from one run, or from several when later runs were told to add to them
(`python -m bench --merge`); every run is listed with its commit, command and loads."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.recovery.faults import FAULTS
from bench.throughput.ceiling import GOALS
from bench.throughput.programs import VARIANTS
from bench.throughput.reference import GREP_PATTERN, WINDOW_BATCHES
from bench.throughput.systems import SYSTEMS, WORKLOADS


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f} ms"


def _seconds(result: dict[str, Any], key: str) -> str:
    """A time since the fault; empty in results from before the reading existed."""
    if key not in result:
        return ""
    value = result[key]
    return "not within the run" if value is None else f"{value:.1f} s"


def throughput_table(table: dict[str, Any]) -> list[str]:
    lines = [
        "| workload | system / variant | result | max rate (records/s) | processing p50 / p90 "
        "| measured end-to-end latency: median batch p50 / worst batch p99; records within "
        "the target | batches "
        "| ceiling during the search (line generator + user's functions) | of ceiling "
        "| 1-min load | others' CPU (max trial mean) | run |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for workload in WORKLOADS:
        for name, row in table.get(workload, {}).items():
            confirmed = row["status"] == "confirmed"
            status = row["status"] + (f": {row['reason']}" if row.get("reason") else "")
            if row["status"] == "no passing rate":
                status += lowest_tried(row.get("trials", []))
            load = row.get("load1")
            loads = f"{load[0]:.1f} to {load[1]:.1f}" if load else ""
            if confirmed:
                figures = (
                    f"{row['rate']:,} | "
                    f"{_ms(row.get('processing_p50_ms'))} / {_ms(row.get('processing_p90_ms'))} | "
                    f"{latency_cell(row)} | "
                    f"{row.get('batches', '')}"
                )
            else:
                figures = "none | | |"
            lines.append(
                f"| {workload} | {name} | {status} | {figures} | {ceiling_cells(row)} | {loads} | "
                f"{row.get('others_cores_max_mean', '')} | {row.get('run', '')} |"
            )
    return lines


def lowest_tried(trials: list[dict[str, Any]]) -> str:
    """How far down a search without a figure went, and why its lowest rate failed: "none
    passed" says nothing of the rates it did not try."""
    if not trials:
        return ""
    lowest = min(trials, key=lambda t: t["rate"])
    return f" (lowest tried: {lowest['rate']:,}/s, {lowest['reason']})"


def latency_cell(row: dict[str, Any]) -> str:
    """Measured latency only; rows of runs that modelled it (before per-record measurement), and
    systems without it, say so."""
    if row.get("latency_p50_ms") is None or row.get("latency_measured") is not True:
        return "not measured"
    cell = f"{_ms(row['latency_p50_ms'])} / {_ms(row['latency_p99_ms'])}"
    if row.get("within_target") is None:
        return cell
    return f"{cell}; {row['within_target']:.1%} within {row['latency_target_ms'] / 1000:g} s"


def ceiling_cells(row: dict[str, Any]) -> str:
    """The row's ceiling (median, range) and its maximum's share of it; blank for rows of runs
    that did not measure the ceiling, and for systems not running the DStream programs."""
    ceiling = row.get("ceiling")
    if ceiling is None:
        return " | "
    low, high = ceiling["range"]
    share = f"{row['rate'] / ceiling['median']:.0%}" if row["rate"] is not None else ""
    return f"{ceiling['median']:,} ({low:,} to {high:,}) | {share}"


def same_rate_table(table: dict[str, Any]) -> list[str]:
    """Every peer's latency at each dstream row's rate (bench/throughput/same_rate.py), set
    against dstream's at that rate: from their interleaved trials, or, where the peer's search
    already failed the target at or below the rate, that failure."""
    lines = [
        "| workload | dstream row | rate | system / variant | measured by | result "
        "| latency: median batch p50 / worst batch p99; records within the target "
        "| dstream's p99 no worse | run |",
        "| --- | --- | ---: | --- | --- | --- | ---: | --- | ---: |",
    ]
    for workload in WORKLOADS:
        for name, row in table.get(workload, {}).items():
            at_rate = row.get("at_this_rate")
            if not at_rate:
                continue
            ours = at_rate.get(name, row)
            for peer, entry in at_rate.items():
                how = (
                    "a trial at this rate"
                    if entry["source"] == "trial"
                    else f"its search's trial at {entry['rate']:,}/s"
                )
                result = entry["verdict"] + (
                    "" if entry["verdict"] == "ok" else f": {entry['reason']}"
                )
                verdict = "" if peer == name else no_worse(ours, entry)
                lines.append(
                    f"| {workload} | {name} | {row['rate']:,} | {peer} | {how} | {result} | "
                    f"{at_rate_latency(entry)} | {verdict} | "
                    f"{entry.get('run', '')} |"
                )
    return lines


def at_rate_latency(entry: dict[str, Any]) -> str:
    """A trial's latency cell; a search trial kept only its worst batch's p99 and share."""
    if entry.get("latency_measured"):
        return latency_cell(entry)
    if entry.get("within_target") is None:
        return ""
    return f"worst batch p99 {_ms(entry['latency_p99_ms'])}; {entry['within_target']:.1%} within"


def no_worse(ours: dict[str, Any], peer: dict[str, Any]) -> str:
    """Whether dstream's p99 at the rate is at most the peer's: a peer that failed the target
    there is worse by the target's own measure."""
    ours_failed, peer_failed = ours.get("verdict", "ok") != "ok", peer["verdict"] != "ok"
    if peer_failed and not ours_failed:
        return "yes: the peer failed the target"
    p99s = ours.get("latency_p99_ms"), peer.get("latency_p99_ms")
    if None in p99s:  # a search trial of a run that kept no latency per trial
        return "both failed the target" if ours_failed else "no p99 to compare"
    difference = p99s[0] - p99s[1]
    lower = "lower" if difference <= 0 else f"{difference:,.0f} ms higher"
    if ours_failed:
        return f"{'both' if peer_failed else 'no: dstream'} failed the target here; its p99 {lower}"
    return "yes" if difference <= 0 else f"no: {lower}"


def goals_table(table: dict[str, Any]) -> list[str]:
    """The rate goals against one table: dstream's maximum over pyspark.streaming's, and the
    rate the goal asks of dstream against the ceiling measured while they were searched."""
    lines = [
        "| workload | variant | dstream | pyspark.streaming | dstream / pyspark.streaming "
        "| goal | goal rate | goal rate / ceiling |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for workload in WORKLOADS:
        rows = table.get(workload, {})
        for variant in VARIANTS:
            ours, peer = rows.get(f"dstream/{variant}"), rows.get(f"pyspark.streaming/{variant}")
            if not (ours and peer and ours["rate"]):
                continue
            if peer["rate"] is None:
                lines.append(
                    f"| {workload} | {variant} | {ours['rate']:,} | none ({peer['status']}) | "
                    f"no ratio: pyspark.streaming has no figure | {GOALS[workload]}x | | |"
                )
                continue
            goal_rate = GOALS[workload] * peer["rate"]
            ceiling = ours.get("ceiling")
            share = f"{goal_rate / ceiling['median']:.2f}" if ceiling else "not measured"
            lines.append(
                f"| {workload} | {variant} | {ours['rate']:,} | {peer['rate']:,} | "
                f"{ours['rate'] / peer['rate']:.2f}x | {GOALS[workload]}x | {goal_rate:,.0f} | "
                f"{share} |"
            )
    return lines


def recovery_table(recovery: dict[str, Any]) -> list[str]:
    if not recovery:
        return ["No recovery experiments in these results (run with `--no-recovery`)."]
    lines = [
        f"The fault after {recovery['batches_before']} batches; {recovery['batches_after']} "
        "batches ran after it.",
        "",
        "| system / variant | rate | fault | baseline delay | first batch after | peak delay "
        "| on schedule (within baseline + an interval) | back within 0.5 s of baseline |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system in SYSTEMS:
        entry = recovery.get(system)
        if entry is None:
            continue
        if "skipped" in entry:
            lines.append(f"| {system} | | skipped: {entry['skipped']} | | | | | |")
            continue
        for fault in FAULTS:
            r = entry[fault]
            name = f"{system}/{entry['variant']}"
            if "error" in r:
                lines.append(f"| {name} | {entry['rate']:,} | {fault} | {r['error']} | | | | |")
                continue
            lines.append(
                f"| {name} | {entry['rate']:,} | {fault} | {_ms(r['baseline_ms'])} | "
                f"{r.get('first_batch_after_s', 0):.1f} s | {_ms(r.get('peak_ms'))} | "
                f"{_seconds(r, 'on_schedule_s')} | {_seconds(r, 'recovery_s')} |"
            )
    return lines


def runs_list(runs: list[dict[str, Any]]) -> list[str]:
    return [
        f"  {n}. started {run['started']}, commit {run['commit']}: `{run['command']}`; "
        f"1-minute load at start {run['load_at_start'][0]:.2f}, at end "
        f"{run['load_at_end'][0]:.2f}"
        for n, run in enumerate(runs, 1)
    ]


NOTES = "## Notes"  # a results file's hand-written part, from this heading to its end


def kept_notes(path: Path) -> str:
    """The hand-written notes at the end of an earlier report of the day (a diagnosis measured
    by a tool, not by the run), which a later --merge run keeps."""
    if not path.exists():
        return ""
    earlier = path.read_text()
    at = earlier.find(f"\n{NOTES}\n")
    return "" if at < 0 else earlier[at:]


def plan_line(plan: Any) -> str:
    """The trials' lengths, in seconds: the same at any batch interval (`Plan.at_interval`)."""

    def seconds(batches: int) -> str:
        return f"{batches * plan.batch_ms / 1000:g} s"

    window = WINDOW_BATCHES * 1000 // plan.batch_ms
    full = plan.confirm_warmup + plan.confirm_measured - window + 1
    return (
        f"search trials: {seconds(plan.warmup)} of warm-up + {seconds(plan.measured)} measured; "
        f"confirmation: {seconds(plan.confirm_warmup)} + {seconds(plan.confirm_measured)} (the "
        f"{WINDOW_BATCHES} s window full for the last {seconds(full)} of it); "
        f"{plan.samples} batches' outputs checked per trial"
    )


def write_report(
    directory: Path,
    stamp: str,
    machine: dict[str, Any],
    runs: list[dict[str, Any]],
    tables: dict[str, Any],
    recovery: dict[str, Any],
    gate: Any,
    plan: Any,
    pending: list[str],
) -> Path:
    """The report of what the run has measured so far; `pending` names what it has not (yet).
    The figures (.json) are written first: a fault in rendering the text loses no measurement."""
    directory.mkdir(parents=True, exist_ok=True)
    raw = {
        "machine": machine,
        "runs": runs,
        "gate": asdict(gate),
        "plan": asdict(plan),
        "tables": tables,
        "recovery": recovery,
        "pending": pending,
    }
    (directory / f"{stamp}.json").write_text(json.dumps(raw, indent=1, default=str))
    text = [
        f"# Benchmark results, {stamp}",
        "",
        "Produced by `make bench` (`python -m bench`); method in bench/README.md.",
        "",
    ]
    if pending:
        text += [
            f"**Partial**: written while the run went on; not measured: {', '.join(pending)}.",
            "",
        ]
    text += [
        "## Machine and conditions",
        "",
        f"- {machine['cores']} cores ({machine['cpu']}), {machine['memory_gb']} GB memory, "
        f"{machine['os']}; Python {machine['python']}, PySpark {machine['pyspark']}, "
        f"{machine['java']}",
        "- runs (a row's `run` column names the one that measured it):",
        *runs_list(runs),
        "- the load gate redid a trial when other processes "
        f"used more than {gate.limit_cores} cores over {gate.block_s:.0f} s "
        f"(at most {gate.retries} redos, then 'machine busy')",
        "- every system: `local[2]`, 2 input partitions, 2 shuffle partitions, 1 s batches "
        "(rows marked `(N ms batches)`: N ms), the same 100-byte lines "
        "(`dstream.worker.textgen`'s pool, `bench/throughput/feed.py`); "
        "dstream and pyspark.streaming run the same program text "
        "(`bench/throughput/programs.py`)",
        f"- {plan_line(plan)}",
        "- ceiling (since run 11): what the DStream program's own functions, with the lines "
        "made, allow on two cores (`python -m bench.throughput ceiling`), measured before "
        "each round of the workload's trials; median and range over the search, and the "
        "maximum's share of the median",
        "",
        f"Grep counts the lines containing `{GREP_PATTERN}` per batch; WordCount counts words over "
        f"a {WINDOW_BATCHES} s window sliding every batch; TopK gives its 10 most frequent words. "
        "A max rate is given only when it passed a confirmation trial; figures are from that "
        "trial.",
        "",
    ]
    for daemon, table in tables.items():
        text += [f"## Throughput, every system on `{daemon}`", "", *throughput_table(table), ""]
        text += [
            "The rate goals on this table, dstream's maximum over pyspark.streaming's (a goal "
            "rate above the ceiling is beyond any engine running these programs on these "
            "cores):",
            "",
            *goals_table(table),
            "",
        ]
        comparisons = same_rate_table(table)
        if len(comparisons) > 2:
            text += [
                "Every peer's latency at dstream's rate: the peer's search trial that failed the "
                "target at or below it, or else a confirmation-length trial of the peer at the "
                "rate right after one of dstream's (whose figures then stand for dstream's):",
                "",
                *comparisons,
                "",
            ]
    daemon = recovery.get("daemon")
    text += [
        "## Recovery (WordCount" + (f", `{daemon}`, run {recovery.get('run')})" if daemon else ")"),
        "",
        *(["Not run yet."] if "recovery" in pending else recovery_table(recovery)),
        "",
    ]
    path = directory / f"{stamp}.md"
    path.write_text("\n".join(text) + kept_notes(path))
    return path


def load_report(directory: Path, stamp: str) -> dict[str, Any] | None:
    """The day's results as written (None: nothing yet), for a run that adds to them."""
    path = directory / f"{stamp}.json"
    return json.loads(path.read_text()) if path.exists() else None
