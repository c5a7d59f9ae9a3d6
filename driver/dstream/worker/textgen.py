"""Deterministic text records for the rate source: the same (seed, offset) always gives the same line.

Lines are words drawn from a Zipf-skewed vocabulary, like natural text. Generating each line
with its own random draws would cost more than the streaming job itself, so each worker process
builds a pool of lines once per (seed, size) and an offset picks its line by an integer hash.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from functools import lru_cache

VOCABULARY_SIZE = 10_000
POOL_SIZE = 16_384
ZIPF_EXPONENT = 1.1
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


@lru_cache(maxsize=1)
def vocabulary() -> list[str]:
    """VOCABULARY_SIZE distinct pronounceable words, most frequent (shortest) first."""
    words: list[str] = []
    for length in itertools.count(1):
        for combo in itertools.product(_SYLLABLES, repeat=length):
            words.append("".join(combo))
            if len(words) == VOCABULARY_SIZE:
                return words
    raise AssertionError("unreachable")


@lru_cache(maxsize=8)
def line_pool(seed: int, record_bytes: int) -> tuple[str, ...]:
    """POOL_SIZE lines of exactly record_bytes characters (words, space-separated, padded)."""
    rng = random.Random(seed)
    words = vocabulary()
    weights = list(
        itertools.accumulate(1 / (rank**ZIPF_EXPONENT) for rank in range(1, len(words) + 1))
    )
    draws = _word_draws(rng, words, weights)
    pool = []
    for _ in range(POOL_SIZE):
        line: list[str] = []
        length = 0  # of " ".join(line)
        for word in draws:
            if length + len(word) + 1 > record_bytes:
                break  # this draw is used up, as a fresh draw would have been
            length += len(word) + 1 if line else len(word)
            line.append(word)
        pool.append(" ".join(line).ljust(record_bytes))
    return tuple(pool)


def _word_draws(rng: random.Random, words: list[str], weights: list[float]) -> Iterator[str]:
    """Endless Zipf draws, fetched in chunks: choices(k=n) consumes one random() per word just
    as n calls with k=1 do, so the sequence is the same, without a call per word."""
    while True:
        yield from rng.choices(words, cum_weights=weights, k=4096)


def line_index(seed: int, partition: int, offset: int) -> int:
    """A well-mixed index into the pool (splitmix64 of the record's coordinates)."""
    z = (offset * 0x9E3779B97F4A7C15 + partition * 0xBF58476D1CE4E5B9 + seed) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) % POOL_SIZE


def lines(seed: int, record_bytes: int, partition: int, start: int, end: int) -> list[str]:
    """The records at offsets [start, end) of one partition: line_index inlined, as this loop
    is most of what a rate source's task does."""
    pool = line_pool(seed, record_bytes)
    mask, size = 0xFFFFFFFFFFFFFFFF, POOL_SIZE
    base = partition * 0xBF58476D1CE4E5B9 + seed
    records = []
    for offset in range(start, end):
        z = (offset * 0x9E3779B97F4A7C15 + base) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        records.append(pool[(z ^ (z >> 31)) % size])
    return records
