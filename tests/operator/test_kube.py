"""The operator's own API client sends the credentials the kubeconfig loaders provide."""

from __future__ import annotations

import kubernetes
import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from dstream_operator.kube import Kube

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def api_server():
    """A stand-in API server that answers 404 to everything and records what it was sent."""
    seen: list[web.Request] = []

    async def not_found(request: web.Request) -> web.Response:
        seen.append(request)
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
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
