"""Threads capturing and replaying at once, each on its own stream, in each
capture mode.

Every thread allocates its stream, array and scalar before the timed loop,
then captures graphs of one to three launches, replays each a few times with
a DeviceScalar update before every replay, closes it, and now and then reads
its array back and checks it exactly against the sum it kept on the host.

In ``"thread_local"`` and ``"relaxed"`` mode nothing a thread does is
refused. In ``"global"`` mode CUDA forbids the calls it deems unsafe on every
thread while any global capture runs, and numbagraph refuses them; three
such refusals are documented and expected here, counted and retried:

* ``SyncInCaptureError``: a thread's ``synchronize()`` of its own stream
  while another thread captures;
* ``UncapturableOperationError`` at a graph's first launch: a graph captured
  while another capture ran is instantiated then, which CUDA forbids while a
  global capture runs;
* ``CaptureInvalidatedError``: either refusal on another thread invalidates
  this thread's capture, which ends at its next launch or at its end.

Any other error, or any refusal outside ``"global"`` mode, fails the run.

The ``shared`` case shares objects instead: threads call one graphed
function on one stream, each with its own arrays (so that nearly every call
rebinds its graph), and rebind and launch one graph, which one of them
closes half-way through each round while the others use it. A call on the
graph after its close raises ``GraphClosedError``, counted; each thread's
arrays and the graph's must hold exactly what the calls and launches that
returned made.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter
from typing import Any

import numbagraph as ng  # noqa: I001  (picks the backend before numba.cuda loads)

import numpy as np
from numba import cuda

from .core import Plan, Result, mismatch
from .kernels import advance, bump
from .memory import Gauge, device_memory_used

__all__ = ["threads", "shared", "documented_global_refusal"]

_REPLAYS_PER_GRAPH = 4
_CHECK_EVERY = 8         # graphs between two checks of a thread's array
_RETRY_SECONDS = 60.0    # a retried call that never gets through is a failure


def documented_global_refusal(exc: BaseException) -> str | None:
    """The name of the error class when ``exc`` is one of the three refusals
    that a ``"global"`` capture on another thread is documented to cause
    (see above); None for any other error."""
    text = str(exc)
    if isinstance(exc, ng.CaptureInvalidatedError) and "refused on another thread" in text:
        return "CaptureInvalidatedError"
    if type(exc) is ng.UncapturableOperationError and text.startswith("instantiating a graph"):
        return "UncapturableOperationError"
    if (isinstance(exc, ng.SyncInCaptureError)
            and "while any thread captures in mode 'global'" in text):
        return "SyncInCaptureError"
    return None


class _Stop(Exception):
    """This thread stops: it failed, or another one did."""


class _Worker:
    """One thread's stream, array, scalar and tallies."""

    def __init__(self, index: int, mode: str, width: int, phases: threading.Barrier):
        self.index = index
        self.mode = mode
        self.width = width
        self.phases = phases
        self.rng = random.Random(index)
        self.expected = 0
        self.captures = 0
        self.replays = 0
        self.refusals: Counter = Counter()
        self.failure: str | None = None
        self.seconds = 0.0

    # ------------------------------------------------------------ one thread

    def run(self, plan: Plan) -> None:
        try:
            self.s = s = cuda.stream()
            self.x = cuda.to_device(np.zeros(self.width, np.int64), stream=s)
            self.pos = ng.DeviceScalar(0, dtype=np.int32, stream=s)
            self.host = np.zeros(self.width, np.int64)
            s.synchronize()
            self._phase()                       # everything allocated
            self._loop(plan.thread_warmup_seconds)
            self._phase()                       # no thread captures any more
            self._check()
            self.captures, self.replays = 0, 0
            self.refusals.clear()
            self._phase()                       # idle while the baseline is sampled
            self._phase()
            start = time.monotonic()
            self._loop(plan.thread_seconds)
            self.seconds = time.monotonic() - start
            self._phase()                       # no thread captures any more
            self._check()
            self._phase()                       # idle while growth is sampled
        except _Stop:
            pass
        except BaseException:  # noqa: BLE001  reported by the main thread
            last = traceback.format_exc().strip().splitlines()[-1]
            self.failure = f"thread {self.index}: {last}"
            self.phases.abort()

    def _phase(self) -> None:
        try:
            self.phases.wait()
        except threading.BrokenBarrierError:
            raise _Stop() from None

    def _refused(self, exc: BaseException) -> None:
        """Count ``exc`` if it is a documented refusal of this mode; else
        re-raise it."""
        name = documented_global_refusal(exc) if self.mode == "global" else None
        if name is None:
            raise exc
        self.refusals[name] += 1
        time.sleep(self.rng.uniform(0, 0.001))  # let the other thread's capture end

    def _retry(self, call: Any) -> None:
        give_up = time.monotonic() + _RETRY_SECONDS
        while True:
            try:
                return call()
            except ng.NumbagraphError as exc:
                self._refused(exc)
            if time.monotonic() > give_up:
                raise RuntimeError(f"thread {self.index} was refused for "
                                   f"{_RETRY_SECONDS:.0f} s without a break")

    def _loop(self, seconds: float) -> None:
        s, x, pos, w = self.s, self.x, self.pos, self.width
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            nodes = 1 + self.captures % 3
            try:
                with ng.capture(s, mode=self.mode) as cap:
                    for _ in range(nodes):
                        bump[1, w, s](x, pos)
                        time.sleep(0)  # let other threads run while this one captures
            except ng.NumbagraphError as exc:
                self._refused(exc)
                continue
            self.captures += 1
            with cap.graph as graph:
                for _ in range(_REPLAYS_PER_GRAPH):
                    value = self.rng.randrange(1, 1 << 20)
                    pos.update(value)
                    self._retry(graph.launch)
                    self.expected += nodes * value
                    self.replays += 1
            if self.captures % _CHECK_EVERY == 0:
                self._check()

    def _check(self) -> None:
        self.x.copy_to_host(self.host, stream=self.s)
        self._retry(self.s.synchronize)
        wrong = mismatch(f"thread {self.index}'s array",
                         np.full(self.width, self.expected), self.host)
        if wrong:
            self.failure = wrong
            self.phases.abort()
            raise _Stop()


def _device_during(seconds: float, baseline: Any) -> list:
    """Device memory above ``baseline`` each second for ``seconds``, sampled
    without stopping the threads (None where it is not counted)."""
    during: list = []
    end = time.monotonic() + seconds
    while time.monotonic() < end - 1.0:
        time.sleep(1.0)
        used = device_memory_used()
        during.append(None if used is None or baseline.device is None
                      else used - baseline.device)
    return during


def _one_mode(plan: Plan, mode: str) -> Result:
    result = Result(f"threads/{mode}", 0, "captures")
    phases = threading.Barrier(plan.threads + 1, timeout=plan.thread_seconds
                               + plan.thread_warmup_seconds + 2 * _RETRY_SECONDS)
    workers = [_Worker(i, mode, plan.width, phases) for i in range(plan.threads)]
    pool = [threading.Thread(target=w.run, args=(plan,), name=f"soak-{mode}-{w.index}")
            for w in workers]
    gauge = Gauge()
    during: list = []
    try:
        for thread in pool:
            thread.start()
        phases.wait()       # everything allocated
        phases.wait()       # warm-up over: no thread captures
        phases.wait()       # checked: every thread idle
        gauge.start()
        phases.wait()       # the timed loop begins
        during = _device_during(plan.thread_seconds, gauge.baseline)
        phases.wait()       # the timed loop is over
        phases.wait()       # checked: every thread idle
        growth = gauge.growth(sum(w.captures for w in workers))
    except threading.BrokenBarrierError:
        growth = None
    for thread in pool:
        thread.join()
    result.failures += [w.failure for w in workers if w.failure]
    if growth is None and not result.failures:
        result.failures.append("a thread stopped before the end")
    result.count = sum(w.captures for w in workers)
    result.seconds = max((w.seconds for w in workers), default=0.0)
    refusals = Counter()
    for w in workers:
        refusals.update(w.refusals)
    replays = sum(w.replays for w in workers)
    result.details = {"threads": plan.threads, "replays": replays,
                      "refusals": dict(sorted(refusals.items()))}
    if growth is not None and any(d is not None for d in during):
        # Growth while the threads run, each second: tells memory that levels
        # off from memory that keeps growing.
        result.details["device_growth_each_second"] = during
    result.note = f"{replays} replays by {plan.threads} threads"
    if refusals:
        result.note += "; documented refusals retried: " + ", ".join(
            f"{n} {name}" for name, n in sorted(refusals.items()))
    if growth is not None:
        result.judge(growth, plan.limits.capturing_at_once(plan.threads))
    return result


class _Sharing:
    """The objects the threads of the ``shared`` case share, and each
    thread's arrays and tallies."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.s = s = cuda.stream()
        w = plan.width
        self.one = ng.DeviceScalar(1, dtype=np.int64, stream=s)
        self.two = ng.DeviceScalar(2, dtype=np.int64, stream=s)
        self.a, self.b = self._zeros(), self._zeros()
        one = self.one

        def step(src: Any, dst: Any) -> Any:
            advance[1, w, s](src, dst, one)
            return dst

        # One graph, rebound from pair to pair (the pairs coming back would
        # otherwise get graphs of their own).
        self.step = ng.graphed(step, stream=s, max_graphs=1)
        # Made here: simulated kernels running on other threads swap the
        # kernels' module's `cuda` for the simulator's.
        self.pairs = [[self._zeros(), self._zeros()] for _ in range(plan.threads)]
        self.calls = [0] * plan.threads
        self.launches = [0] * plan.threads
        self.closed_seen = [0] * plan.threads
        self.graph: Any = None
        self.stop = False
        self.failure: str | None = None
        self.start = threading.Barrier(plan.threads + 1)
        self.done = threading.Barrier(plan.threads + 1)
        bump[1, w, s](self._zeros(), one)       # compiled before any capture
        # The step is captured here, before the threads start: a capture on s
        # would record the launches other threads make on s meanwhile.
        self.step(self._zeros(), self._zeros())
        s.synchronize()

    def _zeros(self) -> Any:
        return cuda.to_device(np.zeros(self.plan.width, np.int64), stream=self.s)

    def capture(self) -> None:
        """The round's graph: ``a += 1; b += 2``, which each thread swaps."""
        w, s = self.plan.width, self.s
        with ng.capture(s) as cap:
            bump[1, w, s](self.a, self.one)
            bump[1, w, s](self.b, self.two)
        self.graph = cap.graph

    def run(self, k: int) -> None:
        try:
            while True:
                self.start.wait()
                if self.stop:
                    return
                self._round(k)
                self.done.wait()
        except threading.BrokenBarrierError:
            return
        except BaseException:  # noqa: BLE001  reported by the main thread
            last = traceback.format_exc().strip().splitlines()[-1]
            self.failure = self.failure or f"thread {k}: {last}"
            self.start.abort()
            self.done.abort()

    def _round(self, k: int) -> None:
        graph, a, b = self.graph, self.a, self.b
        src, dst = self.pairs[k]
        usable = True
        for i in range(self.plan.shared_calls):
            src, dst = self.step(src, dst), src
            self.calls[k] += 1
            if k == 0 and i == self.plan.shared_calls // 2:
                graph.close()
            if usable:
                try:
                    graph.rebind({a: b, b: a})
                    graph.launch()
                    self.launches[k] += 1
                except ng.GraphClosedError:
                    usable = False
                    self.closed_seen[k] += 1
        self.pairs[k] = [src, dst]

    def one_round(self) -> str | None:
        """Run a round on every thread; what its check found wrong, if anything."""
        self.capture()
        self.start.wait()
        self.done.wait()
        self.graph = None
        self.s.synchronize()
        for k, (latest, _) in enumerate(self.pairs):
            wrong = mismatch(f"thread {k}'s graphed step", np.full(self.plan.width, self.calls[k]),
                             latest.copy_to_host(stream=self.s))
            if wrong:
                return wrong
        total = self.a.copy_to_host(stream=self.s) + self.b.copy_to_host(stream=self.s)
        return mismatch("the shared graph's two arrays, summed",
                        np.full(self.plan.width, 3 * sum(self.launches)), total)


def shared(plan: Plan) -> Result:
    """Threads sharing one graphed function and one graph, in rounds; the
    graph closed by one of them half-way through each round."""
    result = Result("threads/shared", 0, "rounds")
    sharing = _Sharing(plan)
    pool = [threading.Thread(target=sharing.run, args=(k,), name=f"soak-shared-{k}")
            for k in range(plan.threads)]
    for thread in pool:
        thread.start()
    gauge = Gauge(idle=sharing.s.synchronize)
    every = plan.every(plan.shared_rounds)
    start = time.monotonic()
    try:
        for n in range(-plan.shared_warmup, plan.shared_rounds):
            if n == 0:
                gauge.start()
                start = time.monotonic()
            wrong = sharing.one_round()
            if wrong:
                result.failures.append(wrong)
                break
            result.count = max(n + 1, 0)
            if n >= 0 and (n + 1) % every == 0:
                gauge.sample()
    except threading.BrokenBarrierError:
        pass
    result.seconds = time.monotonic() - start
    sharing.stop = True
    try:
        sharing.start.wait()
    except threading.BrokenBarrierError:
        pass
    for thread in pool:
        thread.join()
    if sharing.failure:
        result.failures.append(sharing.failure)
    calls, launches = sum(sharing.calls), sum(sharing.launches)
    closed = sum(sharing.closed_seen)
    info = sharing.step.cache_info()
    result.details = {"threads": plan.threads, "calls": calls, "launches": launches,
                      "closed_graph_refusals": closed, "cache": info._asdict()}
    result.note = (f"{calls} graphed calls and {launches} rebound launches of a shared "
                   f"graph by {plan.threads} threads; {closed} GraphClosedError after its close")
    if info.captures != 1:
        result.failures.append(f"the step was captured {info.captures} times, expected once")
    if not result.failures:
        result.judge(gauge.growth(result.count), plan.limits)
    sharing.step.clear()
    return result


def threads(plan: Plan) -> list[Result]:
    """One run per capture mode in ``ng.CAPTURE_MODES``, then the ``shared``
    case."""
    return [*(_one_mode(plan, mode) for mode in ng.CAPTURE_MODES), shared(plan)]
