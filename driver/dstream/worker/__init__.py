"""What runs inside Spark's Python workers: the worker daemon, the zip-cache fix, the built-in
apps' task functions, the combine loop and the rate source's line generator.

It imports nothing from dstream outside itself (and only PySpark and the standard library), so
that it can be shipped to workers whose interpreter lacks dstream.
"""
