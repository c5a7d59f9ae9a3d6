"""dstream: discretized streams on PySpark, a maintained successor of pyspark.streaming.

Port a pyspark.streaming program by changing its import::

    from dstream import StreamingContext

The names below load on first use: Python workers import this package for the engine's task
functions, and the operator for the job spec, neither of which needs the StreamingContext.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dstream.zipcache import reread_zips_only_when_changed

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.dstream import DStream
    from dstream.listener import StreamingListener

# Every task of the engine imports this package in its Python worker: from then on, the worker
# stops re-reading Spark's zips and jars before each task (see dstream.zipcache).
reread_zips_only_when_changed()

_PUBLIC = {
    "DStream": "dstream.dstream",
    "StreamingContext": "dstream.context",
    "StreamingListener": "dstream.listener",
}
__all__ = ["DStream", "StreamingContext", "StreamingListener"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'dstream' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
