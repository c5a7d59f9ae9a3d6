"""The app of `settle`'s Kafka burst: a copy, every record as it came (`app.module:
bench.backpressure.copyapp:build`)."""

from __future__ import annotations

from typing import Any


def build(ssc: Any, lines: Any, args: dict[str, Any]) -> Any:
    return lines
