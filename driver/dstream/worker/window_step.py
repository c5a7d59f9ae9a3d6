"""One step of an incremental window in a partition: old window - leaving + entering.

The window's previous RDD (cached) is united with the entering batches' reductions (and the
leaving ones that are not written durably), which share its hash partitioner, and each
partition is walked once; a leaving batch written durably is read from its part here. The batches'
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
    `(key, value)`, `(key, Leaving(value))`, `(key, Entering(value))`, in any order), and the
    leaving batches that `leaving_parts` read (`read(index, ())`: the partition's part of a
    batch written durably, hash-partitioned as the window): subtract what leaves, add what
    enters, keep the pairs `keep` accepts (all without it). Reading a leaving batch's part
    here spares it an RDD, a union and a pass through the JVM of its own."""

    func: Callable[[Any, Any], Any]
    inv_func: Callable[[Any, Any], Any]
    keep: Callable[[tuple[Any, Any]], bool] | None
    leaving_parts: tuple[Callable[[int, Iterable[Any]], Iterable[tuple[Any, Any]]], ...] = ()

    def __call__(self, index: int, records: Iterable[tuple[Any, Any]]) -> Iterable[tuple[Any, Any]]:
        func, inv_func = self.func, self.inv_func
        window: dict[Any, Any] = {}
        gone: dict[Any, Any] = {}
        new: dict[Any, Any] = {}

        def leave(key: Any, value: Any) -> None:
            gone[key] = func(gone[key], value) if key in gone else value

        for key, value in records:
            kind = type(value)
            if kind is Leaving:
                leave(key, value.value)
            elif kind is Entering:
                new[key] = value.value
            else:
                window[key] = value
        for read in self.leaving_parts:
            for key, value in read(index, ()):
                leave(key, value)
        for key, value in gone.items():
            if key in window:
                window[key] = inv_func(window[key], value)
        for key, value in new.items():
            window[key] = func(window[key], value) if key in window else value
        return filter(self.keep, window.items()) if self.keep else window.items()
