"""dstream: discretized streams on PySpark, a maintained successor of pyspark.streaming.

Port a pyspark.streaming program by changing its import::

    from dstream import StreamingContext

The names below are loaded on first use (module `__getattr__`), so that `import dstream`, and
`import dstream.spec` by the operator, load neither PySpark nor any connector's client. The
packages, each importing only those below it: `dstream.service` (the job service and CLI),
`dstream.connectors` (sources and sinks by spec type), this package's API modules (context,
dstream, windows, state, sources, listener), `dstream.runtime` (graph, scheduler, recovery,
checkpoints), `dstream.worker` (what runs in Python workers) and, at the bottom, `dstream.spec`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dstream.worker.zipcache import reread_zips_only_when_changed

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.dstream import DStream
    from dstream.listener import StreamingListener
    from dstream.state import State, StateSpec

# Every task of the engine imports this package in its Python worker: from then on, the worker
# stops re-reading Spark's zips and jars before each task (see dstream.worker.zipcache).
reread_zips_only_when_changed()

_EXPORTS = {
    "StreamingContext": "dstream.context",
    "DStream": "dstream.dstream",
    "StreamingListener": "dstream.listener",
    "StateSpec": "dstream.state",
    "State": "dstream.state",
}

__all__ = ["DStream", "State", "StateSpec", "StreamingContext", "StreamingListener"]


def __getattr__(name: str) -> Any:
    """Import the module of a public name on first access and cache the name here."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
