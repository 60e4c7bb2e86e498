"""The exceptions numbagraph raises.

Everything derives from :class:`NumbagraphError`, so ``except
ng.NumbagraphError`` catches any of them. Each also derives from the builtin
exception a Python user would expect (``ValueError`` for a bad value,
``RuntimeError`` for a bad state), so existing handlers keep working.
"""

from __future__ import annotations

__all__ = [
    "NumbagraphError",
    "CaptureError",
    "GraphClosedError",
    "ScalarValueError",
]


class NumbagraphError(Exception):
    """Base class of every numbagraph error."""


class CaptureError(NumbagraphError, RuntimeError):
    """A capture was started, ended or used in a way CUDA does not allow.

    The message names the operation, why it cannot be captured, and what to
    do instead. When numbagraph raises it, the capture has been ended and the
    stream is usable again.
    """


class GraphClosedError(NumbagraphError, RuntimeError):
    """A graph was used after :meth:`CapturedGraph.close`."""


class ScalarValueError(NumbagraphError, ValueError):
    """A value does not fit a :class:`DeviceScalar`'s dtype.

    The device value is left unchanged.
    """
