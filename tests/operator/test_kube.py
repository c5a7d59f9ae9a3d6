"""The operator's own API client sends the credentials the kubeconfig loaders provide."""

from __future__ import annotations

import kubernetes
import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from dstream_operator.kube import RETRY_AFTER_ATTEMPTS, Kube, KubeError

pytestmark = pytest.mark.asyncio


async def _serve(answers: list[tuple[int, dict]], headers: dict[int, dict[str, str]] | None = None):
    """A stand-in API server that gives the answers in turn (the last one from then on), with
    `headers[n]` on the n-th (from 1), and records the requests it was sent."""
    seen: list[web.Request] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request)
        status, body = answers[min(len(seen), len(answers)) - 1]
        return web.json_response(body, status=status, headers=(headers or {}).get(len(seen)))

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", seen


@pytest_asyncio.fixture
async def api_server():
    """Answers 404 to everything."""
    runner, url, seen = await _serve([(404, {"kind": "Status", "code": 404})])
    try:
        yield url, seen
    finally:
        await runner.cleanup()


def _kubeconfig(path, server: str, token: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )


async def test_kubeconfig_token_is_sent_as_bearer(api_server, tmp_path, monkeypatch):
    """Regression: the loaders keep the token under `BearerToken`; reading only the
    `authorization` alias sent no credentials, and a real API server answered 403."""
    url, seen = api_server
    _kubeconfig(tmp_path / "config", url, "s3cret")
    # read from KUBECONFIG when the module is imported, as a process's environment is
    monkeypatch.setattr(
        kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "config")
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube = Kube.from_environment()
    try:
        assert await kube.get("v1", "Pod", "jobs", "absent") is None
    finally:
        await kube.close()
    assert [r.headers.get("Authorization") for r in seen] == ["Bearer s3cret"]


async def _applied(
    answers: list[tuple[int, dict]], kind: str, *exists: bool, owner: str | None = None
) -> list[tuple]:
    """(method, path) of the requests that applying an object (owned by `owner`, a uid) once
    per `exists` sent."""
    runner, url, seen = await _serve(answers)
    kube = Kube(kubernetes.client.Configuration(host=url))
    obj: dict = {"apiVersion": "v1", "kind": kind, "metadata": {"name": "x", "namespace": "jobs"}}
    if owner is not None:
        obj["metadata"]["ownerReferences"] = [{"kind": "StreamingJob", "name": "x", "uid": owner}]
    try:
        for known in exists:
            await kube.apply(obj, exists=known)
    finally:
        await kube.close()
        await runner.cleanup()
    return [(r.method, r.path) for r in seen]


async def test_apply_creates_again_what_vanished_between_create_and_patch():
    """Regression: a job deleted and created again found its ServiceAccount still there (409),
    the garbage collector removed it before the patch (404), and the driver pod was refused
    for want of it. `apply` now creates it anew."""
    answers = [(409, {"code": 409}), (404, {"code": 404}), (201, {"metadata": {"name": "x"}})]
    assert await _applied(answers, "ServiceAccount", False) == [
        ("POST", "/api/v1/namespaces/jobs/serviceaccounts"),
        ("PATCH", "/api/v1/namespaces/jobs/serviceaccounts/x"),
        ("POST", "/api/v1/namespaces/jobs/serviceaccounts"),
    ]


async def test_apply_creates_again_what_went_while_it_was_patched():
    """A job deleted and created again: its predecessor's Service, being removed by the
    garbage collector as it was patched, made the API server answer 409 to the patch."""
    gone = {"code": 409, "message": "Precondition failed: UID in precondition"}
    answers = [(409, {"code": 409}), (409, gone), (201, {"metadata": {"name": "x"}})]
    assert await _applied(answers, "Service", False) == [
        ("POST", "/api/v1/namespaces/jobs/services"),
        ("PATCH", "/api/v1/namespaces/jobs/services/x"),
        ("POST", "/api/v1/namespaces/jobs/services"),
    ]


async def test_apply_replaces_what_another_owner_owns_and_patches_its_own():
    """A job deleted and created again: its predecessor's ConfigMap, not collected yet, is
    deleted and made anew (patched, the collector could still delete it a moment later); one
    the job owns already is patched."""
    predecessors = {"metadata": {"name": "x", "uid": "cm-1", "ownerReferences": [{"uid": "old"}]}}
    answers = [(409, {}), (200, predecessors), (200, {}), (201, {"metadata": {"name": "x"}})]
    assert await _applied(answers, "ConfigMap", False, owner="new") == [
        ("POST", "/api/v1/namespaces/jobs/configmaps"),
        ("GET", "/api/v1/namespaces/jobs/configmaps/x"),
        ("DELETE", "/api/v1/namespaces/jobs/configmaps/x"),
        ("POST", "/api/v1/namespaces/jobs/configmaps"),
    ]
    own = {"metadata": {"name": "x", "uid": "cm-2", "ownerReferences": [{"uid": "new"}]}}
    answers = [(409, {}), (200, own), (200, own)]
    assert await _applied(answers, "ConfigMap", False, owner="new") == [
        ("POST", "/api/v1/namespaces/jobs/configmaps"),
        ("GET", "/api/v1/namespaces/jobs/configmaps/x"),
        ("PATCH", "/api/v1/namespaces/jobs/configmaps/x"),
    ]


async def test_apply_patches_first_what_exists_and_creates_it_if_it_vanished():
    """One round trip for a known child; a child deleted meanwhile is created again."""
    answers = [(200, {"metadata": {"name": "x"}}), (404, {"code": 404}), (201, {})]
    assert await _applied(answers, "ConfigMap", True, True) == [
        ("PATCH", "/api/v1/namespaces/jobs/configmaps/x"),
        ("PATCH", "/api/v1/namespaces/jobs/configmaps/x"),
        ("POST", "/api/v1/namespaces/jobs/configmaps"),
    ]


TOKEN_NOT_YET = {
    "kind": "Status",
    "code": 500,
    "reason": "ServerTimeout",
    "message": 'No API token found for service account "job-driver", retry after the token is '
    "automatically created and added to the service account",
    "details": {"name": "create pod", "kind": "serviceaccounts", "retryAfterSeconds": 1},
}
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job-driver", "namespace": "jobs"}}


async def test_an_answer_with_retry_after_is_sent_again_after_the_delay():
    """Regression: a driver pod created right after its new ServiceAccount was refused with
    500 and Retry-After: 1 (Kubernetes 1.20's token controller had not run yet); the operator
    counted an error instead of asking again as the API server said to."""
    runner, url, seen = await _serve(
        [(500, TOKEN_NOT_YET), (201, POD)], headers={1: {"Retry-After": "1"}}
    )
    kube = Kube(kubernetes.client.Configuration(host=url))
    try:
        assert await kube.create(POD) == POD
    finally:
        await kube.close()
        await runner.cleanup()
    assert [r.method for r in seen] == ["POST", "POST"]


async def test_a_failure_without_retry_after_or_that_persists_is_raised():
    runner, url, seen = await _serve([(500, TOKEN_NOT_YET)])
    kube = Kube(kubernetes.client.Configuration(host=url))
    try:
        with pytest.raises(KubeError, match="HTTP 500: .*No API token found"):
            await kube.create(POD)
        assert len(seen) == 1
    finally:
        await kube.close()
        await runner.cleanup()
    every = {n: {"Retry-After": "0"} for n in range(1, 10)}
    runner, url, seen = await _serve([(429, {"code": 429})], headers=every)
    kube = Kube(kubernetes.client.Configuration(host=url))
    try:
        with pytest.raises(KubeError, match="HTTP 429"):
            await kube.create(POD)
        assert len(seen) == RETRY_AFTER_ATTEMPTS
    finally:
        await kube.close()
        await runner.cleanup()
