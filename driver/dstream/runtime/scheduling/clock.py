"""Clocks for the batch timer: the wall clock, and a manual one that tests advance by hand."""

from __future__ import annotations

import threading
import time


class SystemClock:
    """Wall-clock milliseconds; waits are interruptible so that stop() is prompt."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def wait_until(self, target_ms: int, stop: threading.Event) -> bool:
        """Sleep until target_ms; False if `stop` was set first."""
        while not stop.is_set():
            remaining = target_ms - self.now_ms()
            if remaining <= 0:
                return True
            stop.wait(min(remaining, 200) / 1000)
        return False


class ManualClock:
    """A clock that moves only when `advance` is called: batches run as fast as Spark allows."""

    def __init__(self, start_ms: int = 0):
        self._now = start_ms
        self._changed = threading.Condition()

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        with self._changed:
            self._now += ms
            self._changed.notify_all()

    def wait_until(self, target_ms: int, stop: threading.Event) -> bool:
        with self._changed:
            while self._now < target_ms and not stop.is_set():
                self._changed.wait(0.05)
        return not stop.is_set()
