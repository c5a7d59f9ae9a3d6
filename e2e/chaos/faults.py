"""The faults and what each costs: executor pods, the driver pod and the operator pod deleted
while the job runs, each followed by a bounded wait for the job to be whole and on schedule.

Figures (seconds):
- no fault: from moments among the baseline's batches to a batch on schedule
  (`Snapshot.waits_for_schedule`), what "back on schedule" below is read against;
- executor loss: the largest batch delay (batch time -> commit) among the batches that were
  running or started before the job was back on schedule (the spike), and the time from the
  deletion until a batch started after it committed on schedule again, and (read once the run
  is over, `figures_for_good`) until the job was on schedule for good, every batch up to the
  next fault within the same bound;
- driver loss: from the deletion to the first batch committed by the new driver, with every
  phase of the new leader's recovery timeline from its log (its pod's start included), and
  the steps of each of its executor pods' start (e2e/chaos/startup.py);
- with a standby (`driver.standby`), the leader's loss: the leading driver pod (the job Lease's
  holder) is deleted with no grace period (the API object goes at once; the kubelet still sends
  SIGTERM and kills 2 s later, so a leader that releases the Lease in that time hands over at
  once, else the standby takes over once the Lease expires): from the kill to the standby holding the Lease,
  to its first committed batch, and to a batch on schedule again (and for good, as above); the
  new leader's recovery timeline (lead taken, state restored) is read from its log; then the
  operator must replace the victim (a new pod running). Before each kill the standby is warm
  (its log says so);
- with a standby, the pair's loss: both driver pods deleted at once, so the job's restart path
  applies as without a standby (measured as a driver loss);
- operator loss: from the deletion of the leading operator's pod (the chart runs two, one
  elected through a Lease) to the standby holding the Lease (it is then watching and acting:
  failover); the job keeps committing meanwhile, and the new leader must replace a driver
  deleted afterwards (adoption), which is measured as a driver loss.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from dstream.runtime.scheduling.timeline import PHASES
from kubernetes import client

from e2e.chaos import startup
from e2e.chaos.cluster import Cluster, pod_ready, wait_for
from e2e.chaos.observer import Observer, Snapshot

# The driver's log lines that the standby faults read (dstream.runtime.checkpoint.recovery, .timeline).
WARM_STANDBY = "standby: warm, following"
_TIMELINE = re.compile(r"recovery timeline: phase=(\w+) at=([0-9.]+)")
_CLAIMED = re.compile(r"claimed epoch (\d+) of ")
# What a standby's takeover shows (it started up before the fault).
TAKEOVER_PHASES = ("lead_taken", "state_restored", "replayed", "on_schedule")


@dataclass(frozen=True)
class Target:
    namespace: str
    job: str
    executors: int
    batch_s: float
    operator_namespace: str
    release: str
    lease: str  # the operators' leader Lease, in operator_namespace (the chart's full name)
    standby: bool = False  # the job runs two drivers (driver.standby), elected by driver_lease

    @property
    def driver_lease(self) -> str:
        """The job's Lease, in namespace, held by its leading driver (operator: lease_name)."""
        return f"{self.job}-driver"


def timeline_in(log: str, phases: tuple[str, ...]) -> dict[str, float]:
    """The recovery `phases` a driver's log names (unix seconds)."""
    found = dict(_TIMELINE.findall(log))
    return {phase: float(found[phase]) for phase in phases if phase in found}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1): a value that was measured."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Figures:
    """Measured seconds per kind of figure, in the order measured."""

    values: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, kind: str, seconds: float, note: str) -> None:
        self.values.setdefault(kind, []).append(seconds)
        self.note(f"{kind}: {seconds:.1f} s ({note})")

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  {text}", flush=True)

    def as_json(self) -> dict[str, list[float | None]]:
        """The values for a JSON report: a fault never back (inf) is null, since strict JSON
        has no Infinity."""
        return {
            kind: [v if math.isfinite(v) else None for v in values]
            for kind, values in self.values.items()
        }

    def summary(self) -> list[str]:
        return [
            f"{kind}: count={len(v)} p50={statistics.median(v):.1f}s "
            f"p90={percentile(v, 0.9):.1f}s max={max(v):.1f}s"
            for kind, v in self.values.items()
        ]


class Chaos:
    def __init__(self, cluster: Cluster, observer: Observer, target: Target):
        self.cluster, self.observer, self.target = cluster, observer, target
        self.figures = Figures()
        self.baseline_delay = 0.0
        self.fault_free_on_schedule = (0.0, 0.0)  # p50, p90: what "back on schedule" reads against
        self.faults: dict[str, int] = {}
        self.fault_moments: list[float] = []  # when each fault was made, in order
        self.read_for_good: list[tuple[str, float]] = []  # (figure, moment of its fault)

    # -- observations -------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        if self.observer.failure:
            raise RuntimeError(f"the observer stopped: {self.observer.failure}")
        return self.observer.snapshot()

    def ready_executors(self) -> list[str]:
        """The ready executors of the leading driver (with a standby, the Lease's holder: the
        standby's own executors run no batch)."""
        pods = self.cluster.job_pods(self.target.namespace, self.target.job, "executor")
        owner = self.leader() if self.target.standby else None
        return sorted(
            p.metadata.name
            for p in pods
            if pod_ready(p) and (owner is None or _owned_by(p, owner[1]))
        )

    def leader(self) -> tuple[str, str] | None:
        """(name, uid) of the driver pod holding the job's Lease (a standby job's)."""
        t = self.target
        holder = self.cluster.lease_holder(t.namespace, t.driver_lease)
        if not holder or "/" not in holder:
            return None
        name, uid = holder.split("/", 1)
        return name, uid

    def wait_until_running(self, timeout_s: float) -> None:
        """The job's phase is Running, all executors are ready, and batches commit."""
        t = self.target

        def running() -> bool:
            status = self.cluster.streaming_job(t.namespace, t.job).get("status") or {}
            return status.get("phase") == "Running"

        wait_for(f"StreamingJob {t.job} phase Running", running, timeout_s, every_s=2)
        wait_for(
            f"{t.executors} executor pods ready",
            lambda: len(self.ready_executors()) >= t.executors,
            timeout_s,
            every_s=2,
        )
        started = time.time()
        wait_for(
            "a batch committed with all executors",
            lambda: self.snapshot().committed_after(started),
            timeout_s,
        )

    def measure_baseline(self, batches: int, timeout_s: float) -> None:
        """The median delay of `batches` consecutive fault-free batches, once the job has caught
        up with the backlog of its start (a batch committed within two intervals)."""
        caught_up = 2 * self.target.batch_s

        def on_schedule() -> bool:
            snapshot = self.snapshot()
            return any(snapshot.delay(t) <= caught_up for t in snapshot.commits)

        wait_for(
            f"the job to catch up (a batch delay of at most {caught_up:.0f} s; if this fails, the "
            "machine is too slow for the batch interval: raise --batch-seconds)",
            on_schedule,
            timeout_s,
        )
        started = time.time()

        def enough() -> list[int] | None:
            done = self.snapshot().committed_after(started)
            return done if len(done) >= batches else None

        done = wait_for(f"{batches} fault-free batches", enough, timeout_s)
        snapshot = self.snapshot()
        delays = [snapshot.delay(b) for b in done[:batches]]
        self.baseline_delay = statistics.median(delays)
        print(
            f"  baseline batch delay: {self.baseline_delay:.1f} s ({batches} batches: "
            f"min {min(delays):.1f} s, max {max(delays):.1f} s, last {delays[-1]:.1f} s)",
            flush=True,
        )
        limit = self.baseline_delay + self.target.batch_s
        waits = snapshot.waits_for_schedule(done[:batches], limit)
        self.fault_free_on_schedule = (statistics.median(waits), percentile(waits, 0.9))
        print(
            "  no fault, from a moment among those batches to a batch on schedule: "
            f"p50 {self.fault_free_on_schedule[0]:.1f} s, "
            f"p90 {self.fault_free_on_schedule[1]:.1f} s",
            flush=True,
        )

    def on_schedule_after(self, epoch_s: float, timeout_s: float, what: str) -> int:
        """The first batch with a time after `epoch_s` whose delay is back to the baseline plus
        one interval; returns its time (ms)."""
        limit = self.baseline_delay + self.target.batch_s

        def back() -> int | None:
            return self.snapshot().first_on_schedule_after(epoch_s, limit)

        return wait_for(f"batches on schedule again after {what}", back, timeout_s)

    def wait_mid_batch(self, timeout_s: float) -> int:
        """A batch that is running now (its record written, its commit not yet); its time."""

        def running() -> int | None:
            snapshot = self.snapshot()
            open_batches = [t for t in snapshot.ranges if t not in snapshot.commits]
            newest_commit = max(snapshot.commits, default=0)
            return max((t for t in open_batches if t > newest_commit), default=None)

        return wait_for("a batch in progress", running, timeout_s, every_s=0.2)

    # -- faults ---------------------------------------------------------------------------------

    def count(self, kind: str, at: float) -> None:
        """One more fault of `kind`, made at `at` (unix seconds)."""
        self.faults[kind] = self.faults.get(kind, 0) + 1
        self.fault_moments.append(at)

    def lose_executor(self, timeout_s: float) -> None:
        t = self.target
        before = self.ready_executors()
        running = self.wait_mid_batch(timeout_s)
        victim = before[self.faults.get("executor", 0) % len(before)]
        deleted_at = time.time()
        self.cluster.delete_pod(t.namespace, victim)
        self.count("executor", deleted_at)
        self.read_for_good.append(("executor-loss on schedule for good", deleted_at))
        print(f"- deleted executor pod {victim} during batch {running}", flush=True)

        def replaced() -> bool:
            ready = self.ready_executors()
            return len(ready) >= t.executors and bool(set(ready) - set(before))

        wait_for("a replacement executor pod ready", replaced, timeout_s, every_s=2)
        back = self.on_schedule_after(deleted_at, timeout_s, f"deleting {victim}")
        snapshot = self.snapshot()
        affected = [u for u in snapshot.commits if running <= u <= back]
        spike = max(snapshot.delay(u) for u in affected)
        self.figures.add("executor-loss batch delay", spike, f"{len(affected)} batches affected")
        self.figures.add(
            "executor-loss back on schedule",
            snapshot.commits[back] - deleted_at,
            f"batch {back} delay {snapshot.delay(back):.1f} s",
        )

    def figures_for_good(self, snapshot: Snapshot) -> None:
        """Per executor loss and standby takeover, read once the run is over: the seconds until
        the job was on schedule and stayed so up to the next fault. "Back on schedule" may take
        a batch that ran on time before the fault's cost landed (the replacement's start, a
        cold first task); this reading cannot."""
        limit = self.baseline_delay + self.target.batch_s
        for figure, fault_at in self.read_for_good:
            until = min((m for m in self.fault_moments if m > fault_at), default=None)
            back = snapshot.on_schedule_for_good(fault_at, until, limit)
            seconds = math.inf if back is None else snapshot.commits[back] - fault_at
            held = "the next fault" if until is not None else "the end of the run"
            self.figures.add(figure, seconds, f"up to {held}")

    def driver_pod(self) -> tuple[str, str]:
        """(name, uid) of the job's one live driver pod."""
        t = self.target
        pods = [
            p
            for p in self.cluster.job_pods(t.namespace, t.job, "driver")
            if not p.metadata.deletion_timestamp
        ]
        if len(pods) != 1:
            raise RuntimeError(f"expected one driver pod, found {[p.metadata.name for p in pods]}")
        return pods[0].metadata.name, pods[0].metadata.uid

    def lose_driver(
        self, timeout_s: float, kind: str = "driver recovery", grace_seconds: int | None = None
    ) -> None:
        """Delete the driver pod with its own grace period (the old driver's graceful stop then
        shares the node with the new driver's start) or with `grace_seconds`."""
        t = self.target
        name, uid = self.driver_pod()
        deleted_at = time.time()
        self.cluster.delete_pod(t.namespace, name, grace_seconds)
        self.count("driver", deleted_at)
        grace = "" if grace_seconds is None else f" (grace period {grace_seconds} s)"
        print(f"- deleted driver pod {name}{grace}", flush=True)
        self._await_new_driver({uid}, deleted_at, kind, timeout_s)

    def _await_new_driver(
        self, old_uids: set[str], deleted_at: float, kind: str, timeout_s: float
    ) -> None:
        """Measure from the deletion to the first batch committed under the epoch a new driver
        pod claimed: an old driver still stopping may commit after the new pod started, and a
        deleted standby may even have led for a while, each under an epoch of its own."""
        t = self.target

        def new_driver_started() -> tuple[float, float] | None:
            """(created, started) of a driver pod created after the deletion (whole seconds)."""
            for pod in self.cluster.job_pods(t.namespace, t.job, "driver"):
                if pod.metadata.uid not in old_uids and pod.status.start_time:
                    created = pod.metadata.creation_timestamp.timestamp()
                    return created, pod.status.start_time.timestamp()
            return None

        created, started = wait_for("a new driver pod", new_driver_started, timeout_s, every_s=1)
        epoch = wait_for(
            "a new driver pod's claim of the lead",
            lambda: self._claimed_epoch(old_uids),
            timeout_s,
            every_s=1,
        )
        first = wait_for(
            "the first batch committed by the new driver",
            lambda: self.snapshot().committed_above(epoch - 1),
            timeout_s,
        )[0]
        snapshot = self.snapshot()
        leader, phases = self._new_leader(old_uids)
        after = "".join(f", {p} +{at - deleted_at:.1f} s" for p, at in phases.items())
        self.figures.add(
            kind,
            snapshot.commits[first] - deleted_at,
            f"new driver pod created after {created - deleted_at:.0f} s and started after "
            f"{started - deleted_at:.0f} s (it need not wait for the old pod's graceful stop: a "
            f"name per attempt); its first commit: batch {first}, delay "
            f"{snapshot.delay(first):.1f} s{after}",
        )
        if leader is not None:
            for line in startup.breakdown(self.cluster, t.namespace, t.job, leader, deleted_at):
                self.figures.note(f"{kind}: {line}")
        self.wait_until_running(timeout_s)

    def lose_leader(self, timeout_s: float, kind: str = "standby takeover") -> None:
        """Kill the leading driver of a standby job; see the module docstring."""
        t = self.target
        name, uid = wait_for("a driver holding the job's Lease", self.leader, timeout_s)
        standby = wait_for("a warm standby", lambda: self._warm_standby(name), timeout_s, 2)
        killed_at = time.time()
        self.cluster.delete_pod(t.namespace, name, grace_seconds=0)
        self.count("leader", killed_at)
        self.read_for_good.append((f"{kind}: on schedule for good", killed_at))
        print(f"- killed the leading driver pod {name}; {standby} stands by", flush=True)

        def successor() -> tuple[str, float] | None:
            holder = self.leader()
            return (holder[0], time.time()) if holder and holder[1] != uid else None

        successor_name, taken = wait_for(
            "another driver holding the job's Lease", successor, timeout_s, every_s=0.2
        )
        first = wait_for(
            f"the first batch committed by {successor_name}",
            lambda: self.snapshot().committed_after(taken),
            timeout_s,
        )[0]
        back = self.on_schedule_after(killed_at, timeout_s, f"killing {name}")
        snapshot = self.snapshot()
        phases = self._timeline(successor_name)
        after = ", ".join(f"{p} +{at - killed_at:.1f} s" for p, at in phases.items())
        self.figures.add(
            f"{kind}: first batch",
            snapshot.commits[first] - killed_at,
            f"{successor_name} held the Lease after {taken - killed_at:.1f} s; batch {first}; "
            f"{after}",
        )
        self.figures.add(
            f"{kind}: back on schedule",
            snapshot.commits[back] - killed_at,
            f"batch {back} delay {snapshot.delay(back):.1f} s",
        )

        def replaced() -> bool:
            pods = self.cluster.job_pods(t.namespace, t.job, "driver")
            others = [p for p in pods if p.metadata.name != successor_name]
            return any(p.metadata.uid != uid and p.status.phase == "Running" for p in others)

        wait_for(f"the operator replacing {name}", replaced, timeout_s, every_s=1)

    def _warm_standby(self, leader: str) -> str | None:
        """The job's other live driver pod once its log says it is warm and following."""
        t = self.target
        for pod in self.cluster.job_pods(t.namespace, t.job, "driver"):
            if pod.metadata.name != leader and pod.status.phase == "Running":
                if WARM_STANDBY in self.cluster.pod_log(t.namespace, pod.metadata.name):
                    return pod.metadata.name
        return None

    def _timeline(self, pod: str) -> dict[str, float]:
        """The takeover's phases a driver logged (unix seconds)."""
        return timeline_in(self.cluster.pod_log(self.target.namespace, pod), TAKEOVER_PHASES)

    def _new_driver_logs(self, old_uids: set[str]) -> Iterator[tuple[client.V1Pod, str]]:
        """Each driver pod not among `old_uids`, with its log so far."""
        t = self.target
        for pod in self.cluster.job_pods(t.namespace, t.job, "driver"):
            if pod.metadata.uid not in old_uids:
                yield pod, self.cluster.pod_log(t.namespace, pod.metadata.name)

    def _claimed_epoch(self, old_uids: set[str]) -> int | None:
        """The epoch a new driver pod (not one of `old_uids`) claimed, as its log says."""
        for _, log in self._new_driver_logs(old_uids):
            if claimed := _CLAIMED.search(log):
                return int(claimed.group(1))
        return None

    def _new_leader(self, old_uids: set[str]) -> tuple[client.V1Pod | None, dict[str, float]]:
        """The new driver pod (not one of `old_uids`) that took the lead, as its recovery
        timeline says, and every phase of that timeline: on the restart path its own start-up
        is part of the recovery."""
        for pod, log in self._new_driver_logs(old_uids):
            phases = timeline_in(log, PHASES)
            if "lead_taken" in phases:
                return pod, phases
        return None, {}

    def lose_pair(self, timeout_s: float) -> None:
        """Delete both drivers of a standby job at once: the restart path, as without one."""
        t = self.target
        pods = [
            p
            for p in self.cluster.job_pods(t.namespace, t.job, "driver")
            if not p.metadata.deletion_timestamp
        ]
        uids = {p.metadata.uid for p in pods}
        deleted_at = time.time()
        for pod in pods:
            self.cluster.delete_pod(t.namespace, pod.metadata.name)
        self.count("driver", deleted_at)
        print(f"- deleted both driver pods {[p.metadata.name for p in pods]}", flush=True)
        self._await_new_driver(uids, deleted_at, "both drivers lost: restart", timeout_s)

    def lose_operator(self, timeout_s: float) -> None:
        t = self.target
        leader = self.cluster.lease_holder(t.operator_namespace, t.lease)
        assert leader, f"no operator holds Lease {t.operator_namespace}/{t.lease}"
        deleted_at = time.time()
        self.cluster.delete_pod(t.operator_namespace, leader)
        self.count("operator", deleted_at)
        print(f"- deleted the leading operator pod {leader}", flush=True)
        wait_for(
            "another operator holding the leader Lease",
            lambda: self.cluster.lease_holder(t.operator_namespace, t.lease) not in (None, leader),
            timeout_s,
            every_s=0.5,
        )
        self.figures.add("operator failover", time.time() - deleted_at, "standby took the Lease")
        wait_for(
            "2 batches committed after the operator's deletion (the job runs without it)",
            lambda: len(self.snapshot().committed_after(deleted_at)) >= 2,
            timeout_s,
        )
        if t.standby:
            self.lose_leader(timeout_s, kind="standby takeover under the new operator")
        else:
            self.lose_driver(timeout_s, kind="driver recovery under the new operator")

    def settle(self, batches: int, timeout_s: float) -> None:
        """`batches` more batches on schedule (delay at most the baseline plus one interval), so
        that every fault hits a job in its normal state."""
        started = time.time()
        limit = self.baseline_delay + self.target.batch_s

        def settled() -> bool:
            snapshot = self.snapshot()
            done = snapshot.committed_after(started)
            return sum(1 for t in done if snapshot.delay(t) <= limit) >= batches

        wait_for(f"{batches} batches on schedule", settled, timeout_s)


def _owned_by(pod: client.V1Pod, uid: str) -> bool:
    """Whether `pod` (an executor) belongs to the driver pod `uid` (Spark sets the owner)."""
    return any(ref.uid == uid for ref in pod.metadata.owner_references or [])
