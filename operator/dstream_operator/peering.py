"""Can kopf's peering work? Checked before kopf starts, because kopf cannot say so itself.

With a peering name, kopf pauses every watch until its peering CRD is served and until the
peering object names it, and reports that only at debug level: an operator started by hand
against a cluster without the chart's peering would sit silent while jobs wait. The operator
refuses to start instead, naming both fixes: install the peering, or run `--standalone`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kubernetes import client
from kubernetes.client.rest import ApiException

GROUP, VERSION = "kopf.dev", "v1"
CRD_FILE = "crds/kopfpeerings.yaml"


def is_pattern(namespace: str) -> bool:
    """kopf's namespace globs (`team-*`, `!x`, `a,b`): no single peering object to check."""
    return any(char in namespace for char in "*?!,")


def peering_manifest(name: str, namespace: str | None) -> str:
    """The peering object as one line of JSON (which kubectl reads as YAML)."""
    kind = "ClusterKopfPeering" if namespace is None else "KopfPeering"
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}}
    return json.dumps(obj)


def _create_command(name: str, namespace: str | None) -> str:
    where = "" if namespace is None else f" -n {namespace}"
    return f"echo '{peering_manifest(name, namespace)}' | kubectl apply{where} -f -"


def _served(api: client.ApiClient, plural: str) -> bool:
    try:
        served = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return any(resource.name == plural for resource in served.resources)


def _exists(api: client.ApiClient, plural: str, name: str, namespace: str | None) -> bool:
    custom = client.CustomObjectsApi(api)
    try:
        if namespace is None:
            custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
        else:
            custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def peering_problem(
    api: client.ApiClient, name: str, namespaces: Sequence[str] | None
) -> str | None:
    """Why peering `name` cannot work for these namespaces (None: cluster-wide), or None if it
    can. Namespace patterns are not checked: each namespace they match needs its own object."""
    plural = "clusterkopfpeerings" if namespaces is None else "kopfpeerings"
    standalone = "or, if no other operator can act on these jobs, pass --standalone"
    try:
        if not _served(api, plural):
            return (
                f"peering {name!r} cannot work: the CRD {plural}.{GROUP} is not installed, and "
                f"kopf would wait for it without acting on any job. Install kopf's peering "
                f"CRDs (`kubectl apply -f {CRD_FILE}`) and the peering object, as the chart "
                f"does, {standalone}"
            )
        targets = [None] if namespaces is None else [n for n in namespaces if not is_pattern(n)]
        missing = [ns for ns in targets if not _exists(api, plural, name, ns)]
    except ApiException as error:
        return f"cannot check peering {name!r}: HTTP {error.status} {error.reason}; {standalone}"
    if not missing:
        return None
    commands = "; ".join(_create_command(name, ns) for ns in missing)
    where = "cluster-wide" if namespaces is None else f"in {', '.join(map(str, missing))}"
    return (
        f"peering {name!r} cannot work: no peering object {name!r} {where}, and kopf would "
        f"wait for it without acting on any job. Create it ({commands}), as the chart does, "
        f"{standalone}"
    )
