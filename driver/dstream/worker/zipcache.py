"""Keep Python workers from re-reading every zip on sys.path before each task.

PySpark's worker calls `importlib.invalidate_caches()` at the start of every task, and on
Python 3.11 that makes each `zipimporter` on sys.path re-read its archive's whole directory at
once. Spark puts pyspark.zip, py4j's zip and the 5,000-entry spark-core jar on the workers'
path, so this costs tens of milliseconds per task: most of a small streaming task's time.
Once the engine's code is loaded in a worker, a zip's directory is re-read only when the archive
has changed on disk (Python 3.12 makes the re-read lazy instead; there this does nothing).
"""

from __future__ import annotations

import os
import sys
import zipimport

_MARK = "_dstream_archive_stat"


def reread_zips_only_when_changed() -> None:
    """Make zipimporter.invalidate_caches skip archives whose size and mtime are unchanged."""
    if sys.version_info >= (3, 12) or getattr(zipimport.zipimporter, _MARK, False):
        return
    reread = zipimport.zipimporter.invalidate_caches

    def invalidate_caches(self: zipimport.zipimporter) -> None:
        try:
            stat = os.stat(self.archive)
            seen = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            seen = None
        if seen is None or getattr(self, _MARK, None) != seen:
            reread(self)
            setattr(self, _MARK, seen)

    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    setattr(zipimport.zipimporter, _MARK, True)
