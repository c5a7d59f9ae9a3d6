"""The expiry rule of the drivers' Kubernetes Lease (runtime/kube_lease.py), on a given clock;
taking, renewing and releasing the Lease are tested on the real API server
(tests/k8s/test_driver_lease.py)."""

from __future__ import annotations

import pytest
from dstream.runtime.leadership.kube_lease import ExpiryClock, LeaseView, kube_lease


def lease(holder: str | None, renewed: str = "t1") -> LeaseView:
    return LeaseView(holder=holder, renewed=renewed, duration_s=3, transitions=0, version="1")


def test_a_lease_is_free_when_unheld_held_by_us_or_unrenewed_for_its_duration():
    clock = ExpiryClock()
    assert clock.free_for(lease(None), "b", now=0)
    assert clock.free_for(lease("b"), "b", now=0)
    assert not clock.free_for(lease("a"), "b", now=100)  # first seen now: the wait starts
    assert not clock.free_for(lease("a"), "b", now=102.9)
    assert clock.free_for(lease("a"), "b", now=103)


def test_a_renewal_starts_the_wait_again_whatever_the_clocks_say():
    """Only a change of renewTime counts, timed on this machine: the holder's clock may be
    hours off without shortening or lengthening the wait."""
    clock = ExpiryClock()
    assert not clock.free_for(lease("a", "t1"), "b", now=0)
    assert not clock.free_for(lease("a", "t2"), "b", now=2.5)
    assert not clock.free_for(lease("a", "t2"), "b", now=5)
    assert clock.free_for(lease("a", "t2"), "b", now=5.5)
    assert not clock.free_for(lease("c", "t2"), "b", now=6)  # a new holder: wait again


@pytest.mark.parametrize("where", ["ns", "ns/", "/name", "ns/name/x"])
def test_the_lease_setting_must_name_namespace_and_lease(where):
    with pytest.raises(ValueError, match="spark.dstream.lease.kubernetes must be"):
        kube_lease(where, 10)
