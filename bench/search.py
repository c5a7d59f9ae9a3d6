"""Searching for the maximum sustainable rate with few trials.

Processing time grows about linearly with the batch's records (p = a + b * rate), and a trial
measures p even when the rate is not sustainable. So each next rate is where the line through
the trials so far predicts `target` processing time, kept inside the bracket (highest passing
rate, lowest failing rate) and bisected when the line points outside it. The search ends when the
bracket is narrower than `tolerance` or the trials are used up; a confirmation run over more
batches then checks the answer and steps down until it holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.trial import INTERVAL_MS, Verdict


@dataclass
class Trial:
    rate: int
    verdict: Verdict
    confirmation: bool = False


@dataclass
class SearchResult:
    rate: int  # highest rate that passed (0: none)
    trials: list[Trial] = field(default_factory=list)
    confirmed: bool = False


TARGET_MS = 0.85 * INTERVAL_MS


def _predict(trials: list[Trial]) -> int | None:
    """The rate at which the least-squares line through the trials reaches TARGET_MS."""
    points = [(t.rate, t.verdict.processing_p50_ms) for t in trials if t.verdict.processing_p50_ms]
    if not points:
        return None
    if len({r for r, _ in points}) < 2:
        rate, processing = points[-1]
        overhead = min(100.0, processing / 2)  # a guess of the fixed per-batch cost
        return round(rate * (TARGET_MS - overhead) / max(1.0, processing - overhead))
    mean_r = sum(r for r, _ in points) / len(points)
    mean_p = sum(p for _, p in points) / len(points)
    slope = sum((r - mean_r) * (p - mean_p) for r, p in points) / sum(
        (r - mean_r) ** 2 for r, _ in points
    )
    if slope <= 0:
        return None
    return round(mean_r + (TARGET_MS - mean_p) / slope)


def _round(rate: float) -> int:
    """Rates with two significant digits, so trial rates read well in the results."""
    digits = max(0, int(math.log10(max(rate, 1))) - 1)
    return max(100, int(round(rate, -digits)))


def find_max_rate(
    run: Callable[[int, bool], Verdict],
    start: int,
    max_trials: int,
    tolerance: float,
    confirm: bool,
) -> SearchResult:
    """The highest sustainable rate; `run(rate, confirmation)` runs one trial."""
    result = SearchResult(0)
    low, high = 0, None
    rate = start
    for _ in range(max_trials):
        verdict = run(rate, False)
        result.trials.append(Trial(rate, verdict))
        if verdict.sustainable:
            low = max(low, rate)
        else:
            high = rate if high is None else min(high, rate)
        if high is not None and low and high / low <= 1 + tolerance:
            break
        guess = _predict(result.trials)
        lower_bound = low if low else rate / 8
        upper_bound = high if high is not None else rate * 4
        if guess is None:
            guess = math.sqrt(lower_bound * upper_bound) if high is not None else rate * 2
        else:  # the line overshoots a bracket end: step inside it instead
            guess = min(max(guess, lower_bound * (1 + tolerance)), upper_bound / (1 + tolerance))
        if high is not None and low:  # stay off the bracket's ends so the bracket shrinks
            guess = min(max(guess, low * (1 + tolerance / 2)), high / (1 + tolerance / 2))
        rate = _round(guess)
        if rate == low or rate == high:
            break
    result.rate = low
    if confirm and low:
        for _ in range(3):
            verdict = run(result.rate, True)
            result.trials.append(Trial(result.rate, verdict, confirmation=True))
            if verdict.sustainable:
                result.confirmed = True
                break
            result.rate = _round(result.rate * 0.9)
    return result
