"""One step of an incremental window in a partition: old window - leaving + entering.

The window's previous RDD (cached) is united with the leaving and the entering batches'
reductions, which share its hash partitioner, and each partition is walked once. The batches'
values come wrapped (`Leaving`, `Entering`) and the old window's plain: tagging the old window
too would take an RDD of its own, whose tasks unpickle the whole window, tag it and pickle it
again every batch, and one more JVM RDD for the driver to make. A window's value is whatever
the user's functions return, never one of these wrappers, so the type tells them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


class _Change:
    """A value of a batch that changes the window (pickled as its class and its value)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __reduce__(self) -> tuple[type, tuple[Any]]:
        return type(self), (self.value,)


class Leaving(_Change):
    """A value of a batch leaving the window: subtracted with the inverse function."""


class Entering(_Change):
    """A value of a batch entering the window: added with the reduce function."""


@dataclass(frozen=True)
class WindowStep:
    """A partition's new window from its old window's records and the changes' (records
    `(key, value)`, `(key, Leaving(value))`, `(key, Entering(value))`, in any order):
    subtract what leaves, add what enters, keep the pairs `keep` accepts (all without it)."""

    func: Callable[[Any, Any], Any]
    inv_func: Callable[[Any, Any], Any]
    keep: Callable[[tuple[Any, Any]], bool] | None

    def __call__(self, records: Iterable[tuple[Any, Any]]) -> Iterable[tuple[Any, Any]]:
        window: dict[Any, Any] = {}
        gone: dict[Any, Any] = {}
        new: dict[Any, Any] = {}
        for key, value in records:
            kind = type(value)
            if kind is Leaving:
                gone[key] = value.value
            elif kind is Entering:
                new[key] = value.value
            else:
                window[key] = value
        func, inv_func = self.func, self.inv_func
        for key, value in gone.items():
            if key in window:
                window[key] = inv_func(window[key], value)
        for key, value in new.items():
            window[key] = func(window[key], value) if key in window else value
        return filter(self.keep, window.items()) if self.keep else window.items()
