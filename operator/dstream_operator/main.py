"""`dstream-operator`: run the kopf operator for StreamingJobs.

dstream-operator --namespace jobs [--namespace more] | --all-namespaces
                 [--liveness http://0.0.0.0:8081/healthz] [--metrics-port 8080]
                 [--lease NS/NAME | --peering dstream | --standalone]
                 [--driver-host service|pod-ip] [--image IMAGE]
                 [--api-server URL] [--poll-seconds S] [--concurrency N]
                 [--ui-ingress-host HOST [--ui-ingress-class C] [--ui-ingress-annotation K=V]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import urllib.parse
from collections.abc import AsyncIterator

import kopf
import kubernetes
import prometheus_client
from aiohttp import web

from dstream_operator import handlers  # noqa: F401  (importing registers the kopf handlers)
from dstream_operator.kube import Kube, configuration_from_environment
from dstream_operator.leader import LeaderElector, LeaseSettings
from dstream_operator.peering import peering_problem
from dstream_operator.resources import DEFAULT_API_SERVER, OWN_IMAGE, Platform, UiIngress
from dstream_operator.supervisor import SupervisorSettings

LOST_LEASE_EXIT = 3

PEERING_HELP = """\
one active operator: with --lease NAMESPACE/NAME (as the Helm chart runs it, with 2 replicas)
the operators elect one leader through a coordination.k8s.io Lease; the others stand by (live,
serving metrics, acting on nothing) and take over when the leader's Lease expires (within
--lease-seconds of its death) or at once when it stops cleanly.

peering: --peering (the default without --lease) uses kopf's peering, which needs kopf's
peering CRD (crds/kopfpeerings.yaml) and a peering object of that name in each watched
namespace (KopfPeering) or cluster-wide (ClusterKopfPeering, with --all-namespaces). Without
them kopf would wait silently, so the operator refuses to start and prints the commands that
create them. Namespace patterns ('team-*') are not checked: create the object in each namespace
they match. Peering only keeps a second operator from acting: it does not elect one (operators
of the same priority all pause, the first included), so run one operator with it, or use
--lease. --standalone needs neither, but nothing then stops a second operator from acting on
the same jobs.
"""


def annotation(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def ui_ingress(args: argparse.Namespace) -> UiIngress | None:
    if not args.ui_ingress_host:
        return None
    return UiIngress(args.ui_ingress_host, args.ui_ingress_class, tuple(args.ui_ingress_annotation))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dstream-operator",
        description=__doc__.split("\n")[0],
        epilog=PEERING_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        metavar="NS",
        help="watch this namespace (repeatable; kopf globs like 'team-*' work)",
    )
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch the whole cluster"
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        help="kopf's liveness endpoint, e.g. http://0.0.0.0:8081/healthz",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=8080,
        help="serve Prometheus metrics on this port (0: off)",
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--lease",
        metavar="NAMESPACE/NAME",
        type=lease_name,
        help="elect one active operator among replicas through this Lease (see below)",
    )
    peering.add_argument(
        "--peering",
        metavar="NAME",
        default="dstream",
        help="kopf peering object (default dstream) for a single operator: it pauses while "
        "another operator runs on the same object, and so does that one (see below); "
        "refuses to start if it is missing",
    )
    peering.add_argument(
        "--standalone",
        action="store_true",
        help="no peering (no CRD or object needed): only when a single operator is guaranteed",
    )
    parser.add_argument(
        "--driver-host",
        choices=["service", "pod-ip"],
        default="service",
        help="how the operator reads a driver's API: the Service's DNS name or the pod IP "
        "(executors always reach their own driver at its pod IP)",
    )
    parser.add_argument(
        "--image",
        default=OWN_IMAGE,
        help="the image of the drivers and executors of jobs that name none: the operator's "
        f"own (the chart passes the image it runs the operator from; default {OWN_IMAGE})",
    )
    parser.add_argument(
        "--api-server",
        metavar="URL",
        default=DEFAULT_API_SERVER,
        help="the Kubernetes API as drivers reach it (their Spark master is k8s://URL); "
        "$(KUBERNETES_SERVICE_HOST)-style references are expanded in the driver pod",
    )
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=5.0,
        help="how often each job's status is refreshed and its driver polled; the jobs are "
        "spread over this interval",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="supervision steps (API calls, driver polls) in flight at once",
    )
    parser.add_argument(
        "--ui-ingress-host",
        metavar="HOST",
        help="give every job an Ingress to its Spark UI at this host; {job} and {namespace} "
        "are replaced, e.g. '{job}.{namespace}.spark.example.com' (default: no Ingress)",
    )
    parser.add_argument(
        "--ui-ingress-class", metavar="CLASS", help="the UI Ingresses' ingressClassName"
    )
    parser.add_argument(
        "--ui-ingress-annotation",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        type=annotation,
        help="an annotation of the UI Ingresses (repeatable)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=15.0,
        help="with --lease: how long a leader that stopped renewing keeps the Lease (takeover "
        "after a crash takes about this long); it renews every third of it",
    )
    parser.add_argument("--verbose", "-v", action="store_true")
    return parser.parse_args(argv)


def lease_name(text: str) -> tuple[str, str]:
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text!r}")
    return namespace, name


def lease_settings(args: argparse.Namespace) -> LeaseSettings | None:
    """The leader election's timing: renew every third of the lease, give up acting after two
    thirds without a renewal, so a leader stops before anyone else may start."""
    if args.lease is None:
        return None
    namespace, name = args.lease
    seconds = args.lease_seconds
    identity = os.environ.get("POD_ID") or f"{socket.gethostname()}-{os.getpid()}"
    return LeaseSettings(
        namespace,
        name,
        identity,
        lease_seconds=seconds,
        renew_seconds=seconds / 3,
        deadline_seconds=seconds * 2 / 3,
        retry_seconds=min(2.0, seconds / 10),
    )


@contextlib.asynccontextmanager
async def standby_liveness(url: str | None) -> AsyncIterator[None]:
    """Answer the liveness probe while standing by (kopf serves it once the operator acts)."""
    if url is None:
        yield
        return
    parts = urllib.parse.urlsplit(url)
    app = web.Application()
    app.router.add_get(parts.path or "/", lambda _request: web.json_response({"standby": True}))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, parts.hostname, parts.port).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def lead(args: argparse.Namespace, memo: kopf.Memo, lease: LeaseSettings) -> None:
    """Stand by until elected, then act until stopped (releasing the Lease) or until the
    Lease cannot be renewed (then exit at once: another operator may take over soon)."""
    elector = LeaderElector(memo.kube, lease)
    async with standby_liveness(args.liveness):
        await elector.acquire()
    stop = asyncio.Event()
    operator = asyncio.create_task(
        kopf.operator(
            clusterwide=args.all_namespaces,
            namespaces=args.namespace or (),
            liveness_endpoint=args.liveness,
            standalone=True,
            memo=memo,
            stop_flag=stop,
        )
    )
    holding = asyncio.create_task(elector.hold())
    await asyncio.wait({operator, holding}, return_when=asyncio.FIRST_COMPLETED)
    if holding.done():
        sys.stderr.write("dstream-operator: lost the leader Lease; exiting\n")
        os._exit(LOST_LEASE_EXIT)  # no graceful stop: it would keep acting meanwhile
    holding.cancel()
    await elector.release()
    await memo.kube.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configuration = configuration_from_environment()
    lease = lease_settings(args)
    if lease is None and not args.standalone:
        with kubernetes.client.ApiClient(configuration) as api:
            namespaces = None if args.all_namespaces else args.namespace
            problem = peering_problem(api, args.peering, namespaces)
        if problem:
            raise SystemExit(f"dstream-operator: error: {problem}")
    kopf.configure(verbose=args.verbose)
    if args.metrics_port:
        prometheus_client.start_http_server(args.metrics_port)
    memo = kopf.Memo(
        kube=Kube(configuration),
        supervision=SupervisorSettings(
            interval_seconds=args.poll_seconds,
            concurrency=args.concurrency,
            platform=Platform(ui_ingress=ui_ingress(args)),
            driver_host=args.driver_host,
            api_server=args.api_server,
            image=args.image,
        ),
    )
    if lease is not None:
        asyncio.run(lead(args, memo, lease))
        return
    kopf.run(
        clusterwide=args.all_namespaces,
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness,
        standalone=True if args.standalone else None,
        peering_name=None if args.standalone else args.peering,
        memo=memo,
    )


if __name__ == "__main__":
    main()
