"""python -m e2e.chaos --kubeconfig K --image IMAGE (--host-path DIR | --storage-class SC)

Installs the operator from helm/dstream, runs the wordtotals StreamingJob (2 executors,
checkpoint and output on shared storage; by default with a standby driver), deletes executor,
driver and operator pods while it runs, then checks the committed output against the reference
and prints the figures.
Exit status 0 only if lost=0 and duplicated=0 and every batch matched.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.chaos.cluster import (
    DEADLINE,
    Cluster,
    driver_selector,
    install_operator,
    operator_selector,
    show_kubectl,
)
from e2e.chaos.faults import Chaos, Target
from e2e.chaos.kafka import KafkaScenario, write_report
from e2e.chaos.observer import Observer
from e2e.chaos.storage import CHECKPOINT, OUTPUT, ClaimStorage, HostPathStorage, Storage
from e2e.chaos.verify import Input, Verdict, verify

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "dstream"
JOB = "wordtotals"
RELEASE = "dstream"
LEASE = RELEASE  # the chart's leader Lease is named after its full name, here the release
LEASE_DURATION = "spark.dstream.lease.durationSeconds"  # the job Lease's, with a standby
SOURCE = Input(seed=7, record_bytes=60, partitions=2)
TEMPLATE_LABEL = "e2e.dstream.dev/from-template"  # each pod template's, checked on the pods


def from_template(role: str) -> dict[str, Any]:
    return {"metadata": {"labels": {TEMPLATE_LABEL: role}}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m e2e.chaos", description=__doc__)
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), required=False)
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--image", required=True, help="image of the operator, driver, executors")
    storage = parser.add_mutually_exclusive_group(required=True)
    storage.add_argument("--host-path", help="a node directory for checkpoint and output")
    storage.add_argument("--storage-class", help="a class that provisions ReadWriteMany claims")
    parser.add_argument(
        "--local-path",
        type=Path,
        help="the --host-path directory as this machine sees it (default: the same path)",
    )
    parser.add_argument("--namespace", default="dstream-e2e")
    parser.add_argument("--operator-namespace", default="dstream-e2e-system")
    parser.add_argument(
        "--api-server",
        default="",
        help="the API server URL for drivers (chart operator.apiServer; default: the chart's)",
    )
    parser.add_argument("--driver-host", choices=["service", "pod-ip"], default="pod-ip")
    parser.add_argument("--batch-seconds", type=int, default=6)
    parser.add_argument("--rate", type=int, default=100, help="records per second")
    parser.add_argument(
        "--baseline-batches",
        type=int,
        default=5,
        help="fault-free batches whose median delay is the baseline (more to tell whether the "
        "job keeps up with --rate)",
    )
    parser.add_argument("--executor-kills", type=int, default=3)
    parser.add_argument(
        "--standby",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the job with driver.standby: the driver kills kill the leader, and the "
        "standby takes over",
    )
    parser.add_argument(
        "--lease-seconds",
        type=int,
        default=4,
        help="with --standby: the job Lease's duration (spark.dstream.lease.durationSeconds)",
    )
    parser.add_argument("--driver-kills", type=int, default=1)
    parser.add_argument(
        "--pair-kills",
        type=int,
        default=1,
        help="with --standby: deletions of both drivers at once (the restart path)",
    )
    parser.add_argument(
        "--driver-kill-grace",
        type=int,
        help="without --standby: delete the driver pod with this grace period (0: the kubelet "
        "kills the old driver 2 s after SIGTERM, a crash but for those 2 s; default: the pod's "
        "own, so the old driver's graceful stop shares the node with the new driver's start)",
    )
    parser.add_argument("--operator-kills", type=int, default=1)
    parser.add_argument(
        "--restart-reset-seconds",
        type=int,
        help="the job's restartPolicy.resetAfterSeconds: below the time between driver losses, "
        "each replacement starts at once, as after a lone loss, and status.restarts, reset "
        "meanwhile, need only stay at or below the losses (default: the spec's)",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more entry of the job's sparkConf (repeatable), e.g. "
        "spark.eventLog.enabled=true with spark.eventLog.dir=file:///data (the run's directory)",
    )
    parser.add_argument("--deadline-seconds", type=float, default=1800, help="whole-suite limit")
    parser.add_argument("--report", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--keep", action="store_true", help="leave the job and operator running")
    parser.add_argument(
        "--kafka-host",
        help="also run the Kafka scenario (e2e/chaos/kafka.py), its broker on this address of "
        "this machine, which pods must reach (the offline cluster's bridge, 10.244.0.1)",
    )
    args = parser.parse_args(argv)
    if not args.kubeconfig:
        parser.error("--kubeconfig (or KUBECONFIG) is required")
    if args.standby and args.driver_kill_grace is not None:
        parser.error("--driver-kill-grace needs --no-standby (a leader is always killed at once)")
    if malformed := [entry for entry in args.spark_conf if "=" not in entry]:
        parser.error(f"--spark-conf takes KEY=VALUE, not {malformed[0]!r}")
    return args


def say(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", flush=True)


def split_image(image: str) -> tuple[str, str]:
    """repository and tag (a ':' after the last '/'; else tag latest)."""
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return image, "latest"
    return name, tag


def chart_values(args: argparse.Namespace) -> dict[str, Any]:
    repository, tag = split_image(args.image)
    operator: dict[str, Any] = {"driverHost": args.driver_host, "pollSeconds": 5}
    if args.api_server:
        operator["apiServer"] = args.api_server
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "watchNamespaces": [args.namespace],
        "operator": operator,
    }


def job_manifest(args: argparse.Namespace, storage: Storage) -> dict[str, Any]:
    """Small pods (the whole job fits 2 cores): CPU requests far below the cores Spark uses."""
    batch = args.batch_seconds
    return {
        "apiVersion": "dstream.dev/v1alpha1",
        "kind": "StreamingJob",
        "metadata": {"name": JOB, "namespace": args.namespace},
        "spec": {
            "batchInterval": f"{batch}s",
            "app": {"module": "jobs.wordtotals:build", "args": {"window": 3 * batch}},
            "source": {
                "type": "rate",
                "rate": {
                    "recordsPerSecond": args.rate,
                    "partitions": SOURCE.partitions,
                    "seed": SOURCE.seed,
                    "recordBytes": SOURCE.record_bytes,
                },
            },
            "sink": {"type": "files", "files": {"path": OUTPUT}},
            "checkpoint": {"path": CHECKPOINT, "interval": f"{3 * batch}s"},
            "driver": {
                "cores": 1,
                "memory": "512m",
                "coresRequest": "250m",  # two drivers and their executors fit 2 cores
                "standby": args.standby,
                "podTemplate": from_template("driver"),
            },
            "executor": {
                "instances": 2,
                "cores": 1,
                "memory": "512m",
                "coresRequest": "100m",
                "podTemplate": from_template("executor"),
            },
            "image": args.image,
            "imagePullPolicy": "IfNotPresent",
            "volumes": [storage.volume()],
            "sparkConf": {
                "spark.default.parallelism": "2",
                "spark.ui.enabled": "false",
            }
            | ({LEASE_DURATION: str(args.lease_seconds)} if args.standby else {})
            | dict(entry.split("=", 1) for entry in args.spark_conf),
            "restartPolicy": {"type": "Always", "maxRestarts": 10, "backoffSeconds": 1}
            | (
                {"resetAfterSeconds": args.restart_reset_seconds}
                if args.restart_reset_seconds is not None
                else {}
            ),
        },
    }


def make_storage(args: argparse.Namespace, cluster: Cluster) -> Storage:
    if args.host_path:
        return HostPathStorage(args.host_path, args.local_path or Path(args.host_path))
    return ClaimStorage(cluster, args.namespace, args.storage_class, args.image)


def run_faults(chaos: Chaos, args: argparse.Namespace) -> None:
    say("waiting for the job to run (phase Running, executors ready, a batch committed)")
    chaos.wait_until_running(900)
    check_pod_templates(chaos.cluster, chaos.target)
    chaos.measure_baseline(args.baseline_batches, 600)
    for n in range(args.executor_kills):
        say(f"executor loss {n + 1}/{args.executor_kills}")
        chaos.lose_executor(300)
        chaos.settle(2, 300)
    for n in range(args.driver_kills):
        say(f"driver loss {n + 1}/{args.driver_kills}{' (the leader)' if args.standby else ''}")
        if args.standby:
            chaos.lose_leader(600)
        else:
            chaos.lose_driver(600, grace_seconds=args.driver_kill_grace)
        chaos.settle(2, 300)
    for n in range(args.pair_kills if args.standby else 0):
        say(f"loss of both drivers {n + 1}/{args.pair_kills}")
        chaos.lose_pair(600)
        chaos.settle(2, 300)
    for n in range(args.operator_kills):
        say(f"operator loss {n + 1}/{args.operator_kills} (then a driver loss it must handle)")
        chaos.lose_operator(600)
        chaos.settle(2, 300)


def restarts_counted(restarts: Any, losses: int, may_reset: bool) -> bool:
    """The operator counted every driver loss; where a stable run resets the count
    (--restart-reset-seconds), it may be lower, never higher."""
    if not may_reset:
        return restarts == losses
    return isinstance(restarts, int) and 0 <= restarts <= losses


def check_pod_templates(cluster: Cluster, target: Target) -> None:
    """The pod templates reached pods a kubelet runs: the driver's through the operator, the
    executors' through Spark's own pod-template support (the hollow node runs no executor),
    and each executor pod is owned by its driver pod, which the driver adds to that template."""
    for role in ("driver", "executor"):
        pods = cluster.job_pods(target.namespace, target.job, role)
        missing = [p.metadata.name for p in pods if p.metadata.labels.get(TEMPLATE_LABEL) != role]
        if not pods or missing:
            raise RuntimeError(f"{role} pods without their template's label: {missing or 'none'}")
    orphans = [
        pod.metadata.name
        for pod in cluster.job_pods(target.namespace, target.job, "executor")
        if not owned_by_its_driver(pod)
    ]
    if orphans:
        raise RuntimeError(f"executor pods not owned by their driver pod: {orphans}")
    say("pod templates: the driver's and the executors' labels are on their pods, executors owned")


def owned_by_its_driver(executor: client.V1Pod) -> bool:
    """Whether the executor pod's controller is the driver pod it is named after."""
    driver = executor.metadata.name.rsplit("-exec-", 1)[0]
    owners = executor.metadata.owner_references or []
    return any(o.kind == "Pod" and o.name == driver and o.controller for o in owners)


def diagnose(cluster: Cluster, args: argparse.Namespace) -> None:
    """What a failed run needs for a post-mortem: pods, the job, the last driver/operator logs."""
    commands = [
        ["get", "pods", "--all-namespaces", "-o", "wide"],
        ["get", "streamingjob", JOB, "-n", args.namespace, "-o", "yaml"],
        # every driver pod, found by its labels (a name per attempt: <job>-driver-<n>)
        ["logs", "-n", args.namespace, "-l", driver_selector(JOB), "--tail", "60", "--prefix"],
        ["logs", "-n", args.operator_namespace, "-l", operator_selector(RELEASE), "--tail", "40"],
    ]
    show_kubectl(cluster, commands, say)


def report(chaos: Chaos, verdict: Verdict, max_drivers: int, path: Path | None) -> None:
    faults = ", ".join(f"{kind}={n}" for kind, n in chaos.faults.items())
    say(f"faults: {faults or 'none'} ({sum(chaos.faults.values())} in total)")
    for line in chaos.figures.summary():
        say(line)
    say(f"baseline batch delay: {chaos.baseline_delay:.1f}s")
    p50, p90 = chaos.fault_free_on_schedule
    say(f"no fault, a random moment to a batch on schedule: p50={p50:.1f}s p90={p90:.1f}s")
    say(f"batches={verdict.batches} records={verdict.records} words={verdict.words}")
    say(f"most live driver pods at once: {max_drivers}")
    for problem in verdict.problems[:20]:
        say(f"PROBLEM: {problem}")
    say(f"lost={verdict.lost} duplicated={verdict.duplicated}")
    if path:
        document = {
            "faults": chaos.faults,
            "figures": chaos.figures.as_json(),
            "notes": chaos.figures.notes,
            "baselineDelaySeconds": chaos.baseline_delay,
            "faultFreeOnScheduleSeconds": {"p50": p50, "p90": p90},
            "batches": verdict.batches,
            "records": verdict.records,
            "lost": verdict.lost,
            "duplicated": verdict.duplicated,
            "problems": verdict.problems,
            "maxLiveDrivers": max_drivers,
        }
        path.write_text(json.dumps(document, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    DEADLINE.start(args.deadline_seconds)
    started = time.monotonic()
    cluster = Cluster(args.kubeconfig, args.kubectl)
    say(f"namespaces {args.operator_namespace} and {args.namespace}")
    cluster.create_namespace(args.operator_namespace)
    cluster.create_namespace(args.namespace)
    storage = make_storage(args, cluster)
    storage.prepare()
    say(f"installing the operator from {CHART.relative_to(ROOT)} ({args.image})")
    installed = install_operator(
        cluster, CHART, RELEASE, args.operator_namespace, chart_values(args)
    )
    # Reading a claim costs a `kubectl exec`: poll it less often.
    observer = Observer(
        storage, cluster, args.namespace, JOB, every_s=1.0 if args.host_path else 3.0
    )
    observer.start()
    manifest = job_manifest(args, storage)
    say(f"applying StreamingJob {JOB}")
    cluster.apply([manifest])
    target = Target(
        args.namespace,
        JOB,
        2,
        args.batch_seconds,
        args.operator_namespace,
        RELEASE,
        LEASE,
        args.standby,
    )
    chaos = Chaos(cluster, observer, target)
    failure = None
    try:
        run_faults(chaos, args)
    except Exception as error:
        failure = error
        traceback.print_exc()
        diagnose(cluster, args)
    observer.stop()
    observer.poll()
    snapshot = observer.snapshot()
    chaos.figures_for_good(snapshot)
    window_ms = 3 * args.batch_seconds * 1000
    verdict = verify(
        SOURCE, snapshot, storage.batch_outputs(), args.batch_seconds * 1000, window_ms
    )
    drivers = 2 if args.standby else 1
    if snapshot.max_drivers > drivers:
        verdict.problems.append(f"{snapshot.max_drivers} live driver pods at once")
    status = cluster.streaming_job(args.namespace, JOB).get("status") or {}
    losses = chaos.faults.get("driver", 0)
    may_reset = args.restart_reset_seconds is not None
    if failure is None and not restarts_counted(status.get("restarts"), losses, may_reset):
        verdict.problems.append(
            f"status.restarts is {status.get('restarts')}, but {losses} drivers were lost"
        )
    if not status.get("lastBatchTime"):
        verdict.problems.append("status.lastBatchTime unset: the operator cannot read the driver")
    if failure is not None:
        verdict.problems.append(f"the run stopped early: {failure}")
    report(chaos, verdict, snapshot.max_drivers, args.report)
    exact = verdict.exact
    if not args.keep:
        say("removing the job")
        cluster.delete([manifest])
        storage.release()
    if args.kafka_host:
        exact = run_kafka(cluster, args) and exact
    if not args.keep:
        say("removing the operator")
        cluster.delete(installed)
    say(f"{'PASS' if exact else 'FAIL'} in {time.monotonic() - started:.0f} s")
    return 0 if exact else 1


def run_kafka(cluster: Cluster, args: argparse.Namespace) -> bool:
    """The Kafka scenario under the same operator: the example as written (one driver, so its
    driver loss takes the restart path; the main job covers the standby); needs a host path."""
    if not args.host_path:
        say("kafka: FAIL: the Kafka scenario needs --host-path")
        return False
    scenario = KafkaScenario(
        cluster,
        args.namespace,
        args.operator_namespace,
        RELEASE,
        LEASE,
        args.kafka_host,
        args.host_path,
        args.local_path or Path(args.host_path),
    )
    verdict = scenario.run(say)
    if args.report:
        write_report(verdict, args.report.with_name("kafka-report.json"))
    return verdict.exact


if __name__ == "__main__":
    sys.exit(main())
