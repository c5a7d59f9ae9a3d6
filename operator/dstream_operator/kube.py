"""A small asynchronous Kubernetes client for the few kinds the operator writes.

kopf already runs an asyncio loop with aiohttp; the operator's own writes go through the same
stack instead of a threaded client, and objects stay plain dicts from `resources`, end to end.
Credentials come from the official client's configuration loaders (in-cluster or kubeconfig).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import quote

import aiohttp
import kubernetes

PLURALS = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "StreamingJob": "streamingjobs",
    "Event": "events",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Ingress": "ingresses",
    "Lease": "leases",
}
RETRY_AFTER_ATTEMPTS = 5  # answers with Retry-After honoured per request, as client-go does
RETRY_AFTER_MAX_S = 10.0


def configuration_from_environment() -> kubernetes.client.Configuration:
    """In a pod: its ServiceAccount; elsewhere: the current kubeconfig context."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    return configuration


class KubeError(Exception):
    """A failed API call, with the HTTP status the API server answered."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def retry_after(response: aiohttp.ClientResponse) -> float | None:
    """Seconds the API server asked to wait before sending a request again; None if it did not
    ask (only 429 and 5xx answers may, and only in seconds)."""
    value = response.headers.get("Retry-After", "")
    if (response.status != 429 and response.status < 500) or not value.isdigit():
        return None
    return min(float(value), RETRY_AFTER_MAX_S)


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """The REST path of a namespaced collection or of one object in it."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


class Kube:
    """Create, read, merge-patch and delete namespaced objects given as dicts."""

    def __init__(self, configuration: kubernetes.client.Configuration):
        self._configuration = configuration
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(cls) -> Kube:
        return cls(configuration_from_environment())

    def _ssl(self) -> ssl.SSLContext | bool:
        config = self._configuration
        if not config.host.startswith("https"):
            return False
        if not config.verify_ssl:
            return False
        context = ssl.create_default_context(cafile=config.ssl_ca_cert)
        if config.cert_file:
            context.load_cert_chain(config.cert_file, config.key_file)
        return context

    def _headers(self) -> dict[str, str]:
        """The bearer token as the official client would send it. The loaders store it under
        `BearerToken` (the `authorization` key is only an alias), and reading it through
        `auth_settings` runs the hook that re-reads a projected ServiceAccount token."""
        bearer = self._configuration.auth_settings().get("BearerToken")
        return {"Authorization": bearer["value"]} if bearer and bearer["value"] else {}

    async def _request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any] | None:
        """The decoded answer; None for 404; KubeError for any other failure. An answer with
        Retry-After (429, or a 5xx such as "No API token found for service account" while the
        token controller has yet to fill in a new ServiceAccount) did nothing: it is sent
        again after the delay asked, a few times, before it counts as a failure."""
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl())
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=30)
            )
        headers = self._headers() | {"Content-Type": content_type}
        url = self._configuration.host.rstrip("/") + path
        attempt = 1
        while True:
            async with self._session.request(method, url, json=body, headers=headers) as response:
                if response.status == 404:
                    return None
                if response.status < 400:
                    return await response.json(content_type=None)
                delay = retry_after(response)
                if delay is None or attempt == RETRY_AFTER_ATTEMPTS:
                    raise KubeError(response.status, await response.text())
            attempt += 1
            await asyncio.sleep(delay)

    async def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create; None if it already exists (creation is how the operator claims a name)."""
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        try:
            return await self._request("POST", path, obj)
        except KubeError as error:
            if error.status == 409:
                return None
            raise

    async def apply(self, obj: dict[str, Any], attempts: int = 3, exists: bool = False) -> None:
        """Create, or bring an existing object's fields to the given values. An object can
        vanish between the two (the garbage collector removing a predecessor's child after a
        job was deleted and created again): then it is created anew. One that `exists` (as
        far as the caller knows) is patched first: one round trip, not a refused create and
        then a patch."""
        meta = obj["metadata"]
        path = (obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        for _ in range(attempts):
            if not exists and await self.create(obj) is not None:
                return
            if not exists and await self._deleted_if_anothers(path, obj):
                continue
            if await self._patch_unless_going(path, obj) is not None:
                return
            exists = False
        raise KubeError(409, f"{obj['kind']} {meta['name']} kept vanishing while applied")

    async def _deleted_if_anothers(
        self, path: tuple[str, str, str, str], obj: dict[str, Any]
    ) -> bool:
        """Delete the live object of that name if another owner owns it (a deleted job's
        child, not collected yet, when a job of the same name is created); True if it is gone.
        Patched instead, it would keep its identity, which the garbage collector may already
        have marked for deletion: the new job's child would then go a moment later."""
        owners = {ref["uid"] for ref in obj["metadata"].get("ownerReferences") or []}
        if not owners:
            return False
        live = await self.get(*path)
        if live is None:
            return True
        live_owners = {ref.get("uid") for ref in live["metadata"].get("ownerReferences") or []}
        if not live_owners or owners & live_owners:
            return False
        await self.delete(*path, uid=live["metadata"]["uid"])
        return True

    async def _patch_unless_going(
        self, path: tuple[str, str, str, str], obj: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Patch; None if the object is gone, or went while it was patched (the API server
        then answers 409, not 404: seen with a predecessor's Service that the garbage collector
        deleted just then)."""
        try:
            return await self.patch(*path, obj)
        except KubeError as error:
            if error.status == 409:
                return None
            raise

    async def get(
        self, api_version: str, kind: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        return await self._request("GET", object_path(api_version, kind, namespace, name))

    async def list_by_labels(
        self, api_version: str, kind: str, namespace: str, labels: dict[str, str]
    ) -> list[dict[str, Any]]:
        """The objects of a kind in a namespace that carry all of `labels`. The API server
        selects them; each is checked again here, so a server that ignores the selector (an
        emulator) cannot hand back other objects."""
        selector = ",".join(f"{key}={value}" for key, value in labels.items())
        path = object_path(api_version, kind, namespace)
        found = await self._request("GET", f"{path}?labelSelector={quote(selector)}")
        items = (found or {}).get("items") or []
        return [
            item
            for item in items
            if labels.items() <= ((item.get("metadata") or {}).get("labels") or {}).items()
        ]

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any] | None:
        """JSON merge patch; None if the object is gone."""
        path = object_path(api_version, kind, namespace, name)
        if subresource:
            path = f"{path}/{subresource}"
        return await self._request("PATCH", path, patch, "application/merge-patch+json")

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, uid: str | None = None
    ) -> bool:
        """Delete with the object's own grace period; False if it was already gone, or if a
        `uid` is given and the object of that name is another one (a successor)."""
        path = object_path(api_version, kind, namespace, name)
        if uid is None:
            return await self._request("DELETE", path) is not None
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            return await self._request("DELETE", path, options) is not None
        except KubeError as error:
            if error.status == 409:
                return False
            raise

    async def serves(self, api_version: str, plural: str) -> bool:
        """Whether the API server serves this resource in this group version (discovery)."""
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        found = await self._request("GET", base)
        return any(r.get("name") == plural for r in (found or {}).get("resources") or [])

    async def first_served(self, api_versions: tuple[str, ...], plural: str) -> str:
        """The first of `api_versions` that the API server serves `plural` in."""
        for api_version in api_versions:
            if await self.serves(api_version, plural):
                return api_version
        raise KubeError(404, f"none of {', '.join(api_versions)} serves {plural}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
