"""Serving the API from inside the driver process, on a background thread."""

from __future__ import annotations

import threading
import time

import uvicorn

from dstream_api.app import app_for
from dstream_api.auth import refuse_open_to_network
from dstream_api.view import JobView

STARTUP_TIMEOUT_S = 30


def serve_in_background(view: JobView, port: int, host: str) -> uvicorn.Server:
    """Start uvicorn on its own thread and return once it listens (so the URL the CLI prints
    works); raises if it cannot bind, or OpenToNetworkError for a non-loopback host without a
    token. Set `server.should_exit = True` to stop it."""
    refuse_open_to_network(host)
    config = uvicorn.Config(app_for(view), host=host, port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="dstream-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the API could not start on {host}:{port} (see the log above)")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the API did not start on {host}:{port} within {STARTUP_TIMEOUT_S} s"
            )
        time.sleep(0.05)
    return server
