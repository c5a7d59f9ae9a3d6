"""Waiting on a condition with a timeout: the tests' one polling loop.

A test never sleeps for a fixed time in the hope that something has happened; it waits until it
has, and a wait that times out says what it waited for and the last thing it saw.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

T = TypeVar("T")

Message = str | Callable[[], str]
Ignored = type[BaseException] | tuple[type[BaseException], ...]
LAST_SEEN_CHARS = 1000


def eventually(
    condition: Callable[[], T],
    timeout: float,
    *,
    interval: float = 0.05,
    message: Message = "",
    ignoring: Ignored = (),
) -> T:
    """The first truthy value of `condition()`, tried every `interval` seconds until `timeout`
    seconds have passed, then an AssertionError naming what was awaited (`message`, or the
    condition's own name; a callable message is called then, to add a log's tail) and the last
    value seen. An exception of a type in `ignoring` (a server not up yet) counts as a false
    value; any other is raised at once, so a condition that finds the waited-for process dead
    can end the wait with its own error."""
    polls = _polls(condition, timeout, interval, message, ignoring)
    try:
        while True:
            time.sleep(next(polls))
    except StopIteration as met:
        return met.value


async def eventually_async(
    condition: Callable[[], T],
    timeout: float,
    *,
    interval: float = 0.05,
    message: Message = "",
    ignoring: Ignored = (),
) -> T:
    """`eventually` for a test that runs in an event loop: it sleeps with `asyncio.sleep`, so
    the loop's tasks (an in-process operator) run while it waits."""
    polls = _polls(condition, timeout, interval, message, ignoring)
    try:
        while True:
            await asyncio.sleep(next(polls))
    except StopIteration as met:
        return met.value


def _polls(
    condition: Callable[[], T],
    timeout: float,
    interval: float,
    message: Message,
    ignoring: Ignored,
) -> Generator[float, None, T]:
    """Tries the condition, yielding the time to sleep before the next try; returns its value
    once true. The last try comes at the deadline, not an interval before it."""
    deadline = time.monotonic() + timeout
    while True:
        last: Any
        try:
            last = condition()
        except ignoring as error:
            last = error
        else:
            if last:
                return last
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(_timed_out(condition, timeout, message, last))
        yield min(interval, remaining)


def _timed_out(condition: Callable[[], Any], timeout: float, message: Message, last: Any) -> str:
    what = (message() if callable(message) else message) or getattr(
        condition, "__qualname__", repr(condition)
    )
    seen = repr(last)
    if len(seen) > LAST_SEEN_CHARS:
        seen = seen[:LAST_SEEN_CHARS] + "..."
    return f"not within {timeout:g} s (last seen: {seen}): {what}"
