"""Reading a driver's REST API (served by the engine: `GET /v1/status`)."""

from __future__ import annotations

import logging

import aiohttp

from dstream_operator.status import DriverReport, driver_report

logger = logging.getLogger(__name__)


async def fetch_report(
    session: aiohttp.ClientSession, base_url: str, timeout_seconds: float
) -> DriverReport | None:
    """The driver's status, or None when it does not answer sensibly (yet): a starting or
    dying driver is normal, and the pod's state already tells that story."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        async with session.get(f"{base_url}/v1/status", timeout=timeout) as response:
            if response.status != 200:
                return None
            return driver_report(await response.json(content_type=None))
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as error:
        logger.debug("driver API at %s not readable: %r", base_url, error)
        return None
