"""The leader election's pure parts: when a Lease is free, its timing, the CLI."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from dstream_operator.leader import LeaseSettings, free_for, lease_body, micro_time
from dstream_operator.main import lease_settings, parse_args


def lease(holder: str | None, seconds: int = 15) -> dict:
    return {"spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds}}


def test_a_lease_is_free_when_unheld_ours_or_unrenewed_for_its_duration():
    assert free_for(lease(None), "me", seen_renewal_at=100.0, now=100.0)
    assert free_for(lease("me"), "me", seen_renewal_at=100.0, now=100.0)
    assert not free_for(lease("other"), "me", seen_renewal_at=100.0, now=114.9)
    assert free_for(lease("other"), "me", seen_renewal_at=100.0, now=115.0)


def test_the_lease_body_uses_micro_time():
    moment = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    body = lease_body(LeaseSettings("ops", "dstream", "pod-a"), moment, moment)
    assert body["spec"] == {
        "holderIdentity": "pod-a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-02T03:04:05.000006Z",
        "renewTime": micro_time(moment),
    }


def test_a_leader_stops_acting_before_a_standby_may_take_over(monkeypatch):
    monkeypatch.setenv("POD_ID", "dstream-7f9-abc")
    settings = lease_settings(parse_args(["-A", "--lease", "ops/dstream", "--lease-seconds", "9"]))
    assert (settings.namespace, settings.name, settings.identity) == (
        "ops",
        "dstream",
        "dstream-7f9-abc",
    )
    assert settings.renew_seconds == 3 and settings.deadline_seconds == 6
    assert settings.deadline_seconds < settings.lease_seconds
    assert lease_settings(parse_args(["-A"])) is None
    with pytest.raises(SystemExit):
        parse_args(["-A", "--lease", "no-namespace"])
    with pytest.raises(SystemExit):
        parse_args(["-A", "--lease", "a/b", "--standalone"])
