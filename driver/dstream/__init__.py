"""dstream: discretized streams on PySpark, a maintained successor of pyspark.streaming.

Port a pyspark.streaming program by changing its import::

    from dstream import StreamingContext
"""

from dstream.context import StreamingContext
from dstream.dstream import DStream
from dstream.listener import StreamingListener

__all__ = ["DStream", "StreamingContext", "StreamingListener"]
