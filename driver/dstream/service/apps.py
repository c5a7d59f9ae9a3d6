"""Built-in apps (the D-Stream paper's workloads) and the loader for user modules.

An app is `build(ssc, stream, args) -> DStream`: it turns the source stream into the stream that
the sink writes. Built-ins register their main stream for interactive queries by name.
"""

from __future__ import annotations

import functools
import importlib
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dstream.dstream import DStream
from dstream.spec import App, GrepArgs, SessionsArgs, TopkArgs, WordcountArgs, duration_ms
from dstream.worker import tasks

if TYPE_CHECKING:
    from dstream.context import StreamingContext


def _seconds(duration: str) -> float:
    return duration_ms(duration) / 1000


def _words(lines: DStream) -> DStream:
    """(word, count) pairs, each word once per partition (combined before the shuffle)."""
    return lines.mapPartitions(tasks.count_words)


def wordcount(ssc: StreamingContext, lines: DStream, args: WordcountArgs) -> DStream:
    """Word counts per batch or, with a window, over the window (incrementally, with an inverse)."""
    if args.window is None:
        counts = _words(lines).reduceByKey(operator.add)
    else:
        counts = _windowed_counts(lines, args.window, args.slide)
    ssc.registerQueryStream("counts", counts)
    return counts


def _windowed_counts(lines: DStream, window: str, slide: str | None) -> DStream:
    """Word counts over the window, incrementally (inverse reduce); words that left are dropped."""
    return _words(lines).reduceByKeyAndWindow(
        operator.add,
        operator.sub,
        _seconds(window),
        _seconds(slide) if slide else None,
        filterFunc=lambda kv: kv[1] > 0,
    )


def grep(ssc: StreamingContext, lines: DStream, args: GrepArgs) -> DStream:
    """How many lines of each batch match the regular expression `pattern`."""
    matching = lines.mapPartitions(functools.partial(tasks.matching_lines, args.pattern))
    ssc.registerQueryStream("matches", matching)
    return matching.count()


def topk(ssc: StreamingContext, lines: DStream, args: TopkArgs) -> DStream:
    """The k most frequent words over the window: per-partition top k, then one final merge."""
    counts = _windowed_counts(lines, args.window, args.slide)
    ssc.registerQueryStream("counts", counts)
    k = args.k
    # One top-k list per partition, merged by reduce() on the driver: the window's partitions
    # stay in parallel tasks (coalesce(1) would compute them all in one task).
    local = counts.mapPartitions(lambda kvs: [tasks.largest(k, kvs)])
    merged = local.reduce(lambda a, b: tasks.largest(k, a + b))
    return merged.flatMap(lambda top: top)


def sessions(ssc: StreamingContext, lines: DStream, args: SessionsArgs) -> DStream:
    """Active sessions: a line's first word is its user; a session ends after `timeout` idle."""
    events = lines.flatMap(lambda line: [(line.split()[0], 1)] if line.strip() else [])
    active = events.track(
        init=lambda _user, _event: {"events": 1},
        update=lambda _user, session, _event: {"events": session["events"] + 1},
        timeout=_seconds(args.timeout),
    )
    ssc.registerQueryStream("sessions", active)
    return active.mapValues(lambda session: session["events"])


BUILTINS: dict[str, Callable[..., DStream]] = {
    "wordcount": wordcount,
    "grep": grep,
    "topk": topk,
    "sessions": sessions,
}


def load_user_build(module_ref: str) -> Callable[..., Any]:
    """Import `pkg.mod:build`; errors name what was not found."""
    module_name, _, attribute = module_ref.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attribute!r}") from None


def build_app(ssc: StreamingContext, source: DStream, app: App) -> list[DStream]:
    """The output stream(s) of the job's app."""
    if app.builtin is not None:
        return [BUILTINS[app.builtin](ssc, source, app.builtin_args())]
    outputs = load_user_build(app.module or "")(ssc, source, dict(app.args))
    if isinstance(outputs, DStream):
        return [outputs]
    if isinstance(outputs, (list, tuple)) and all(isinstance(o, DStream) for o in outputs):
        return list(outputs)
    raise TypeError(f"{app.module} must return a DStream or a list of DStreams, got {outputs!r}")
