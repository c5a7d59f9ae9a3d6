"""Bearer-token protection of the mutating endpoints.

The token comes from DSTREAM_API_TOKEN, or from the file named by DSTREAM_API_TOKEN_FILE (in a
driver pod, its ServiceAccount token). The file is read on every request so that a rotated
token takes effect without a restart. Without either, the API is open, and so it may only listen on
loopback (a laptop's `dstream run`): `refuse_open_to_network` enforces that before it starts.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

TOKEN_ENV = "DSTREAM_API_TOKEN"
TOKEN_FILE_ENV = "DSTREAM_API_TOKEN_FILE"

bearer = HTTPBearer(
    auto_error=False,
    description=f"Required on mutating endpoints when the driver has a token ({TOKEN_ENV} or "
    f"{TOKEN_FILE_ENV}).",
)


class TokenUnavailableError(RuntimeError):
    """A token file is configured but cannot be read: refuse rather than run open."""


class OpenToNetworkError(RuntimeError):
    """The API would listen beyond this machine with no token protecting POST /v1/stop."""


def configured_token() -> str | None:
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    path = os.environ.get(TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as error:
        raise TokenUnavailableError(f"cannot read {TOKEN_FILE_ENV}={path}: {error}") from None
    if not token:
        raise TokenUnavailableError(f"{TOKEN_FILE_ENV}={path} is empty")
    return token


def require_token(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
    """FastAPI dependency: 401 unless the request carries the configured token (if any)."""
    try:
        expected = configured_token()
    except TokenUnavailableError as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from None
    if expected is None:
        return
    offered = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(offered.encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "a valid bearer token is required",
            headers={"WWW-Authenticate": "Bearer"},
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def refuse_open_to_network(host: str) -> None:
    """Raise OpenToNetworkError unless the API on `host` is reachable from this machine only or
    requires a token: an open POST /v1/stop would let anyone who reaches the address stop the
    job."""
    if is_loopback(host):
        return
    try:
        token = configured_token()
    except TokenUnavailableError as error:
        raise OpenToNetworkError(f"refusing to serve the API on {host}: {error}") from None
    if token is None:
        raise OpenToNetworkError(
            f"refusing to serve the API on {host} without a token: anyone who reaches it could "
            f"stop the job (POST /v1/stop). Set {TOKEN_ENV} (or {TOKEN_FILE_ENV}, a file "
            f"holding it), or leave --host at 127.0.0.1"
        )
