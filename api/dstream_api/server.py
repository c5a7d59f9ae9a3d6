"""Serving the API from inside the driver process, on a background thread."""

from __future__ import annotations

import threading
from typing import Any

import uvicorn

from dstream_api.app import create_app


def serve_in_background(runtime: Any, port: int, host: str = "0.0.0.0") -> uvicorn.Server:
    """Start uvicorn on its own thread; set `server.should_exit = True` to stop it."""
    config = uvicorn.Config(create_app(runtime), host=host, port=port, log_level="warning")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, name="dstream-api", daemon=True).start()
    return server
