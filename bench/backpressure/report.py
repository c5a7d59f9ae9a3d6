"""The overload-step results: a JSON file of every batch, a markdown summary and the PNG curves."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

from bench.machine import describe_machine

SETTLE_LIMIT = "2 intervals"
QUIET_OTHER_CORES = 0.25
TRANSIENT_S = 5  # admitted rate in overload: batches from this long after the step on


def events_of(result: dict[str, Any], kind: str) -> dict[str, Any] | None:
    found = [e for e in result["events"] if e["event"] == kind]
    return found[-1] if found else None


def summarize(system: str, result: dict[str, Any]) -> dict[str, Any]:
    """The figures of one system's run (None where the run did not get that far)."""
    calibration = events_of(result, "calibration")
    run = events_of(result, "run")
    step = events_of(result, "step")
    summary: dict[str, Any] = {"system": system, "calibration": calibration, "step": step}
    load = result["load"]
    if load:
        summary["load1"] = (min(s["load1"] for s in load), max(s["load1"] for s in load))
        others = [s["other_cores"] for s in load]
        summary["other_cores"] = (sum(others) / len(others), max(others))
    if run is None or step is None:
        summary["problems"] = ["the run did not complete (see the worker's log)"]
        return summary
    step_s, stopped_s = run["step_s"], run["stopped_s"]
    batches = run["batches"]
    overload = [b for b in batches if b["time_s"] >= step_s + TRANSIENT_S]
    admitted = sum(b["records"] for b in overload)
    span = (overload[-1]["time_s"] - overload[0]["time_s"] + 1) if overload else 0
    after = [b for b in batches if b["time_s"] >= step_s]
    delays = [b["scheduling_s"] for b in after] + [d for _t, d in run["pending"]]
    summary.update(
        problems=run["problems"],
        settle_s=run["settle_s"],
        window_s=round(stopped_s - step_s),
        admitted_rate=admitted / span if span else 0.0,
        peak_delay_s=max(delays, default=0.0),
        peak_processing_s=max((b["processing_s"] for b in after), default=0.0),
        coalesced=sum(b["coalesced"] for b in batches),
        unstarted=len(run["pending"]),
        waiting_at_source=run["offered_total"] - sum(b["records"] for b in batches),
    )
    if "sent" in (batches[0] if batches else {}):
        summary["fed_rate"] = peak_feed_rate(batches)
    return summary


def peak_feed_rate(batches: list[dict[str, Any]]) -> float:
    """The fastest the socket server's sending went between two batch completions, per second."""
    best = 0.0
    for a, b in zip(batches, batches[1:], strict=False):
        span = b["time_s"] - a["time_s"]
        if span > 0:
            best = max(best, (b["sent"] - a["sent"]) / span)
    return best


def not_measured(summary: dict[str, Any], interval_s: float) -> str:
    calibration = summary.get("calibration")
    if calibration is not None and calibration["fixed_s"] >= interval_s:
        return (
            f"none: a batch costs {calibration['fixed_s']:.2f} s whatever its size, "
            f"more than the {interval_s:g} s interval"
        )
    return "not measured (see the worker's log)"


def settle_text(summary: dict[str, Any]) -> str:
    if summary.get("problems"):
        return "no figure: " + "; ".join(summary["problems"])
    if summary.get("settle_s") is None:
        return f"never within {summary['window_s']} s"
    return f"{summary['settle_s']:.0f} s"


def shared_text(summaries: list[dict[str, Any]]) -> str:
    """What the load samples say about the machine, in one line."""
    busiest = max((s.get("other_cores", (0.0, 0.0))[0] for s in summaries), default=0.0)
    if busiest < QUIET_OTHER_CORES:
        return (
            f"- Quiet: other processes used under {QUIET_OTHER_CORES} cores on average during "
            "each run."
        )
    return (
        f"- **Shared**: other processes used up to {busiest:.2f} cores on average during a "
        "run (below); the figures are this machine at that moment, not a quiet machine's."
    )


def markdown(results: dict[str, Any], summaries: list[dict[str, Any]], png: str) -> str:
    machine = results["machine"]
    lines = [
        f"# Backpressure through an overload step, {results['date']}",
        "",
        f"Produced by `{results['command']}`; method "
        "in bench/README.md. Each system's offered rate steps from 0.3x to 10x the rate it "
        f"sustains, measured by a calibration in the same run. Batch interval: "
        f"{results['interval_s']:g} s for both.",
        "",
        "## Machine",
        "",
        f"- {machine['cores']} cores ({machine['cpu']}), {machine['memory_gb']} GB memory, "
        f"{machine['os']}",
        f"- Python {machine['python']}, PySpark {machine['pyspark']}, {machine['java']}",
        shared_text(summaries),
        "",
        "| system | 1-min load during its run | cores used by other processes (mean, max) |",
        "| --- | --- | --- |",
    ]
    for s in summaries:
        load = s.get("load1", (0, 0))
        other = s.get("other_cores", (0, 0))
        lines.append(
            f"| {s['system']} | {load[0]:.1f} to {load[1]:.1f} | {other[0]:.2f}, {other[1]:.2f} |"
        )
    lines += [
        "",
        "## Figures",
        "",
        f"Settled: the first batch after the step from which every scheduling delay stays under "
        f"{SETTLE_LIMIT} (batches due but not started at the end count with the delay they had "
        "reached). Admitted rate: records per second of the batches from "
        f"{TRANSIENT_S} s after the step on.",
        "",
        "| system | sustainable (calibrated) | 0.3x / 10x offered | settled after the step "
        "| admitted in overload | peak delay after the step | output check |",
        "| --- | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for s in summaries:
        calibration, step = s.get("calibration"), s.get("step")
        if calibration is None or step is None:
            lines.append(f"| {s['system']} | {not_measured(s, results['interval_s'])} | | | | | |")
            continue
        sustainable = calibration["sustainable"]
        check = "passed" if not s["problems"] else "FAILED: " + "; ".join(s["problems"])
        lines.append(
            f"| {s['system']} | {sustainable:,.0f}/s | {step['low']:,.0f} / {step['high']:,.0f}/s "
            f"| {settle_text(s)} | {s['admitted_rate']:,.0f}/s "
            f"({s['admitted_rate'] / sustainable:.2f}x) | {s['peak_delay_s']:.1f} s | {check} |"
        )
    lines += ["", "Details:", ""]
    for s in summaries:
        calibration = s.get("calibration")
        if calibration is None or "window_s" not in s:
            continue
        detail = (
            f"- {s['system']}: calibration fixed cost {calibration['fixed_s']:.2f} s per batch, "
            f"{calibration['per_record_s'] * 1e6:.2f} µs per record; peak processing time after "
            f"the step {s['peak_processing_s']:.1f} s; "
            f"{s['waiting_at_source']:,} offered records not admitted at the end"
        )
        if s["coalesced"]:
            detail += f"; {s['coalesced']} batch times coalesced into later batches"
        if s["unstarted"]:
            detail += f"; {s['unstarted']} batch times due but not started at the end"
        if "fed_rate" in s:
            detail += (
                f"; the socket server fed the receiver at up to {s['fed_rate']:,.0f} lines/s "
                f"(10x offered: {s['step']['high']:,.0f}/s)"
            )
        lines.append(detail + ".")
    lines += ["", f"![overload step]({png})", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], systems: list[str], path: Path) -> None:
    """Offered, admitted and limit rates, processing time and scheduling delay against the
    seconds since the step: one column per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(3, len(systems), figsize=(6 * len(systems), 8), squeeze=False)
    for column, system in enumerate(systems):
        run = events_of(results["systems"][system], "run")
        rates, processing, delay = axes[:, column]
        rates.set_title(system)
        if run is None:
            for ax in axes[:, column]:
                ax.set_axis_off()
            rates.text(
                0.5, 0.5, "no step run (see the results)", ha="center", transform=rates.transAxes
            )
            continue
        step_s = run["step_s"]
        batches = run["batches"]
        x = [b["time_s"] - step_s for b in batches]
        rates.step(x, [b["offered"] for b in batches], where="pre", label="offered")
        rates.step(x, [b["records"] for b in batches], where="pre", label="admitted")
        limits = [(xi, b["rate_limit"]) for xi, b in zip(x, batches, strict=True)]
        limits = [(xi, r) for xi, r in limits if r is not None]
        if limits:
            rates.plot(*zip(*limits, strict=True), "k:", label="rate limit")
        rates.set_yscale("log")
        rates.set_ylabel("records/s")
        rates.legend(loc="lower right", fontsize="small")
        processing.plot(x, [b["processing_s"] for b in batches], ".-")
        processing.set_ylabel("processing time (s)")
        pending = [(t - step_s, d) for t, d in run["pending"]]
        delay.plot(x, [b["scheduling_s"] for b in batches], ".-", label="scheduling delay")
        if pending:
            delay.plot(*zip(*pending, strict=True), "rx", label="due, not started")
        delay.axhline(2 * results["interval_s"], color="grey", linestyle="--", label="2 intervals")
        delay.set_ylabel("scheduling delay (s)")
        delay.set_xlabel("seconds since the step to 10x")
        delay.legend(loc="upper right", fontsize="small")
        for ax in axes[:, column]:
            ax.axvline(0, color="red", linewidth=0.8)
            ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_report(results: dict[str, Any], out: Path, docs_png: Path | None) -> Path:
    """Write backpressure-<date>.{json,md,png} under `out` (and dstream's plot to docs_png)."""
    out.mkdir(parents=True, exist_ok=True)
    results["machine"] = describe_machine()
    results["date"] = date.today().isoformat()
    stem = out / f"backpressure-{results['date']}"
    systems = list(results["systems"])
    summaries = [summarize(system, results["systems"][system]) for system in systems]
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1))
    png = stem.with_suffix(".png")
    plot(results, systems, png)
    if docs_png is not None and "dstream" in systems:
        plot(results, ["dstream"], docs_png)
    stem.with_suffix(".md").write_text(markdown(results, summaries, png.name))
    return stem.with_suffix(".md")
