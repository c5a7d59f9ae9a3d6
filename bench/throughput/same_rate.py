"""Every peer's latency at dstream's published rate: the paper's comparison at one rate.

A highest rate within the latency target says little of two systems' latencies where both
sustain a rate: on a stateless program both may pass at dstream's rate, one with the lower
p99. So after a workload's searches, at each dstream row's confirmed rate, every peer row of
the same program (`same_program`) and the same batch interval (and source and master) is
settled one of two ways:

- its own search already failed the target at or below that rate, and its confirmed rate is
  below it: that failed trial is its answer, named with its reason;
- otherwise it runs a confirmation-length trial at the rate, right after one of dstream's at
  the same rate, so the two figures come from the same minutes of the machine.

The comparison is written into the dstream row (`at_this_rate`, by row name), and the report
sets each peer's p99 against dstream's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.throughput.programs import VARIANTS
from bench.throughput.trial import BUSY, OK, latency_target_ms, measured_latency

OURS = "dstream"


@dataclass
class Comparison:
    """The trials one dstream rate needs: dstream's own (`ours`) first, then `peers` in order;
    `settled` holds the peers whose search answered already."""

    ours: tuple[str, str]
    rate: int
    peers: list[tuple[str, str]] = field(default_factory=list)
    settled: dict[str, dict[str, Any]] = field(default_factory=dict)


def row_name(pair: tuple[str, str], suffix: str) -> str:
    return f"{pair[0]}/{pair[1]}{suffix}"


def same_program(ours: tuple[str, str], peer: tuple[str, str]) -> bool:
    """pyspark.streaming runs dstream's program text, so it compares in the same variant; a
    system with formulations of its own (Structured Streaming) compares in each of them."""
    return peer[1] == ours[1] or peer[1] not in VARIANTS


def failed_at_or_below(row: dict[str, Any], rate: int) -> dict[str, Any] | None:
    """The row's highest-rate trial at or below `rate` that failed (not for a busy machine),
    when the row has no confirmed rate at or above `rate`; None: the peer must be run there."""
    if row.get("rate") is not None and row["rate"] >= rate:
        return None
    failed = [
        t for t in row.get("trials", []) if t["rate"] <= rate and t["verdict"] not in (OK, BUSY)
    ]
    return max(failed, key=lambda t: t["rate"]) if failed else None


def plan_comparisons(
    rows: dict[str, dict[str, Any]], pairs: list[tuple[str, str]], suffix: str
) -> list[Comparison]:
    """One comparison per confirmed dstream row among `pairs` (the systems this run has
    workers for) that has a peer row to compare with."""
    comparisons = []
    for ours in pairs:
        row = rows.get(row_name(ours, suffix))
        if ours[0] != OURS or row is None or row.get("status") != "confirmed":
            continue
        comparison = Comparison(ours, row["rate"])
        for peer in pairs:
            peer_row = rows.get(row_name(peer, suffix))
            if peer[0] == OURS or peer_row is None or not same_program(ours, peer):
                continue
            failed = failed_at_or_below(peer_row, comparison.rate)
            if failed is None:
                comparison.peers.append(peer)
            else:
                comparison.settled[row_name(peer, suffix)] = {
                    "source": "search",
                    "rate": failed["rate"],
                    "verdict": failed["verdict"],
                    "reason": failed["reason"],
                    **{k: failed.get(k) for k in ("latency_p99_ms", "within_target")},
                    **({"run": peer_row["run"]} if "run" in peer_row else {}),
                }
        if comparison.peers or comparison.settled:
            comparisons.append(comparison)
    return comparisons


def trial_figures(event: dict[str, Any]) -> dict[str, Any]:
    """What a comparison keeps of one trial at the rate: its verdict, latency and load."""
    verdict = event["verdict"]
    return {
        "source": "trial",
        "rate": event["rate"],
        "verdict": verdict["kind"],
        "reason": verdict["reason"],
        "processing_p50_ms": verdict["processing_p50_ms"],
        "processing_p90_ms": verdict["processing_p90_ms"],
        **measured_latency(
            event.get("batches", []), latency_target_ms(event.get("batch_ms", 1000))
        ),
        **{k: event.get(k) for k in ("seconds", "attempt", "load")},
    }
