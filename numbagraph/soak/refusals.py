"""Refused operations, over and over: each raises the error the
documentation names for it, and leaves its stream working.

The kinds are those docs/troubleshooting.md, docs/ops.md and
docs/conditionals.md list, from allocating inside a capture to launching a
closed graph. An operation refused inside a capture must end the capture
(``ng.end_capture`` then says it was already ended, and the launch recorded
before the refusal never runs) unless its error is documented to leave the
capture recording (``OpError``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numbagraph as ng  # noqa: I001  (picks the backend before numba.cuda loads)

import numpy as np
from numba import cuda

from .core import Plan, Result, mismatch
from .kernels import bump
from .memory import Gauge

__all__ = ["KINDS", "Kind", "Env", "Rounds", "refusals"]


@dataclass
class Env:
    """Streams, arrays, scalars and graphs made before any refusal."""

    width: int
    s: Any               # the stream refusals are made on
    other: Any
    x: Any               # int64 on s; each replay on s adds one
    y: Any               # int64 on other
    pair: Any            # int64 (8,) on s, for overlapping slices
    one: Any             # DeviceScalar int32 1 on s
    one_other: Any       # DeviceScalar int32 1 on other
    byte: Any            # DeviceScalar uint8 7 on s
    host: np.ndarray
    outside: Any         # an event recorded on other, outside any capture
    graph_other: Any     # a graph captured on other
    closed: Any          # a closed graph

    @classmethod
    def make(cls, width: int) -> "Env":
        """Everything the refusals use, made before any capture begins, with
        ``bump`` compiled and ``x`` zero."""
        s, other = cuda.stream(), cuda.stream()
        x = cuda.to_device(np.zeros(width, np.int64), stream=s)
        y = cuda.to_device(np.zeros(width, np.int64), stream=other)
        pair = cuda.to_device(np.zeros(8, np.int64), stream=s)
        one = ng.DeviceScalar(1, dtype=np.int32, stream=s)
        one_other = ng.DeviceScalar(1, dtype=np.int32, stream=other)
        byte = ng.DeviceScalar(7, dtype=np.uint8, stream=s)
        bump[1, width, s](x, one)  # compiles outside any capture
        x.copy_to_device(np.zeros(width, np.int64), stream=s)
        with ng.capture(other) as on_other:
            bump[1, width, other](y, one_other)
        with ng.capture(s) as closing:
            bump[1, width, s](x, one)
        closing.graph.close()
        outside = cuda.event()
        outside.record(other)
        s.synchronize()
        other.synchronize()
        return cls(width, s, other, x, y, pair, one, one_other, byte,
                   np.ones(width, np.int64), outside, on_other.graph, closing.graph)


@dataclass(frozen=True)
class Kind:
    """One kind of refused operation: ``call(env)`` makes it, ``error`` is
    what it must raise; ``in_capture`` makes it while ``env.s`` captures,
    after one recorded launch; ``ends_capture`` says whether the refusal ends
    that capture."""

    name: str
    error: type
    call: Callable[[Env], Any]
    in_capture: bool = True
    ends_capture: bool = True


def _wait_outside_event(e: Env) -> None:
    e.outside.wait(e.s)


KINDS = (
    # An allocation for the capturing stream is memory of the graph; one for
    # another stream is refused in a "thread_local" capture.
    Kind("allocation", ng.AllocationInCaptureError,
         lambda e: cuda.device_array(4, stream=e.other)),
    Kind("to_device", ng.AllocationInCaptureError,
         lambda e: cuda.to_device(e.host, stream=e.other)),
    Kind("new_device_scalar", ng.AllocationInCaptureError,
         lambda e: ng.DeviceScalar(1, dtype=np.int32, stream=e.other)),
    Kind("copy_to_host", ng.HostCopyInCaptureError, lambda e: e.x.copy_to_host(stream=e.s)),
    Kind("stream_synchronize", ng.SyncInCaptureError, lambda e: e.s.synchronize()),
    Kind("device_synchronize", ng.SyncInCaptureError, lambda e: cuda.synchronize()),
    Kind("host_array_argument", ng.HostArrayInCaptureError,
         lambda e: bump[1, e.width, e.s](e.host, e.one)),
    Kind("legacy_stream_launch", ng.ForeignStreamInCaptureError,
         lambda e: bump[1, e.width](e.y, e.one_other)),
    Kind("nested_begin_capture", ng.CaptureStateError, lambda e: ng.begin_capture(e.s)),
    Kind("graph_upload_into_capture", ng.UncapturableOperationError,
         lambda e: e.graph_other.upload(e.s)),
    Kind("wait_on_outside_event", ng.ForeignStreamInCaptureError, _wait_outside_event),
    Kind("partial_overlap", ng.OpError,
         lambda e: ng.add_into(e.pair[1:], 0, e.pair[:-1], stream=e.s), ends_capture=False),
    Kind("end_without_begin", ng.CaptureStateError, lambda e: ng.end_capture(e.s),
         in_capture=False),
    Kind("capture_on_legacy_stream", ng.CaptureStateError,
         lambda e: ng.begin_capture(cuda.default_stream()), in_capture=False),
    Kind("scalar_value_out_of_range", ng.ScalarValueError, lambda e: e.byte.update(300),
         in_capture=False),
    Kind("launch_closed_graph", ng.GraphClosedError, lambda e: e.closed.launch(),
         in_capture=False),
    Kind("condition_outside_capture", ng.ConditionalError, lambda e: ng.Condition(),
         in_capture=False),
)


class Rounds:
    """Makes one refusal of a kind and checks what must hold after it; keeps
    the count of launches that ran on ``x``."""

    def __init__(self, env: Env):
        self.env = env
        self.runs = 0

    def refuse(self, kind: Kind) -> list[str]:
        e = self.env
        why = []
        if kind.in_capture:
            ng.begin_capture(e.s)
            bump[1, e.width, e.s](e.x, e.one)  # recorded; runs only if the capture survives
        try:
            try:
                kind.call(e)
            except kind.error:
                pass
            except Exception as exc:  # noqa: BLE001  the wrong error is the finding
                why.append(f"{kind.name} raised {type(exc).__name__} ({exc}), "
                           f"not {kind.error.__name__}")
            else:
                why.append(f"{kind.name} was not refused")
            if kind.in_capture:
                why += self._capture_after(kind)
        finally:
            # Whatever went wrong, no capture is left for the next round.
            if ng.is_capturing(e.s):
                ng.abort_capture(e.s)
        return why + self._stream_works(kind)

    def _capture_after(self, kind: Kind) -> list[str]:
        e = self.env
        if kind.ends_capture:
            if ng.is_capturing(e.s):
                return [f"{kind.name} left the stream capturing"]
            try:
                ng.end_capture(e.s)
            except ng.CaptureInvalidatedError:
                return []
            except ng.NumbagraphError as exc:
                return [f"after {kind.name}, end_capture raised {type(exc).__name__}, "
                        "not CaptureInvalidatedError"]
            return [f"after {kind.name}, end_capture returned a graph of a capture "
                    "the refusal should have ended"]
        if not ng.is_capturing(e.s):
            return [f"{kind.name} ended the capture, which it should leave recording"]
        with ng.end_capture(e.s) as graph:
            graph.launch()
        self.runs += 1
        return []

    def _stream_works(self, kind: Kind) -> list[str]:
        e = self.env
        with ng.capture(e.s) as cap:
            bump[1, e.width, e.s](e.x, e.one)
        with cap.graph as graph:
            graph.launch()
        self.runs += 1
        host = e.x.copy_to_host(stream=e.s)
        e.s.synchronize()
        wrong = mismatch(f"x after {kind.name}", np.full(e.width, self.runs), host)
        if e.byte.value != 7:
            wrong = wrong or f"{kind.name} changed the scalar it refused to set"
        return [wrong] if wrong else []


def refusals(plan: Plan) -> list[Result]:
    """Every kind in turn, ``plan.refusals`` refusals in all, after one
    warm-up round of each kind."""
    env = Env.make(plan.width)
    result = Result("refusals", plan.refusals, "refusals",
                    note=f"{len(KINDS)} kinds, each raised its documented error and "
                    "left its stream working",
                    details={"kinds": len(KINDS), "refused": {}})
    refused = result.details["refused"]
    rounds = Rounds(env)
    for kind in KINDS:
        result.failures += rounds.refuse(kind)
    gauge = Gauge(idle=env.s.synchronize)
    gauge.start()
    every = plan.every(plan.refusals)
    start = time.perf_counter()
    for n in range(plan.refusals):
        kind = KINDS[n % len(KINDS)]
        failures = rounds.refuse(kind)
        result.failures += failures
        if not failures:
            refused[kind.name] = refused.get(kind.name, 0) + 1
        if len(result.failures) > 20:
            result.failures.append("stopped after 20 failures")
            break
        if (n + 1) % every == 0:
            gauge.sample()
    result.seconds = time.perf_counter() - start
    result.judge(gauge.growth(plan.refusals), plan.limits)
    return [result]
