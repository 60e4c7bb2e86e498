"""The single-stream workloads: capture cycles, a long replay loop, and
conditional graphs. Each makes everything it needs before its warm-up,
counts its work after it, and checks the device's result exactly."""

from __future__ import annotations

import time
from typing import Any

import numbagraph as ng  # noqa: I001  (picks the backend before numba.cuda loads)

import numpy as np
from numba import cuda

from .core import Plan, Result, mismatch
from .kernels import advance, bump, count_below, mix, mix_reference, zero
from .memory import Gauge

__all__ = ["cycles", "replays", "conditionals", "rebinds", "leak"]


def _read(array, stream) -> np.ndarray:
    host = array.copy_to_host(stream=stream)
    stream.synchronize()
    return host


def _run_judged(result: Result, plan: Plan, cycle: Any, warmup: int, count: int,
                stream: Any) -> None:
    """``cycle()`` ``warmup`` times, then ``count`` times timed, memory
    sampled along the way and its growth judged into ``result``."""
    for _ in range(warmup):
        cycle()
    gauge = Gauge(idle=stream.synchronize)
    gauge.start()
    every = plan.every(count)
    start = time.perf_counter()
    for n in range(1, count + 1):
        cycle()
        if n % every == 0:
            gauge.sample(at=n)
    result.seconds = time.perf_counter() - start
    result.judge(gauge.growth(count), plan.limits)


def cycles(plan: Plan) -> list[Result]:
    """Capture one launch, instantiate, launch and close the graph, over and
    over: whatever a cycle keeps shows as growth."""
    result = Result("cycles", plan.cycles, "cycles",
                    note="capture, instantiate, launch, close; every launch counted")
    s = cuda.stream()
    w = plan.width
    x = cuda.to_device(np.zeros(w, np.int64), stream=s)
    one = ng.DeviceScalar(1, dtype=np.int32, stream=s)
    bump[1, w, s](x, one)  # compiles outside any capture

    def cycle() -> None:
        with ng.capture(s) as cap:
            bump[1, w, s](x, one)
        cap.graph.launch()
        cap.graph.close()

    _run_judged(result, plan, cycle, plan.cycle_warmup, plan.cycles, s)
    wrong = mismatch("x after every cycle's launch", np.full(w, 1 + plan.cycle_warmup
                                                               + plan.cycles), _read(x, s))
    if wrong:
        result.failures.append(wrong)
    return [result]


def _salt(i: int) -> int:
    """The 8-byte scalar's value at step ``i``: high bits set, and different
    at every step."""
    return (i * 0x9E3779B97F4A7C15) & ((1 << 62) - 1)


def replays(plan: Plan) -> list[Result]:
    """Replay one graph of ``replay_nodes`` launches, updating a 4-byte and an
    8-byte DeviceScalar before each replay; the result depends on every update
    in order, and is checked at each memory sample and at the end."""
    result = Result("replays", plan.replays, "replays",
                    note=f"{plan.replay_nodes}-node graph; a 4- and an 8-byte DeviceScalar "
                    "updated before each replay",
                    details={"nodes": plan.replay_nodes})
    s = cuda.stream()
    w = plan.width
    acc = cuda.to_device(np.zeros(w, np.int64), stream=s)
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=s)
    salt = ng.DeviceScalar(0, dtype=np.int64, stream=s)
    mix[1, w, s](acc, pos, salt)  # compiles outside any capture
    acc.copy_to_device(np.zeros(w, np.int64), stream=s)
    with ng.capture(s) as cap:
        for _ in range(plan.replay_nodes):
            mix[1, w, s](acc, pos, salt)
    graph = cap.graph
    model = mix_reference(plan.replay_nodes)

    def run(first: int, last: int) -> None:
        for i in range(first, last):
            pos.update(i)
            salt.update(_salt(i))
            graph.launch()
            model.replay(i, _salt(i))

    def check(when: str) -> None:
        wrong = mismatch(f"acc {when}", model.expected(w), _read(acc, s))
        if wrong:
            result.failures.append(wrong)

    run(0, plan.replay_warmup)
    gauge = Gauge(idle=s.synchronize)
    gauge.start()
    every = plan.every(plan.replays)
    start = time.perf_counter()
    done = plan.replay_warmup
    end = plan.replay_warmup + plan.replays
    while done < end and not result.failures:
        step = min(every, end - done)
        run(done, done + step)
        done += step
        check(f"after {done - plan.replay_warmup} replays")
        gauge.sample(at=done - plan.replay_warmup)
    result.seconds = time.perf_counter() - start
    graph.close()
    result.judge(gauge.growth(plan.replays), plan.limits)
    return [result]


def conditionals(plan: Plan) -> list[Result]:
    """Make, launch, check and close graphs of one while loop whose trip
    count a DeviceScalar sets; every fifth loop starts with its condition
    clear and must not run its body at all."""
    result = Result("conditionals", plan.conditionals, "graphs",
                    note="while loops of 0 to 7 passes, each pass counted")
    s = cuda.stream()
    counter = cuda.to_device(np.zeros(1, np.int32), stream=s)
    limit = ng.DeviceScalar(1, dtype=np.int32, stream=s)
    zero[1, 1, s](counter)  # compiles outside any capture

    def one(k: int) -> None:
        trips = 1 + k % 7
        skipped = k % 5 == 4
        limit.update(trips)
        with ng.capture(s) as cap:
            zero[1, 1, s](counter)
            more = ng.Condition(default=0 if skipped else 1)
            with ng.while_loop(more):
                count_below[1, 1, s](counter, limit, more)
        cap.graph.launch()
        got = int(_read(counter, s)[0])
        cap.graph.close()
        want = 0 if skipped else trips
        if got != want:
            result.failures.append(f"while loop {k} ran {got} passes, expected {want}")

    for k in range(plan.conditional_warmup):
        one(k)
    gauge = Gauge(idle=s.synchronize)
    gauge.start()
    every = plan.every(plan.conditionals)
    start = time.perf_counter()
    for n in range(1, plan.conditionals + 1):
        one(n)
        if result.failures:
            break
        if n % every == 0:
            gauge.sample(at=n)
    result.seconds = time.perf_counter() - start
    result.judge(gauge.growth(plan.conditionals), plan.limits)
    return [result]


# A rebinding call's new destination is a fresh array every this many calls.
_FRESH_EVERY = 8


def rebinds(plan: Plan) -> list[Result]:
    """Call a graphed step that adds one from one array into another, ping-
    ponging between two arrays and, every few calls, writing into a fresh
    one: every call after the capture rebinds the graph, and every fresh
    array's predecessor must be let go. The count reached is checked at each
    memory sample and at the end."""
    result = Result("rebinds", plan.rebinds, "calls",
                    note=f"graphed 2-node ping-pong step, rebound every call; a fresh "
                    f"array every {_FRESH_EVERY} calls")
    s = cuda.stream()
    w = plan.width
    one = ng.DeviceScalar(1, dtype=np.int64, stream=s)
    src = cuda.to_device(np.zeros(w, np.int64), stream=s)
    dst = cuda.to_device(np.zeros(w, np.int64), stream=s)
    scratch = cuda.to_device(np.zeros(w, np.int64), stream=s)

    def step(x, y):
        advance[1, w, s](x, scratch, one)
        advance[1, w, s](scratch, y, one)
        return y

    # One graph, so that the pairs taking turns rebind it rather than get graphs
    # of their own.
    graphed = ng.graphed(step, stream=s, warmup=1, max_graphs=1)
    count = 0

    def call(n: int) -> None:
        nonlocal src, dst, count
        if n % _FRESH_EVERY == 0:
            dst = cuda.to_device(np.zeros(w, np.int64), stream=s)
        out = graphed(src, dst)
        count += 2
        src, dst = out, src

    for n in range(plan.rebind_warmup):
        call(n)
    gauge = Gauge(idle=s.synchronize)
    gauge.start()
    every = plan.every(plan.rebinds)
    start = time.perf_counter()
    for n in range(1, plan.rebinds + 1):
        call(n)
        if n % every == 0:
            gauge.sample(at=n)
            wrong = mismatch(f"the step's output after call {n}", np.full(w, count),
                             _read(src, s))
            if wrong:
                result.failures.append(wrong)
                break
    result.seconds = time.perf_counter() - start
    result.judge(gauge.growth(plan.rebinds), plan.limits)
    info = graphed.cache_info()
    result.details = {"cache": info._asdict()}
    if info.captures != 1:
        result.failures.append(f"the step was captured {info.captures} times, expected once")
    graphed.clear()
    return [result]


def leak(plan: Plan, keep: bool = True) -> list[Result]:
    """For testing the soak only (``--inject-leak``): capture cycles that each
    launch into a fresh device array of ``plan.leak_bytes`` and keep it, a
    leak the soak must report as FAIL. With ``keep=False`` the same cycles
    let each array go, and must pass."""
    kept: list = []
    result = Result("leak", plan.leak_cycles, "cycles",
                    note=f"injected: a fresh {plan.leak_bytes // 1024} KiB device array per "
                    f"cycle, {'kept' if keep else 'let go'}",
                    details={"injected": True, "bytes_per_cycle": plan.leak_bytes,
                             "kept": keep})
    s = cuda.stream()
    w = plan.width
    one = ng.DeviceScalar(1, dtype=np.int32, stream=s)
    zeros = np.zeros(max(w, plan.leak_bytes // 8), np.int64)
    bump[1, w, s](cuda.to_device(zeros, stream=s), one)  # compiles outside any capture

    def cycle() -> None:
        x = cuda.to_device(zeros, stream=s)
        with ng.capture(s) as cap:
            bump[1, w, s](x, one)
        cap.graph.launch()
        cap.graph.close()
        if keep:
            kept.append(x)

    _run_judged(result, plan, cycle, plan.leak_warmup, plan.leak_cycles, s)
    kept.clear()
    return [result]
