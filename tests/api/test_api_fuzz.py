"""Schemathesis fuzzing: every operation, with generated (valid and invalid) parameters, answers
with a documented status code and a body that matches its documented schema; never a 500.

Runs against the fake job so that it is fast and deterministic; the example count is bounded.
"""

from __future__ import annotations

import pytest
import schemathesis
from dstream_api.app import Time, app_for, epoch_ms
from dstream_api.auth import TOKEN_ENV, TOKEN_FILE_ENV
from fakejob import FakeJob
from hypothesis import HealthCheck, settings
from pydantic import TypeAdapter, ValidationError
from schemathesis.checks import positive_data_acceptance

TOKEN = "fuzz-token"
TIME = TypeAdapter(Time)

schema = schemathesis.openapi.from_asgi("/openapi.json", app_for(FakeJob(batches=5)))


@pytest.fixture(autouse=True)
def token(monkeypatch):
    """With a token configured, the auth checks also verify that /v1/stop refuses without it."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)


def inverted_range(case) -> bool:
    """`from` after `to` is refused with 422, a rule between two parameters that a schema cannot
    express; only for such cases may a schema-valid request be rejected."""
    query = case.query or {}
    if query.get("from") is None or query.get("to") is None:
        return False
    try:
        start, end = (epoch_ms(name, TIME.validate_python(query[name])) for name in ("from", "to"))
    except ValidationError:  # a negative (schema-invalid) case: every check applies
        return False
    return start > end


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_honours_its_documented_contract(case):
    excluded = [positive_data_acceptance] if inverted_range(case) else []
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, excluded_checks=excluded)
