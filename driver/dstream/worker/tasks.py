"""Functions that the built-in apps run inside Spark tasks.

They live in this small module, not in dstream.service.apps, because a task's functions are pickled by
reference to their module: every Python worker imports that module, and dstream.service.apps pulls in
the job specification (pydantic), which would cost each new worker a fifth of a second.
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any


def count_words(lines: Iterable[str]) -> Iterable[tuple[str, int]]:
    """(word, count) for the words of one partition: counted in Counter's C loop, so that
    combining before the shuffle costs far less than a (word, 1) pair per word."""
    return Counter(itertools.chain.from_iterable(map(str.split, lines))).items()


def matching_lines(pattern: str, lines: Iterable[str]) -> Iterator[str]:
    """The lines containing a match: the compiled pattern's C search is called from filter's C
    loop, so no Python function runs per line."""
    return filter(re.compile(pattern).search, lines)


def largest(k: int, pairs: Iterable[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The k pairs with the largest values (ties: the larger key first)."""
    return heapq.nlargest(k, pairs, key=lambda kv: (kv[1], kv[0]))
