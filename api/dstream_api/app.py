"""The driver's REST API."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI


def create_app(runtime: Any) -> FastAPI:
    app = FastAPI(title="dstream driver API", version="v1")

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/status")
    def status() -> dict[str, Any]:
        scheduler = runtime.scheduler
        last = scheduler.history[-1].to_json() if scheduler and scheduler.history else None
        return {
            "job": runtime.job.metadata.name,
            "state": scheduler.state if scheduler else "starting",
            "lastBatch": last,
        }

    return app
