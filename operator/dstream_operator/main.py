"""`dstream-operator`: run the kopf operator for StreamingJobs.

dstream-operator --namespace jobs [--namespace more] | --all-namespaces
                 [--liveness http://0.0.0.0:8081/healthz] [--metrics-port 8080]
                 [--peering dstream | --standalone] [--driver-host service|pod-ip]
                 [--api-server URL] [--poll-seconds S] [--concurrency N]
                 [--ui-ingress-host HOST [--ui-ingress-class C] [--ui-ingress-annotation K=V]]
"""

from __future__ import annotations

import argparse

import kopf
import kubernetes
import prometheus_client

from dstream_operator import handlers  # noqa: F401  (importing registers the kopf handlers)
from dstream_operator.kube import Kube, configuration_from_environment
from dstream_operator.peering import peering_problem
from dstream_operator.resources import DEFAULT_API_SERVER, Platform, UiIngress
from dstream_operator.supervisor import SupervisorSettings

PEERING_HELP = """\
peering: with --peering (the default, as the Helm chart runs it) the operator needs kopf's
peering CRD (crds/kopfpeerings.yaml) and a peering object of that name in each watched
namespace (KopfPeering) or cluster-wide (ClusterKopfPeering, with --all-namespaces); the chart
installs both. Without them kopf would wait silently, so the operator refuses to start and
prints the commands that create them. Namespace patterns ('team-*') are not checked: create the
object in each namespace they match. --standalone needs neither, but nothing then stops a second
operator from acting on the same jobs.
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
        "--peering",
        metavar="NAME",
        default="dstream",
        help="kopf peering object (default dstream); a second operator on it stays paused; "
        "refuses to start if it is missing (see below)",
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
        help="how executors reach a driver: the Service's DNS name or the pod IP",
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
        default=16,
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
    parser.add_argument("--verbose", "-v", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configuration = configuration_from_environment()
    if not args.standalone:
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
        ),
    )
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
