"""dstream's own code, shipped to the Python workers as PySpark ships pyspark.zip.

Tasks of the engine run dstream's functions in the workers (the combine loop of reduceByKey and
the windows, the built-in apps' functions), so a worker must import `dstream`. A
pyspark.streaming program ported by its import runs wherever pyspark.streaming ran: on executors
whose interpreter has PySpark (through Spark's pyspark.zip) but not dstream, as under
`spark-submit` with another `PYSPARK_PYTHON`, or a cluster image without it. So every
SparkContext that runs a StreamingContext gets the package as a zip through `addPyFile`, which
puts it on the workers' path ahead of an installed copy: the workers then run exactly the
driver's version.
"""

from __future__ import annotations

import hashlib
import tempfile
import zipfile
from pathlib import Path

from pyspark import SparkContext

_PACKAGE = Path(__file__).resolve().parent.parent
_SHIPPED = "_dstream_shipped"


def ship_to_workers(sc: SparkContext) -> None:
    """Add dstream's zip to `sc`'s Python files, once per SparkContext."""
    if getattr(sc, _SHIPPED, False):
        return
    sc.addPyFile(str(package_zip()))
    setattr(sc, _SHIPPED, True)


def package_zip() -> Path:
    """The package's sources as a zip named by their digest: built once per version of the
    code and reused, and never two different zips under one name (Spark refuses that)."""
    sources = sorted(p for p in _PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in sources:
        digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes())
    target = Path(tempfile.gettempdir()) / f"dstream-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".partial", delete=False) as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sources:
                    archive.write(path, Path("dstream") / path.relative_to(_PACKAGE))
        Path(f.name).replace(target)
    return target
