"""Conversions between pyspark.streaming's time arguments (seconds, datetimes) and milliseconds."""

from __future__ import annotations

from datetime import datetime


def duration_to_ms(seconds: float) -> int:
    """pyspark.streaming takes durations in seconds; the engine works in whole milliseconds."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"duration must be positive, got {seconds!r} s")
    return ms


def time_to_ms(value: datetime | float) -> int:
    """A datetime or a unix timestamp in seconds, as epoch milliseconds."""
    if isinstance(value, datetime):
        return round(value.timestamp() * 1000)
    return round(value * 1000)


def datetime_of(time_ms: int) -> datetime:
    """Batch time as the local datetime that pyspark.streaming hands to user functions."""
    return datetime.fromtimestamp(time_ms / 1000)
