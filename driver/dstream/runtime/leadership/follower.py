"""What a standby does while it waits for the lead: it follows the leader's checkpoint, so that
taking over costs as little as possible (its executors warmed up, the newest state checkpoints
read through, the leader's committed batches shadowed).
"""

from __future__ import annotations

import logging
import operator
import shutil
import threading
from typing import TYPE_CHECKING, Any

from dstream.runtime.checkpoint import durable
from dstream.runtime.checkpoint.files import local_path
from dstream.runtime.checkpoint.recovery import verified_state
from dstream.runtime.timeutil import datetime_of

if TYPE_CHECKING:
    from pyspark import SparkContext

    from dstream.runtime.checkpoint.directory import CheckpointDir
    from dstream.runtime.leadership.shadow import Shadow

log = logging.getLogger(__name__)


class CheckpointFollower:
    """What a standby does while it waits for the lead, in a thread of its own so that the
    lease is polled meanwhile: it follows the leader's checkpoint, so that taking over costs as
    little as possible. First it warms its executors up (`warm_up`); then every `every_s` it
    reads the metadata and the log (the page cache keeps them), reads each stream's newest
    state checkpoint through once in the JVM, which recovery then need not do again
    (`verified`), and has its `shadow` compute the batches the leader committed since
    (shadow.py). It only reads the checkpoint: the leader is writing the same directory."""

    def __init__(
        self,
        sc: SparkContext,
        checkpoint: CheckpointDir,
        shadow: Shadow | None = None,
        every_s: float = 0.5,
    ):
        self._sc = sc
        self._checkpoint = checkpoint
        self.shadow = shadow
        self._every_s = every_s
        self._verified: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="dstream-standby", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> frozenset[str]:
        """Stop following: its Spark job under way is cancelled and the thread awaited, as the
        shadow's graph is the one the takeover runs. The state checkpoints verified so far."""
        self._stop.set()
        self._sc.cancelJobsWithTag(FOLLOWER_JOB_GROUP)  # silent, unlike a group, when none runs
        self._thread.join(FOLLOWER_STOP_TIMEOUT_S)
        if self._thread.is_alive() and self.shadow is not None:
            self.shadow.failure = f"still computing {FOLLOWER_STOP_TIMEOUT_S} s after the takeover"
        with self._lock:
            return frozenset(self._verified)

    def _follow(self) -> None:
        self._sc.setJobGroup(FOLLOWER_JOB_GROUP, "standby: warm-up and shadow of the leader")
        self._sc.addJobTag(FOLLOWER_JOB_GROUP)
        try:
            warm_up(self._sc, self._stop)
        except Exception as error:  # only slower to take over: worth a warning, not a stop
            log.warning("standby: warm-up failed, following without it (%s)", error)
        try:
            while self._round() and not self._stop.is_set():  # warm: caught up with the leader
                pass
            log.info(
                "standby: warm, following %s (%d state checkpoints read through%s)",
                self._checkpoint.path,
                len(self._verified),
                self._shadowed(),
            )
            while not self._stop.wait(self._every_s):
                self._round()
        except Exception as error:  # stopped under it: recovery reads what it needs itself
            log.info("standby: stopped following the checkpoint (%s)", error)

    def _round(self) -> int:
        """One round of following; how many committed batches the shadow computed."""
        self._read_checkpoint()
        return self.shadow.catch_up(self._stop) if self.shadow is not None else 0

    def _shadowed(self) -> str:
        """How far the shadow got, for the log."""
        if self.shadow is None:
            return ", not shadowing"
        if self.shadow.failure is not None:
            return ", shadow failed"
        if self.shadow.stepped_ms is None:
            return ", nothing committed to shadow yet"
        return f", state shadowed up to {datetime_of(self.shadow.stepped_ms)}"

    def _read_checkpoint(self) -> None:
        sc = self._sc
        self._checkpoint.read_metadata()
        found = self._checkpoint.load_log(tidy=False)
        for checkpoints in found.state_checkpoints().values():
            path = checkpoints[0][1]
            if self._stop.is_set() or path in self._verified or durable.is_durable(path):
                continue
            try:
                verified_state(sc, path)
            except Exception as error:  # pruned or being written: the next round or recovery
                log.debug("standby: state checkpoint %s not read yet (%s)", path, error)
                continue
            with self._lock:
                self._verified.add(path)


WARM_UP_ROUNDS = 5
# The Spark job group of the follower's jobs, cancelled when the lead is taken.
FOLLOWER_JOB_GROUP = "dstream-standby"
FOLLOWER_STOP_TIMEOUT_S = 60.0


def warm_up(sc: SparkContext, stop: threading.Event, rounds: int = WARM_UP_ROUNDS) -> None:
    """Run, a few times, small jobs through the code a stateful batch runs: a shuffle of Python
    pairs, kept in memory (as a batch's shared stream), cogrouped with another (as a state
    step) and written as text files (as the files sink and Spark's writers do), into a scratch
    directory of this SparkContext's checkpoint directory, which the executors share. Each
    executor's Python workers start and the JVMs load and compile that code before a batch
    needs it: a standby's first batches after a takeover ran it several times slower than
    the warm leader (bench/results/2026-11-25-recovery.md, "Where a standby's takeover goes",
    with the A/B against bare shuffles). A stop
    (the lead taken) ends it early."""
    slots = sc.defaultParallelism
    scratch = local_path(f"{sc.getCheckpointDir()}/standby-warm-up")
    try:
        for n in range(rounds):
            if stop.is_set():
                return
            pairs = sc.parallelize(range(slots * 1000), slots).map(lambda n: (n % 97, 1))
            counts = pairs.reduceByKey(operator.add).persist()
            stepped = counts.cogroup(pairs).mapValues(_first_summed)
            stepped.saveAsTextFile(str(scratch / str(n)))
            counts.unpersist()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _first_summed(grouped: tuple[Any, Any]) -> int:
    """The warm-up's state step. A function of this module, which the Python workers import to
    run it, so that they have dstream's modules loaded before the first batch's tasks."""
    return sum(grouped[0])
