"""`python -m bench.throughput ceiling`: the highest rate any DStream engine could sustain on
this machine.

Whatever an engine does about jobs, shuffles and checkpoints, each batch's lines must be made and
the user's functions run on every one of them, on the cores the job has. This runs only that:
each `programs` program, built unchanged on `OnePartition`, which applies the DStream
operations to one partition's lines in plain Python with nothing around them (a windowed
reduction is its least work, the batch's pairs reduced by key with the user's function in one
dict; the window's add and subtract over distinct words, the shuffle and the output digest are
left out). Timed on one core, with the garbage collector off (what collections cost depends on
the process's heap, not the program), in two labelled parts: the rate source's Python line
generator making the lines (`textgen.lines`, which the engines' input tasks run too, and which a
JVM-native source would not cost), then the user's functions on the made lines. The table gives
both ceilings: the user's functions alone, and the generator plus the functions (what an engine
reading the rate source must fit in). With C cores and 1 s batches, no engine can sustain much
more than C x (lines per second of one core). It is an estimate, not a bound to the last
percent: Spark's Python workers ran the tuned programs a few percent faster than this process
does (on 2026-11-24 the tuned TopK's measured maximum was 4% above its ceiling), so a goal is
out of reach only when it is well above the ceiling.

Beside each ceiling it prints the day's measured maxima and the rate goals (dstream 2x
pyspark.streaming's rate on WordCount and TopK, 1.5x on Grep), so whether a goal is reachable
on the same program and workers is a measurement, not an opinion. The ceiling has varied by a
quarter between hours on the same machine, so `make bench` also measures it between the rounds
of its trials (`ceiling_rate`) and reports each maximum against the ceiling of its own search.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from bench.common import ENGINES, RECORD_BYTES, RESULTS, SEED, textgen
from bench.throughput import programs

GOALS = {
    "grep": 1.5,
    "grep-jvm": 1.5,
    "wordcount": 2.0,
    "topk": 2.0,
}  # dstream's rate over pyspark.streaming's


class OnePartition:
    """One partition of one batch under the DStream operations `programs` uses, each doing
    no more than calling the user's functions; the output operation hands the records to
    `outputs` instead of the user's function (the digest runs once per batch on the driver)."""

    def __init__(self, records: Iterable[Any], outputs: list[list[Any]]) -> None:
        self._records = records
        self._outputs = outputs

    def _then(self, records: Iterable[Any]) -> OnePartition:
        return OnePartition(records, self._outputs)

    def map(self, f: Callable[[Any], Any]) -> OnePartition:
        return self._then(map(f, self._records))

    def flatMap(self, f: Callable[[Any], Iterable[Any]]) -> OnePartition:
        return self._then(chain.from_iterable(map(f, self._records)))

    def filter(self, f: Callable[[Any], bool]) -> OnePartition:
        return self._then(filter(f, self._records))

    def mapPartitions(self, f: Callable[[Iterable[Any]], Iterable[Any]]) -> OnePartition:
        return self._then(f(self._records))

    def count(self) -> OnePartition:
        return self._then([sum(1 for _ in self._records)])

    def reduce(self, f: Callable[[Any, Any], Any]) -> OnePartition:
        return self._then([functools.reduce(f, self._records)])

    def reduceByKeyAndWindow(
        self, func: Callable[[Any, Any], Any], invFunc: Any, *window: Any, **options: Any
    ) -> OnePartition:
        reduced: dict[Any, Any] = {}
        for key, value in self._records:
            try:
                combined = reduced[key]
            except KeyError:
                reduced[key] = value
            else:
                reduced[key] = func(combined, value)
        return self._then(reduced.items())

    def foreachRDD(self, _output: Any) -> None:
        self._outputs.append(list(self._records))


def partition_output(workload: str, variant: str, lines: Iterable[str]) -> list[Any]:
    """What the program's output operation receives for one partition of `lines`."""
    outputs: list[list[Any]] = []
    programs.build(workload, variant, OnePartition(lines, outputs))
    (records,) = outputs
    return records


@dataclass(frozen=True)
class CoreTimes:
    """Seconds one core spends per line, in two labelled parts: the rate source's Python line
    generator (`textgen.lines`) making it, and the user's functions run on the made line."""

    generator_s: float
    functions_s: float

    @property
    def total_s(self) -> float:
        return self.generator_s + self.functions_s


def time_per_line(workload: str, variant: str, lines: int, rounds: int) -> CoreTimes:
    """The least time, over `rounds`, one core took to make the lines, and separately to run the
    program on the made lines (each part's best round)."""
    make = textgen.lines
    generator = functions = float("inf")
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            made = make(SEED, RECORD_BYTES, 0, 10**6, 10**6 + lines)
            made_at = time.perf_counter()
            partition_output(workload, variant, made)
            done = time.perf_counter()
        finally:
            gc.enable()
        generator = min(generator, made_at - start)
        functions = min(functions, done - made_at)
    return CoreTimes(generator / lines, functions / lines)


def ceiling_rate(workload: str, variant: str, cores: int, lines: int, rounds: int) -> float:
    """Lines per second that `cores` cores could at most make and give the program, as measured
    now (the line generator's time and the user's functions' together)."""
    return cores / time_per_line(workload, variant, lines, rounds).total_s


def newest_results() -> Path | None:
    dated = sorted(RESULTS.glob("[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9].json"))
    return dated[-1] if dated else None


def measured_maxima(path: Path | None, daemon: str) -> dict[tuple[str, str, str], int | None]:
    """(workload, system, variant) -> the confirmed maximum in the results at `path`."""
    if path is None:
        return {}
    table = json.loads(path.read_text())["tables"].get(daemon, {})
    return {
        (workload, *key.split("/")): row["rate"] if row["status"] == "confirmed" else None
        for workload, rows in table.items()
        for key, row in rows.items()
    }


def _rate(value: float | None) -> str:
    return "none" if value is None else f"{value:,.0f}"


def ceiling_table(
    cores: int, lines: int, rounds: int, maxima: dict[tuple[str, str, str], int | None]
) -> Iterator[str]:
    """The table's lines: per program, one core's time per 100,000 lines for making them and
    for the user's functions, each labelled, and the ceilings on `cores` cores with and
    without the generator."""
    yield (
        "| workload | variant | one core, s per 100,000 lines: line generator | one core: user's "
        f"functions | ceiling on {cores} cores, lines/s: user's functions alone | ceiling: "
        "line generator + user's functions | dstream max | pyspark.streaming max | goal "
        "| goal / ceiling (generator + functions) |"
    )
    yield "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for workload in programs.WORKLOADS:
        if workload in programs.JVM_LINES:
            continue  # its lines come from the JVM: no Python generator to time
        for variant in programs.VARIANTS:
            times = time_per_line(workload, variant, lines, rounds)
            ceiling = cores / times.total_s
            ours, peer = (maxima.get((workload, e, variant)) for e in ENGINES)
            goal = GOALS[workload] * peer if peer else None
            share = f"{goal / ceiling:.2f}" if goal else "n/a"
            yield (
                f"| {workload} | {variant} | {100_000 * times.generator_s:.3f} | "
                f"{100_000 * times.functions_s:.3f} | {_rate(cores / times.functions_s)} | "
                f"{_rate(ceiling)} | {_rate(ours)} | {_rate(peer)} | {_rate(goal)} | {share} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cores", type=int, default=2, help="the benchmark's local[N]")
    parser.add_argument("--lines", type=int, default=200_000, help="lines per timed round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", type=Path, default=newest_results())
    parser.add_argument("--daemon", default="dstream.worker.pydaemon", help="which table's maxima")
    args = parser.parse_args(argv)
    maxima = measured_maxima(args.results, args.daemon)
    textgen.line_pool(SEED, RECORD_BYTES)
    print(f"measured maxima: {args.results} ({args.daemon}); one core, best of {args.rounds}")
    for line in ceiling_table(args.cores, args.lines, args.rounds, maxima):
        print(line, flush=True)
    return 0
