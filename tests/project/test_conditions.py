"""The tests' one polling loop (tests/conditions.py): what it returns, and what a wait that
times out says."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest
from conditions import eventually, eventually_async


def counting_to(target: int) -> Callable[[], int]:
    """A condition whose n-th call returns n once n reaches `target`, and 0 before."""
    calls = itertools.count(1)
    return lambda: n if (n := next(calls)) >= target else 0


def test_eventually_returns_the_first_true_value():
    assert eventually(counting_to(3), 60, interval=0) == 3


def test_a_timeout_names_what_was_awaited_and_the_last_value_seen():
    with pytest.raises(AssertionError, match=r"not within 0.1 s \(last seen: \[\]\): the batches"):
        eventually(list, 0.1, message="the batches")
    with pytest.raises(AssertionError, match=r"\(last seen: 0\): what the log says"):
        eventually(int, 0, message=lambda: "what the log says")


def test_without_a_message_the_condition_names_itself():
    def the_server_is_up() -> bool:
        return False

    with pytest.raises(AssertionError, match="the_server_is_up"):
        eventually(the_server_is_up, 0)


def test_ignored_errors_count_as_false_and_others_end_the_wait():
    attempts = iter([ConnectionError("refused"), ConnectionError("refused"), "up"])

    def answer() -> str:
        outcome = next(attempts)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert eventually(answer, 60, interval=0, ignoring=ConnectionError) == "up"
    with pytest.raises(AssertionError, match=r"last seen: ConnectionError\('refused'\)"):
        eventually(answer_refused, 0, ignoring=ConnectionError)
    with pytest.raises(ValueError, match="died"):
        eventually(died, 60, ignoring=ConnectionError)


def answer_refused() -> str:
    raise ConnectionError("refused")


def died() -> str:
    raise ValueError("the process died")


def test_eventually_async_lets_the_loop_run_what_it_waits_for():
    async def main() -> int:
        done: list[int] = []
        loop = asyncio.get_running_loop()
        loop.call_soon(done.append, 7)  # runs only while the wait yields to the loop
        return await eventually_async(lambda: done and done[0], 60)

    assert asyncio.run(main()) == 7
