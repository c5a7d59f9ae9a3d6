"""dstream: discretized streams on PySpark, a maintained successor of pyspark.streaming.

Port a pyspark.streaming program by changing its import::

    from dstream import StreamingContext
"""

from dstream.context import StreamingContext
from dstream.dstream import DStream
from dstream.listener import StreamingListener
from dstream.worker.zipcache import reread_zips_only_when_changed

# Every task of the engine imports this package in its Python worker: from then on, the worker
# stops re-reading Spark's zips and jars before each task (see dstream.worker.zipcache).
reread_zips_only_when_changed()

__all__ = ["DStream", "StreamingContext", "StreamingListener"]
