"""bench/results/<date>.md, <date>.json and PNG plots from one full run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.systems import PATTERN, SYSTEMS, WINDOW_S, WORKLOADS

# The D-Stream paper's per-core throughput (records/s per core, 100-byte records).
PAPER_PER_CORE = {"grep": 160_000, "wordcount": 62_000, "topk": 62_000}


def _fmt(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}{unit}"


def throughput_table(table: dict[str, Any], cores: int) -> list[str]:
    lines = [
        "| workload | system | max sustainable rate (rec/s) | per core | vs paper/core | "
        "dstream / this | confirmed over 30+ batches | 1-min load during its trials |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for workload in WORKLOADS:
        rows = table.get(workload, {})
        ours = rows.get("dstream", {}).get("rate")
        for system in SYSTEMS:
            row = rows.get(system)
            if row is None:
                continue
            rate = row.get("rate") or 0
            per_core = rate / cores
            ratio = ours / rate if ours and rate else None
            lines.append(
                f"| {workload} | {system} | {rate:,} | {per_core:,.0f} | "
                f"{per_core / PAPER_PER_CORE[workload]:.2f}x | {_fmt(ratio, 'x', 2)} | "
                f"{'yes' if row.get('confirmed') else 'no'} | {_load_range(row.get('loads'))} |"
            )
    return lines


def _load_range(loads: list[float] | None) -> str:
    return f"{min(loads):.1f} to {max(loads):.1f}" if loads else "not recorded"


def latency_table(table: dict[str, Any]) -> list[str]:
    lines = [
        "| workload | system | rate (half the max) | p50 latency | p99 latency | "
        "peak driver RSS | peak executor RSS |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for workload in WORKLOADS:
        for system in SYSTEMS:
            row = table.get(workload, {}).get(system)
            if row is None or "p50_ms" not in row:
                continue
            memory = row.get("memory_mb", {})
            lines.append(
                f"| {workload} | {system} | {row['latency_rate']:,} | "
                f"{row['p50_ms'] / 1000:.2f} s | {row['p99_ms'] / 1000:.2f} s | "
                f"{_fmt(memory.get('driver'), ' MB')} | {_fmt(memory.get('executor'), ' MB')} |"
            )
    return lines


def recovery_table(recovery: dict[str, Any]) -> list[str]:
    if not recovery:
        return ["Recovery experiments were skipped in this run."]
    lines = [
        f"WordCount at {recovery['rate']:,} records/s (half the lowest WordCount maximum, at least 1,000).",
        "",
        "| system | fault | baseline delay | first batch after fault | peak delay | "
        "back to baseline after |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for system in SYSTEMS:
        for fault in ("executor", "driver"):
            result = recovery.get(system, {}).get(fault)
            if result is None:
                continue
            if "error" in result:
                lines.append(f"| {system} | {fault} | {result['error']} | | | |")
                continue
            back = result.get("recovery_s")
            lines.append(
                f"| {system} | {fault} | {result['baseline_ms'] / 1000:.2f} s | "
                f"{_fmt(result.get('first_batch_after_s'), ' s', 1)} | "
                f"{_fmt(result.get('peak_ms', 0) / 1000, ' s', 1)} | "
                f"{_fmt(back, ' s', 1) if back is not None else 'not within the run'} |"
            )
    return lines


def plot_throughput(path: Path, table: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.25
    for i, system in enumerate(SYSTEMS):
        rates = [table.get(w, {}).get(system, {}).get("rate", 0) / 1000 for w in WORKLOADS]
        ax.bar([x + (i - 1) * width for x in range(len(WORKLOADS))], rates, width, label=system)
    ax.set_xticks(range(len(WORKLOADS)), WORKLOADS)
    ax.set_ylabel("max sustainable rate (k records/s)")
    ax.set_title("Throughput at 1 s batches")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(path: Path, table: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.25
    for i, system in enumerate(SYSTEMS):
        rows = [table.get(w, {}).get(system, {}) for w in WORKLOADS]
        p50 = [r.get("p50_ms", 0) / 1000 for r in rows]
        p99 = [r.get("p99_ms", 0) / 1000 for r in rows]
        xs = [x + (i - 1) * width for x in range(len(WORKLOADS))]
        bars = ax.bar(xs, p99, width, alpha=0.35)
        ax.bar(xs, p50, width, color=bars.patches[0].get_facecolor()[:3], label=system)
    ax.set_xticks(range(len(WORKLOADS)), WORKLOADS)
    ax.set_ylabel("end-to-end latency (s): p50 solid, p99 light")
    ax.set_title("Latency at half the maximum rate")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_trials(path: Path, runs: dict[str, Any]) -> None:
    """Processing time against rate for every trial: the search's raw data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(12, 3.8))
    for ax, workload in zip(axes, WORKLOADS, strict=True):
        for system in SYSTEMS:
            trials = [
                e
                for e in runs.get(system, {}).get("events", [])
                if e["event"] == "trial" and e["workload"] == workload
            ]
            ax.scatter(
                [t["rate"] / 1000 for t in trials],
                [t["processing_p50_ms"] / 1000 for t in trials],
                label=system,
                s=18,
            )
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(workload)
        ax.set_xlabel("rate (k records/s)")
    axes[0].set_ylabel("median processing time (s)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_recovery(path: Path, recovery: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=False)
    for ax, fault in zip(axes, ("executor", "driver"), strict=True):
        for system in SYSTEMS:
            result = recovery.get(system, {}).get(fault, {})
            timeline = result.get("timeline", [])
            ax.plot(
                [p["t_s"] for p in timeline],
                [p["delay_ms"] / 1000 for p in timeline],
                marker=".",
                label=system,
            )
        ax.axvline(0, color="red", linewidth=0.8)
        ax.set_title(f"{fault} killed at t = 0")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("batch delay (s)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    directory: Path,
    stamp: str,
    machine: dict[str, Any],
    table: dict[str, Any],
    runs: dict[str, Any],
    recovery: dict[str, Any],
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    plots = {
        "throughput": f"{stamp}-throughput.png",
        "latency": f"{stamp}-latency.png",
        "trials": f"{stamp}-trials.png",
        "recovery": f"{stamp}-recovery.png",
    }
    plot_throughput(directory / plots["throughput"], table)
    plot_latency(directory / plots["latency"], table)
    plot_trials(directory / plots["trials"], runs)
    if recovery:
        plot_recovery(directory / plots["recovery"], recovery)
    cores = int(machine.get("cores") or 1)
    before, after = machine["load_before"], machine["load_after"]
    text = [
        f"# Benchmark results, {stamp}",
        "",
        "Produced by `make bench` (`python -m bench`); method in bench/README.md.",
        "",
        "## Machine",
        "",
        f"- {machine['cores']} cores ({machine['cpu']}), {machine['memory_gb']} GB memory, "
        f"{machine['os']}",
        f"- Python {machine['python']}, PySpark {machine['pyspark']}, {machine['java']}",
        f"- load average (1, 5, 15 min) before: {before[0]:.2f}, {before[1]:.2f}, "
        f"{before[2]:.2f}; after: {after[0]:.2f}, {after[1]:.2f}, {after[2]:.2f}",
        "- Spark local[2], 2 input partitions and 2 shuffle partitions for every system",
        "",
        "## Throughput",
        "",
        f"Grep counts lines containing `{PATTERN}`; WordCount counts words over a {WINDOW_S} s "
        "window sliding every 1 s; TopK gives the 10 most frequent words of the last "
        f"{WINDOW_S} s every second. 1 s batches, 100-byte records.",
        "",
        *throughput_table(table, cores),
        "",
        f"![throughput]({plots['throughput']})",
        "",
        f"![trials]({plots['trials']})",
        "",
        "## Latency and memory",
        "",
        *latency_table(table),
        "",
        f"![latency]({plots['latency']})",
        "",
        "## Recovery",
        "",
        *recovery_table(recovery),
        "",
    ]
    if recovery:
        text += [f"![recovery]({plots['recovery']})", ""]
    path = directory / f"{stamp}.md"
    path.write_text("\n".join(text))
    raw = {"machine": machine, "table": table, "recovery": recovery, "runs": runs}
    (directory / f"{stamp}.json").write_text(json.dumps(raw, indent=1, default=str))
    return path
