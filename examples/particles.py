"""One graph for many sizes: a particle step whose active count changes.

Each step moves the active particles (x += v dt), drops those that leave
the domain [0, 1), compacts the survivors in order into the other of two
ping-pong buffers, and appends a few new particles from a fixed pattern, so
the count goes up and down from step to step. Three kernels make a step:

  move_and_count   moves, flags who stays, counts the stayers of each block
  prefix           one block: where each block's stayers go, the new count,
                   and the new particles appended after the survivors
  scatter          each stayer to its place, in the order it had

The same step runs four ways, each checked against NumPy bit for bit:

  (a) a graph per count   ng.graphed(step, stream=s): the kernels' grids
                          fit the count, the arrays are views x[:n], so each
                          new count is a new signature, captured anew (the
                          cache holds 16 graphs, then evicts); the host
                          reads the count back after each step
  (b) one graph, max size grids cover every particle the buffers hold;
                          blocks past the active count (read on the device)
                          return at once; two steps a launch, and no count
                          reaches the host
  (c) one graph, updated  ng.graphed(step, stream=s, sizes="update"): the
                          graph kept for the first count is given each new
                          count's grids and views by node updates, without
                          capturing; the host reads the count back after
                          each step
  (d) grids set on the    the whole run is one graph launch: ng.repeat loops
      GPU, one launch     the steps, and the prefix kernel, which knows the
                          count, sizes the other two kernels' nodes with
                          ng.set_grid (ng.DeviceNode, ng.device_updatable)

Positions lie on a grid of 2**-20 and displacements v dt on the same grid,
so every x + v dt is exact in float32: the GPU and NumPy agree exactly,
fused multiply-add or not.

On a GPU the buffers hold 2**22 particles, a tenth of them active, for
400 steps; --active sets the share active at the start, --steps the steps.

Run: python examples/particles.py [--steps N] [--active F]
     (no GPU: runs on Numba's simulator, on tiny sizes)
"""

import numbagraph as ng  # first, so it can choose the simulator without a GPU

import argparse
import sys
import time
import warnings

import numpy as np
from numba import cuda, int32

ON_GPU = ng.backend() == "cuda"

# The simulator runs one Python thread per GPU thread: keep it tiny there.
# On a GPU, enough particles that the blocks a max-size grid runs past the
# count cost more than the device loop's extra nodes (at 2**20 and a tenth
# active they cost about the same).
MAX = 1 << 22 if ON_GPU else 128       # particles the buffers hold
BLOCK = 256 if ON_GPU else 4           # threads per block of the particle kernels
SCAN = 1024 if ON_GPU else 4           # threads of the one-block prefix kernel
STEPS = 400 if ON_GPU else 4          # even: a pass of the one-launch loop takes two
DROP = 0.01 if ON_GPU else 0.2         # share of uniformly spread particles leaving per step
PATTERN = 64                           # steps of new particles, repeated cyclically
MAX_BLOCKS = MAX // BLOCK
GRID = float(2 ** -20)                 # positions are multiples of GRID
DT = np.float32(2 ** -10)              # v is a multiple of 2**-10: v dt of GRID


@cuda.jit(device=True)
def blocks_for(n):
    return max(1, (n + BLOCK - 1) // BLOCK)


@cuda.jit
def move_and_count(x, v, count, stays, stayers, dt):
    """Move the count[0] active particles; stays[i]: particle i is still in
    [0, 1); stayers[b]: how many of block b's are."""
    tally = cuda.shared.array(1, int32)
    b = cuda.blockIdx.x
    n = count[0]
    if b * BLOCK >= n:
        return                          # the whole block is past the active count
    t = cuda.threadIdx.x
    if t == 0:
        tally[0] = 0
    cuda.syncthreads()
    i = b * BLOCK + t
    if i < n:
        xi = x[i] + v[i] * dt
        x[i] = xi
        stay = 0 <= xi < 1
        stays[i] = stay
        if stay:
            cuda.atomic.add(tally, 0, 1)
    cuda.syncthreads()
    if t == 0:
        stayers[b] = tally[0]


@cuda.jit(device=True)
def place_and_append(count, stayers, offset, clock, new_n, new_x, new_v,
                     x_out, v_out, count_out):
    """The exclusive prefix sum of the blocks' stayers into offset, the new
    particles of this step appended after the survivors, the new count in
    count_out[0] and the step clock advanced. One block of SCAN threads.
    Returns the old count and the new one."""
    sums = cuda.shared.array(SCAN, int32)
    t = cuda.threadIdx.x
    n = count[0]
    blocks = (n + BLOCK - 1) // BLOCK
    chunk = (blocks + SCAN - 1) // SCAN  # thread t sums blocks [t chunk, (t+1) chunk)
    start = min(t * chunk, blocks)
    end = min(start + chunk, blocks)
    mine = 0
    for b in range(start, end):
        mine += stayers[b]
    sums[t] = mine
    cuda.syncthreads()
    step = 1
    while step < SCAN:                  # inclusive scan of the threads' sums
        add = sums[t - step] if t >= step else 0
        cuda.syncthreads()
        sums[t] += add
        cuda.syncthreads()
        step *= 2
    before = sums[t] - mine
    for b in range(start, end):
        offset[b] = before
        before += stayers[b]
    kept = sums[SCAN - 1]
    row = clock[0] % new_n.size
    added = min(new_n[row], x_out.size - kept)
    for j in range(t, added, SCAN):
        x_out[kept + j] = new_x[row, j]
        v_out[kept + j] = new_v[row, j]
    cuda.syncthreads()                  # every thread has read clock[0]
    if t == 0:
        count_out[0] = kept + added
        clock[0] += 1
    return n, kept + added


@cuda.jit
def prefix(count, stayers, offset, clock, new_n, new_x, new_v, x_out, v_out, count_out):
    place_and_append(count, stayers, offset, clock, new_n, new_x, new_v,
                     x_out, v_out, count_out)


@cuda.jit
def prefix_and_size(count, stayers, offset, clock, new_n, new_x, new_v,
                    x_out, v_out, count_out, scatter_node, next_move_node):
    """prefix, and the grids of this step's scatter (the old count) and of
    the next step's move_and_count (the new count)."""
    n, n_next = place_and_append(count, stayers, offset, clock, new_n, new_x, new_v,
                                 x_out, v_out, count_out)
    if cuda.threadIdx.x == 0:
        ng.set_grid(scatter_node, blocks_for(n))
        ng.set_grid(next_move_node, blocks_for(n_next))


@cuda.jit
def size_first(count, move_node):
    """The first step's move_and_count grid, from the starting count."""
    if cuda.grid(1) == 0:
        ng.set_grid(move_node, blocks_for(count[0]))


@cuda.jit
def scatter(x, v, count, stays, offset, x_out, v_out):
    """Each stayer of block b to offset[b] plus its rank among the block's
    stayers: the survivors keep their order."""
    rank = cuda.shared.array(BLOCK, int32)
    b = cuda.blockIdx.x
    n = count[0]
    if b * BLOCK >= n:
        return
    t = cuda.threadIdx.x
    i = b * BLOCK + t
    stay = stays[i] if i < n else 0
    rank[t] = stay
    cuda.syncthreads()
    step = 1
    while step < BLOCK:                 # inclusive scan of the block's flags
        add = rank[t - step] if t >= step else 0
        cuda.syncthreads()
        rank[t] += add
        cuda.syncthreads()
        step *= 2
    if stay:
        j = offset[b] + rank[t] - 1
        x_out[j] = x[i]
        v_out[j] = v[i]


def particles(rng: np.random.Generator, n: int, reach: int) -> tuple[np.ndarray, np.ndarray]:
    """n particles spread uniformly over [0, 1), |v dt| at most reach GRIDs."""
    x = (rng.integers(0, 1 << 20, n) * GRID).astype(np.float32)
    v = (rng.integers(-reach, reach + 1, n) * GRID / DT).astype(np.float32)
    return x, v


def reference(x, v, new_n, new_x, new_v, steps: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    counts = []
    for k in range(steps):
        x = x + v * DT
        stay = (x >= 0) & (x < 1)
        x, v = x[stay], v[stay]
        added = min(int(new_n[k % PATTERN]), MAX - x.size)
        x = np.concatenate([x, new_x[k % PATTERN, :added]])
        v = np.concatenate([v, new_v[k % PATTERN, :added]])
        counts.append(x.size)
    return x, v, counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS,
                        help=f"steps to run, even (default {STEPS})")
    parser.add_argument("--active", type=float, default=0.1,
                        help="share of the buffers' particles active at the start (default 0.1)")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.steps % 2:
        parser.error("--steps must be even and at least 2")
    if not 0 < args.active <= 1:
        parser.error("--active must be in (0, 1]")
    steps = args.steps

    where = "GPU (CUDA driver)" if ON_GPU else "Numba's CUDA simulator (no GPU found)"
    start_n = max(1, int(args.active * MAX))
    print(f"numbagraph particles on {where}")
    print(f"  buffers of {MAX} particles, {start_n} active at the start, {steps} steps")

    rng = np.random.default_rng(7)
    reach = int(2 * DROP * (1 << 20))   # mean |v dt| = DROP: that share leaves a step
    x0, v0 = particles(rng, start_n, reach)
    most = max(1, round(2 * DROP * start_n))   # new particles a step: 0 .. most
    new_n = rng.integers(0, most + 1, PATTERN).astype(np.int32)
    new_x, new_v = particles(rng, PATTERN * most, reach)
    new_x, new_v = new_x.reshape(PATTERN, most), new_v.reshape(PATTERN, most)
    want_x, want_v, want_counts = reference(x0, v0, new_n, new_x, new_v, steps)
    print(f"  active count over the steps: {min(want_counts)} to {max(want_counts)}, "
          f"{len(set(want_counts))} different counts")

    s = cuda.stream()
    xs = [ng.empty(MAX, np.float32, stream=s) for _ in range(2)]
    vs = [ng.empty(MAX, np.float32, stream=s) for _ in range(2)]
    counts = [ng.DeviceScalar(0, dtype=np.int32, stream=s) for _ in range(2)]
    clock = ng.DeviceScalar(0, dtype=np.int32, stream=s)      # the step, for new particles
    stays = ng.empty(MAX, np.int32, stream=s)
    stayers = ng.empty(MAX_BLOCKS, np.int32, stream=s)
    offset = ng.empty(MAX_BLOCKS, np.int32, stream=s)
    pattern = [cuda.to_device(a, stream=s) for a in (new_n, new_x, new_v)]
    seen = ng.HostScalar(np.int32)                             # the count, for the host

    def restart() -> None:
        xs[0].copy_to_device(np.pad(x0, (0, MAX - start_n)), stream=s)
        vs[0].copy_to_device(np.pad(v0, (0, MAX - start_n)), stream=s)
        counts[0].update(start_n)
        clock.update(0)
        s.synchronize()

    def step(x, v, count, x_out, v_out, count_out):
        """One step from the count[0] particles of x, v to x_out, v_out and
        count_out; the grids cover len(x) particles."""
        blocks = max(1, -(-x.size // BLOCK))
        move_and_count[blocks, BLOCK, s](x, v, count, stays, stayers, DT)
        prefix[1, SCAN, s](count, stayers, offset, clock, *pattern, x_out, v_out, count_out)
        scatter[blocks, BLOCK, s](x, v, count, stays, offset, x_out, v_out)

    failures = 0

    def check(label: str, seconds: float, note: str = "") -> None:
        nonlocal failures
        n = counts[0].value             # an even number of steps ends in buffer 0
        got_x = xs[0].copy_to_host(stream=s)[:n]
        got_v = vs[0].copy_to_host(stream=s)[:n]
        ok = (n == want_x.size and np.array_equal(got_x, want_x)
              and np.array_equal(got_v, want_v))
        failures += not ok
        verdict = ("matches NumPy" if ok else
                   f"DIFFERS from NumPy ({n} particles, {want_x.size} wanted)")
        print(f"  {label + ':':<38}{seconds / steps * 1e6:10.1f} us/step  {verdict}{note}")

    def host_loop(fn) -> float:
        """Steps from the host, which reads each new count to size the next."""
        restart()
        n, cur = start_n, 0
        begin = time.perf_counter()
        for _ in range(steps):
            nxt = 1 - cur
            fn(xs[cur][:n], vs[cur][:n], counts[cur], xs[nxt], vs[nxt], counts[nxt])
            counts[nxt].read_async(seen)
            s.synchronize()
            n, cur = seen.value, nxt
        return time.perf_counter() - begin

    restart()
    step(xs[0][:start_n], vs[0][:start_n], counts[0], xs[1], vs[1], counts[1])  # compile

    # (a) A graph per count: each new count is a signature of its own. The
    # kernels are compiled, so a new signature is captured at its first call
    # (warmup=0).
    per_count = ng.graphed(step, stream=s, warmup=0, max_graphs=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ng.GraphedWarning)   # one per eviction
        seconds = host_loop(per_count)
    info = per_count.cache_info()
    check("(a) a graph per count", seconds,
          f" (calls: {info.captures} captured, {info.hits} replayed; "
          f"{info.evictions} graphs evicted)")
    per_count.clear()

    # (b) One graph of the maximum size, two steps per launch, a to b and back.
    with ng.capture(s) as cap:
        step(xs[0], vs[0], counts[0], xs[1], vs[1], counts[1])
        step(xs[1], vs[1], counts[1], xs[0], vs[0], counts[0])
    full = cap.graph
    full.upload()
    restart()
    begin = time.perf_counter()
    for _ in range(steps // 2):
        full.launch()
    s.synchronize()
    check("(b) one graph, max size", time.perf_counter() - begin,
          f" ({MAX_BLOCKS} blocks per kernel)")
    full.close()

    # (c) One graph, given each count's grids and views by node updates.
    resized = ng.graphed(step, stream=s, warmup=0, sizes="update")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ng.GraphedWarning)   # a call captured instead
        seconds = host_loop(resized)
    info = resized.cache_info()
    note = f" (calls: {info.captures} captured, {info.resizes} resized)"
    captured = [w for w in caught if issubclass(w.category, ng.GraphedWarning)]
    if captured:
        note += f"; {captured[0].message}"
    check("(c) one graph, updated per size", seconds, note)
    resized.clear()

    # (d) The whole run in one launch, grids set on the GPU. The grids
    # captured cover every particle, so a step is right whatever grid its
    # nodes hold; the grids the kernels set save the blocks past the count.
    passes = ng.DeviceScalar(0, dtype=np.int32, stream=s)
    with ng.capture(s) as cap:
        move_nodes = [ng.DeviceNode(), ng.DeviceNode()]
        scatter_nodes = [ng.DeviceNode(), ng.DeviceNode()]
        passes.update(0)
        size_first[1, 1, s](counts[0], move_nodes[0])

        # Two steps a pass, a to b and back. A node holds the grid a kernel
        # set until one sets it again: the second step's prefix sets the
        # first step's move_and_count for the next pass.
        @ng.repeat(passes, until=steps, by=2, unroll=1)   # 1: device nodes in the pass
        def two_steps(loop):
            for a in (0, 1):
                b = 1 - a
                with ng.device_updatable(move_nodes[a]):
                    move_and_count[MAX_BLOCKS, BLOCK, s](xs[a], vs[a], counts[a],
                                                         stays, stayers, DT)
                prefix_and_size[1, SCAN, s](counts[a], stayers, offset, clock, *pattern,
                                            xs[b], vs[b], counts[b],
                                            scatter_nodes[a], move_nodes[b])
                with ng.device_updatable(scatter_nodes[a]):
                    scatter[MAX_BLOCKS, BLOCK, s](xs[a], vs[a], counts[a], stays, offset,
                                                  xs[b], vs[b])
    whole = cap.graph
    whole.upload()
    restart()
    begin = time.perf_counter()
    whole.launch()
    s.synchronize()
    check("(d) grids set on the GPU, one launch", time.perf_counter() - begin)
    whole.close()

    if not ON_GPU:
        print("  (simulator timings measure Python, not a GPU)")
    if failures:
        sys.exit(f"{failures} of the four modes differ from NumPy")


if __name__ == "__main__":
    main()
