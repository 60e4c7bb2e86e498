"""A step that allocates its temporaries, captured as it is: graph-owned memory.

``step(x)`` smooths x twice with a 3-point stencil and normalizes the result
to sum to one, written the natural way: it allocates two temporaries and its
result with ``ng.empty_like`` and frees the temporaries with ``ng.free``. Run
as written, these are ordinary allocations and ``ng.free`` does nothing.
Inside ``ng.capture(s)`` (on the capturing thread, for the capturing stream
or with no stream named) the same calls become the graph's own memory:
allocation and free nodes run at every replay, and a later allocation may
reuse memory freed earlier in the graph.

The step runs as written for a reference per input, is captured once and
replayed on each input, matching the reference every time. Last,
``ng.graphed(step, stream=s)`` returns a new result array per call, of which
only the newest may be used.

Run: python examples/step_with_temporaries.py   (no GPU: runs on Numba's simulator)
"""

import numbagraph as ng  # first, so it can choose the simulator without a GPU

import time

import numpy as np
from numba import cuda

ON_GPU = ng.backend() == "cuda"

# The simulator runs one Python thread per GPU thread: keep it tiny there.
CELLS = 1 << 20 if ON_GPU else 64
THREADS = 256 if ON_GPU else 32
INPUTS = 3                           # different inputs fed to one graph
REPS = 200 if ON_GPU else 5          # timed steps, eager and replayed


@cuda.jit
def smooth(u, v):
    """v = (u[i-1] + 2 u[i] + u[i+1]) / 4, with the two ends held fixed."""
    i = cuda.grid(1)
    n = u.size
    if i == 0 or i == n - 1:
        v[i] = u[i]
    elif i < n:
        v[i] = 0.25 * (u[i - 1] + 2 * u[i] + u[i + 1])


def main() -> None:
    where = "GPU (CUDA driver)" if ON_GPU else "Numba's CUDA simulator (no GPU found)"
    print(f"numbagraph step with temporaries on {where}")
    print(f"  {CELLS} float32 cells: smooth, smooth, normalize")
    s = cuda.stream()
    blocks = (CELLS + THREADS - 1) // THREADS
    # Made outside any capture: the input, and the sum (a DeviceScalar may not
    # be made inside one).
    x = ng.empty(CELLS, np.float32, stream=s)
    total = ng.DeviceScalar(0.0, dtype=np.float32, stream=s)

    def step(x):
        a = ng.empty_like(x, stream=s)      # graph memory when captured
        smooth[blocks, THREADS, s](x, a)
        b = ng.empty_like(x, stream=s)
        smooth[blocks, THREADS, s](a, b)
        ng.free(a)                          # from here on a may not be used
        ng.sum_into(b, total, stream=s)
        result = ng.empty_like(x, stream=s)  # may reuse a's memory
        ng.div_into(b, total, result, stream=s)
        ng.free(b)
        return result                       # not freed: read after each replay

    rng = np.random.default_rng(0)
    inputs = [rng.random(CELLS, dtype=np.float32) for _ in range(INPUTS)]
    expected = []
    for data in inputs:                     # as written: compiles, and the reference
        x.copy_to_device(data, stream=s)
        expected.append(step(x).copy_to_host(stream=s))
    s.synchronize()
    assert abs(expected[0].sum() - 1.0) < 1e-4, "the result is not normalized"

    with ng.capture(s) as cap:
        result = step(x)
    graph = cap.graph
    # The memory exists from the first launch on: reading it before is refused.
    try:
        result.copy_to_host(stream=s)
        raise AssertionError("read the result before the graph's first launch")
    except ng.GraphMemoryError:
        pass
    for data, want in zip(inputs, expected):
        x.copy_to_device(data, stream=s)
        graph.launch()                      # makes the result again
        got = result.copy_to_host(stream=s)  # valid until the next launch
        s.synchronize()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    info = ng.graph_memory_info()
    print(f"  graph: {graph.memory_bytes} bytes of its own memory "
          f"(three arrays of {CELLS * 4}), replayed on {INPUTS} inputs")
    print(f"  graph memory: used {info.used}, used_high {info.used_high}, "
          f"reserved {info.reserved}, reserved_high {info.reserved_high} bytes")

    start = time.perf_counter()
    for _ in range(REPS):
        step(x)
    s.synchronize()
    eager = (time.perf_counter() - start) / REPS
    start = time.perf_counter()
    for _ in range(REPS):
        graph.launch()
    s.synchronize()
    replay = (time.perf_counter() - start) / REPS
    graph.close()                           # frees its memory: the result is gone

    # A graphed function may return what it allocates: a new array per call,
    # valid until the next call. Call 1 runs as written, call 2 captures.
    graphed_step = ng.graphed(step, stream=s)
    results = [graphed_step(x) for _ in range(4)]
    assert len({id(r) for r in results}) == 4, "expected a new array per call"
    try:
        results[2].copy_to_host(stream=s)   # call 4 overwrote call 3's result
        raise AssertionError("read a result a later call overwrote")
    except ng.StaleOutputError as error:
        print(f"  an older result is refused: {type(error).__name__}")
    newest = results[-1].copy_to_host(stream=s)
    s.synchronize()
    np.testing.assert_allclose(newest, expected[-1], rtol=1e-6, atol=0)
    assert graphed_step.cache_info().captures == 1
    graphed_step.clear()

    print(f"  eager : {eager * 1e6:9.2f} us per step (allocating as it goes)")
    print(f"  replay: {replay * 1e6:9.2f} us per step (memory nodes in the graph)")
    print(f"  speed-up {eager / replay:.1f}x; every replay matches the eager step")
    if not ON_GPU:
        print("  (simulator timings measure Python, not a GPU)")


if __name__ == "__main__":
    main()
