"""Helpers of the fault suite: jobs to run in real `dstream run` processes (running_driver.Driver)
and kill, and the exact reference. The reference output is computed without the engine:
with backpressure off, batch k of a rate source holds exactly the offsets that became available
in ((k-1)B, kB], so every batch's expected word counts are known in advance (`dstream.worker.textgen`
gives the lines); for input arriving from outside, a batch's input is the range its record in
the batch log names (`BatchLogWatch`), read back from the input itself. `judge` compares every
committed batch with its input's word counts either way.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest
import yaml
from conditions import eventually
from dstream.worker import textgen


@dataclass
class FaultJob:
    """A faultapp job with backpressure off, written as a StreamingJob file: every batch time is
    a batch (none is coalesced into a later one), so the reference goes batch by batch.
    Subclasses say where the input comes from (`source`); the sink is the files sink under
    `out` unless they say otherwise (`sink`)."""

    root: Path
    batch_s: int = 2
    window_s: int = 10  # 5 batches: the incremental (add entering, subtract leaving) path
    checkpoint_interval_s: int = 4
    parallelism: int = 1  # shuffle partitions: few tasks, as the suite shares 2 cores
    task_sleep_s: float = 0
    output_sleep_s: float = 0
    record_micros: float = 0
    reads_log: Path | None = None  # where faultapp notes every input partition it computes
    extra_spec: dict[str, Any] = field(default_factory=dict)

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def manifest(self) -> Path:
        return self.root / "job.yaml"

    @property
    def window_batches(self) -> int:
        return self.window_s // self.batch_s

    def source(self) -> dict[str, Any]:
        """The spec's `source` block."""
        raise NotImplementedError

    def sink(self) -> dict[str, Any]:
        """The spec's `sink` block."""
        return {"type": "files", "files": {"path": str(self.out)}}

    def write(self) -> Path:
        spec: dict[str, Any] = {
            "batchInterval": f"{self.batch_s}s",
            "app": {
                "module": "faultapp:build",
                "args": {
                    "window": self.window_s,
                    "taskSleepSeconds": self.task_sleep_s,
                    "outputSleepSeconds": self.output_sleep_s,
                    "recordMicros": self.record_micros,
                    "readsLog": str(self.reads_log) if self.reads_log else None,
                },
            },
            "source": self.source(),
            "sink": self.sink(),
            "checkpoint": {
                "path": str(self.checkpoint),
                "interval": f"{self.checkpoint_interval_s}s",
            },
            "backpressure": {"enabled": False},
            "sparkConf": {"spark.default.parallelism": str(self.parallelism)},
            **self.extra_spec,
        }
        document = {
            "apiVersion": "dstream.dev/v1alpha1",
            "kind": "StreamingJob",
            "metadata": {"name": "faultapp"},
            "spec": spec,
        }
        self.root.mkdir(parents=True, exist_ok=True)
        self.manifest.write_text(yaml.safe_dump(document))
        return self.manifest


@dataclass
class RateJob(FaultJob):
    """A faultapp job on a rate source: its input is a pure function of time, so the reference
    needs nothing but the job's settings (verify)."""

    rate: int = 100
    partitions: int = 2
    seed: int = 11
    record_bytes: int = 60

    def source(self) -> dict[str, Any]:
        return {
            "type": "rate",
            "rate": {
                "recordsPerSecond": self.rate,
                "partitions": self.partitions,
                "seed": self.seed,
                "recordBytes": self.record_bytes,
            },
        }


def executor_pids(pgid: int) -> dict[int, str]:
    """Spark executor JVMs in a process group (local-cluster mode), with their --app-id."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            in_group = os.getpgid(int(entry.name)) == pgid
        except (OSError, ProcessLookupError):
            continue
        if in_group and b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in argv:
            found[int(entry.name)] = argv[argv.index(b"--app-id") + 1].decode()
    return found


# -- the reference ---------------------------------------------------------------------------


def available(job: RateJob, elapsed_ms: int) -> list[int]:
    """Offsets per partition the rate source has made available `elapsed_ms` after zero time."""
    total = job.rate * max(0, elapsed_ms) // 1000
    base, extra = divmod(total, job.partitions)
    return [base + (1 if p < extra else 0) for p in range(job.partitions)]


def word_counts(job: RateJob, starts: list[int], ends: list[int]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for partition, (start, end) in enumerate(zip(starts, ends, strict=True)):
        for line in textgen.lines(job.seed, job.record_bytes, partition, start, end):
            counts.update(line.split())
    return counts


def expected_batch_counts(job: RateJob, batches: int) -> list[Counter[str]]:
    """Word counts of batches 1..batches (index 0 is batch 1)."""
    batch_ms = job.batch_s * 1000
    return [
        word_counts(job, available(job, (k - 1) * batch_ms), available(job, k * batch_ms))
        for k in range(1, batches + 1)
    ]


@dataclass
class BatchOutput:
    counts: Counter[str]
    totals: dict[str, int]
    window: dict[str, int]


def batch_output(records: Iterable[tuple[Sequence[str], int]], where: str) -> BatchOutput:
    """One batch's faultapp records, ((kind, key), value), split into its three outputs; a key
    twice in a batch means the batch was written twice."""
    found: dict[str, dict[str, int]] = {"count": {}, "total": {}, "window": {}}
    for (kind, key), value in records:
        assert key not in found[kind], f"{where}: {kind} {key!r} twice"
        found[kind][key] = value
    return BatchOutput(Counter(found["count"]), found["total"], found["window"])


def read_batch(directory: Path) -> BatchOutput:
    """One batch directory of the files sink."""
    lines = (
        text for part in sorted(directory.glob("part-*")) for text in part.read_text().splitlines()
    )
    records = (json.loads(text) for text in lines)
    return batch_output(((r["key"], r["value"]) for r in records), directory.name)


def batch_dirs(out: Path) -> dict[int, Path]:
    """Visible batch directories by batch time (ms)."""
    return {
        int(entry.name.removeprefix("batch-")): entry
        for entry in out.iterdir()
        if entry.name.startswith("batch-")
    }


def zero_ms(checkpoint: Path) -> int:
    return json.loads((checkpoint / "metadata.json").read_text())["body"]["zeroMs"]


@dataclass
class Verdict:
    batches: int
    records: int
    words: int
    lost: int
    duplicated: int
    mismatched_batches: list[str]


def verify(job: RateJob) -> Verdict:
    """The rate job's committed batches against the offsets each batch time made available."""
    batch_ms = job.batch_s * 1000
    outputs = {t: read_batch(d) for t, d in batch_dirs(job.out).items()}
    zero, batches = zero_ms(job.checkpoint), len(outputs)
    expected = expected_batch_counts(job, batches)
    inputs = {zero + k * batch_ms: counts for k, counts in enumerate(expected, start=1)}
    end = available(job, batches * batch_ms)
    reference = word_counts(job, [0] * job.partitions, end)
    return judge(job, outputs, inputs, reference, sum(end))


def judge(
    job: FaultJob,
    outputs: dict[int, BatchOutput],
    inputs: dict[int, Counter[str]],
    reference: Counter[str],
    records: int,
) -> Verdict:
    """Every committed batch against the word counts of its input (`inputs`, by batch time):
    the batch's counts, the running totals per initial and the window; then the union of all
    counts against the reference (the words of all `records` of input): lost and duplicated."""
    zero, batch_ms = zero_ms(job.checkpoint), job.batch_s * 1000
    times = [zero + k * batch_ms for k in range(1, len(inputs) + 1)]
    assert sorted(inputs) == times, f"batch times missing: {sorted(inputs)}"
    assert sorted(outputs) == times, f"batches committed {sorted(outputs)}, expected {times}"
    mismatched: list[str] = []
    union: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    expected = [inputs[t] for t in times]
    for k, (time_ms, counts) in enumerate(zip(times, expected, strict=True), start=1):
        output = outputs[time_ms]
        union.update(output.counts)
        for word, n in counts.items():
            totals[word[0]] += n
        window: Counter[str] = sum(expected[max(0, k - job.window_batches) : k], Counter())
        for name, got, want in (
            ("counts", output.counts, counts),
            ("totals", output.totals, dict(totals)),
            ("window", output.window, dict(window)),
        ):
            if dict(got) != dict(want):
                mismatched.append(f"batch {k} ({time_ms}) {name}")
    lost = sum((reference - union).values())
    duplicated = sum((union - reference).values())
    return Verdict(len(times), records, sum(reference.values()), lost, duplicated, mismatched)


class Watch:
    """A thread that polls something of the running job every `interval_s`, and once more on
    leaving (what the last moments wrote)."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.polls += 1
            self.poll()

    def poll(self) -> None:
        raise NotImplementedError


class PartialOutputWatch(Watch):
    """Polls the sink directory while the job runs: a visible batch directory must be whole."""

    def __init__(self, out: Path, interval_s: float = 0.1):
        super().__init__(interval_s)
        self.out = out
        self.partial: list[str] = []

    def poll(self) -> None:
        for directory in _visible_dirs(self.out):
            if not (directory / "_SUCCESS").exists() and directory.exists():
                self.partial.append(directory.name)


def _visible_dirs(out: Path) -> Iterator[Path]:
    if not out.exists():
        return
    for entry in out.iterdir():
        if not entry.name.startswith((".", "_")):
            yield entry


class BatchLogWatch(Watch):
    """Every batch record (`log/batch-<ms>.json`: the input ranges a batch admitted) the job
    writes, kept as it appears: the engine prunes records a few windows old, and a reference
    computed from the recorded input needs them all. A record, once written, must never change
    (a replay reads it, it does not plan again): `rewritten` lists batch times that did."""

    def __init__(self, checkpoint: Path, interval_s: float = 0.25):
        super().__init__(interval_s)
        self.log_dir = checkpoint / "log"
        self.records: dict[int, dict[str, Any]] = {}
        self.rewritten: list[int] = []

    def poll(self) -> None:
        for path in self.log_dir.glob("batch-*.json"):
            try:
                record = json.loads(path.read_text())["body"]
            except FileNotFoundError:
                continue  # pruned since the listing
            if self.records.setdefault(record["time"], record) != record:
                self.rewritten.append(record["time"])


# -- the same job in this process, on a manual clock ------------------------------------------


class InProcessJob:
    """The RateJob built by the engine's own `build_context` on the session SparkContext, driven
    batch by batch on a ManualClock: a restart is a new StreamingContext on the same checkpoint,
    which exercises recovery without the cost of a JVM per run."""

    def __init__(self, sc: Any, job: RateJob):
        import faultapp
        from pyspark import cloudpickle

        # The session's Python workers cannot import tests/fault: ship faultapp by value.
        cloudpickle.register_pickle_by_value(faultapp)
        self.sc = sc
        self.job = job
        self.job.write()
        self.batch_ms = job.batch_s * 1000
        self.now_ms = 0

    def context(self) -> Any:
        """A new StreamingContext on the job's checkpoint, on a manual clock, not started."""
        from dstream.runtime.scheduling.clock import ManualClock
        from dstream.service.job import build_context
        from dstream.spec import load_job

        ssc = build_context(load_job(self.job.manifest), self.sc)
        ssc._clock = ManualClock(self.now_ms)
        return ssc

    def start(self) -> Any:
        """A new StreamingContext on the job's checkpoint, started. The session's SparkContext
        was not made from the spec, so the spec's failurePolicy is handed to the scheduler
        here: it governs every batch the clock brings (a batch replayed at start, which runs
        at once, may begin under the default policy)."""
        from dstream.runtime.control.failure import FailurePolicy
        from dstream.spec import load_job

        spec = load_job(self.job.manifest)
        ssc = self.context()
        ssc.start()
        policy = spec.spec.failure_policy
        ssc._scheduler.failure_policy = FailurePolicy(
            policy.retries, policy.backoff_seconds, policy.on_exhausted
        )
        return ssc

    def advance(self, ssc: Any) -> int:
        """Move the clock one batch on, which makes that batch due; its time (ms)."""
        self.now_ms += self.batch_ms
        ssc._clock.advance(self.batch_ms)
        return self.now_ms

    def run(self, ssc: Any, batches: int, timeout_s: float = 120) -> None:
        """Advance the clock batch by batch, waiting for each batch to complete."""
        for _ in range(batches):
            ssc._scheduler.wait_for_batch(self.advance(ssc), timeout_s)

    def wait_for_retry(self, ssc: Any, timeout_s: float = 60) -> Any:
        """The running batch (BatchInfo) once it has failed and been retried at least once."""

        def retried() -> Any:
            info = ssc._scheduler.current
            return info if info is not None and info.retries >= 1 else None

        return eventually(retried, timeout_s)


def fault_seed() -> int:
    """The seed of a test's random choices: DSTREAM_FAULT_SEED when it is set (to replay a
    run), else a random one; printed either way."""
    seed = int(os.environ.get("DSTREAM_FAULT_SEED", random.randrange(2**31)))
    print(f"\nDSTREAM_FAULT_SEED={seed}")
    return seed


def fault_rng() -> random.Random:
    """The test's random choices, from fault_seed()."""
    return random.Random(fault_seed())


def truncate_at_random_byte(path: Path, rng: random.Random) -> None:
    """Cut `path` short at a random byte, as a crash or a copy cut short leaves a file."""
    os.truncate(path, rng.randrange(path.stat().st_size))


# -- storage faults: file systems of the test's own ------------------------------------------


@contextmanager
def tmpfs(path: Path, size_kb: int = 4096) -> Iterator[Path]:
    """A tmpfs of `size_kb` mounted at `path` for the block, so that a test can make it
    read-only or fill it up; unmounted after (lazily: a JVM may still hold a file in it).
    Mounting needs root (CAP_SYS_ADMIN); without it the test fails saying so, as this suite
    skips nothing."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = _mount("-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path))
    if mounted.returncode != 0:
        pytest.fail(
            f"this storage fault test mounts a tmpfs at {path} and needs root (CAP_SYS_ADMIN) "
            f"for it: mount said {mounted.stderr.strip()!r}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


@contextmanager
def bind_mount(source: Path, path: Path) -> Iterator[Path]:
    """`source` bind-mounted at `path` for the block: the same file system (and device) on both
    sides, yet a rename between them fails (EXDEV), as across a Kubernetes subPath mount."""
    source.mkdir(parents=True, exist_ok=True)
    path.mkdir(parents=True, exist_ok=True)
    mounted = _mount("--bind", str(source), str(path))
    if mounted.returncode != 0:
        pytest.fail(f"mount --bind needs root (CAP_SYS_ADMIN): {mounted.stderr.strip()!r}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def remount(path: Path, mode: str) -> None:
    """Make the tmpfs at `path` read-only ("ro") or writable again ("rw"). The kernel refuses
    read-only while a file there is open for writing, so that is tried until none is."""
    eventually(lambda: _mount("-o", f"remount,{mode}", str(path)).returncode == 0, 30)


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


def fill_up(directory: Path) -> Path:
    """A hidden file in `directory` that takes every free byte of its file system (readers of
    the sink and the checkpoint ignore names starting with a dot); delete it to free them."""
    filler = directory / ".filler"
    chunk = bytes(1 << 16)
    with open(filler, "wb", buffering=0) as out:
        try:
            while out.write(chunk):
                pass
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    return filler
