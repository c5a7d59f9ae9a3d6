"""Errors that come back from Spark tasks, read in one place.

An exception raised in a Python task reaches the driver only as text: the task's traceback
inside Spark's error (a Py4JJavaError, or PySpark's PythonException), which a sink may wrap
again. The engine recognises its own exceptions there (a source that lost its input, a durable
part that storage refused) by the exception's qualified name; a failure in the JVM itself is
named by the innermost cause of its Java exception.
"""

from __future__ import annotations

from py4j.protocol import Py4JJavaError


def raised_in_task(error: BaseException, kind: type[BaseException]) -> str | None:
    """The message of the `kind` exception behind `error`, looked for in `error` and its
    cause: the exception itself when raised on the driver, else the first line after its
    qualified name in Spark's text. None when there is none."""
    marker = f"{kind.__module__}.{kind.__qualname__}:"
    for layer in (error, error.__cause__):
        if layer is None:
            continue
        if isinstance(layer, kind):
            return str(layer)
        text = str(layer)
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0].strip()
    return None


def jvm_root_cause(error: Py4JJavaError) -> str:
    """The innermost cause of a JVM error, as `<class>: <message>`."""
    cause = error.java_exception
    while cause.getCause() is not None:
        cause = cause.getCause()
    return str(cause.toString())
