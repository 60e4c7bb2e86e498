"""Device-updatable kernel nodes: kernels set another kernel node's grid, or
turn it off, from the GPU, seen in the same launch when they run before it."""

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from conftest import host, records_nothing

SKIP = -1  # what a planner is given to leave the node as it is
CAPTURED = 4  # the grid every counted node is captured with


@cuda.jit
def count_blocks(tally):
    """tally[0] += the blocks of this launch."""
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(tally, 0, 1)


@cuda.jit
def count_blocks_at(tally, pos):
    """tally[pos] += the blocks of this launch."""
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(tally, pos[0], 1)


@cuda.jit
def plan_grid(node, want, err):
    """Set node's grid to want[0] blocks, unless it is SKIP; err[0]: the code."""
    if cuda.grid(1) == 0 and want[0] != SKIP:
        err[0] = ng.set_grid(node, want[0])


@cuda.jit
def plan_grid3(node, x, y, z, err):
    if cuda.grid(1) == 0:
        err[0] = ng.set_grid(node, x, y, z)


@cuda.jit
def plan_enabled(node, want, err):
    """Enable node (want 1) or disable it (want 0), unless want is SKIP."""
    if cuda.grid(1) == 0 and want[0] != SKIP:
        err[0] = ng.set_enabled(node, want[0])


@cuda.jit
def plan_from_counter(node, pos, by):
    """In a loop's pass: the node runs pos + by blocks."""
    if cuda.grid(1) == 0:
        ng.set_grid(node, pos[0] + by)


def zeros(n, stream, dtype=np.int32):
    return cuda.to_device(np.zeros(n, dtype), stream=stream)


class Counted:
    """A graph of a planner and the node it updates, counting the node's
    blocks per launch."""

    def __init__(self, stream, planner=plan_grid, planner_first=True):
        self.stream = stream
        self.tally = zeros(1, stream)
        self.err = cuda.to_device(np.full(1, -1, np.int32), stream=stream)
        self.want = ng.DeviceScalar(SKIP, np.int32, stream=stream)
        s = stream
        with ng.capture(s) as cap:
            node = ng.DeviceNode(name="counted")
            if planner_first:
                planner[1, 1, s](node, self.want, self.err)
            with ng.device_updatable(node):
                count_blocks[CAPTURED, 2, s](self.tally)
            if not planner_first:
                planner[1, 1, s](node, self.want, self.err)
        self.graph, self.node = cap.graph, node

    def launch(self, want=SKIP):
        """The node's blocks in one launch, and the planner's code (-1: none)."""
        s = self.stream
        self.want.update(want)
        self.tally.copy_to_device(np.zeros(1, np.int32), stream=s)
        self.err.copy_to_device(np.full(1, -1, np.int32), stream=s)
        self.graph.launch(s)
        return int(host(self.tally, s)[0]), int(host(self.err, s)[0])


# ---------------------------------------------------------------- grid


def test_a_kernel_before_the_node_sets_its_grid_in_the_same_launch(stream):
    g = Counted(stream)
    assert g.launch() == (CAPTURED, -1)
    assert g.launch(7) == (7, 0)


def test_the_grid_set_lasts_to_later_launches_until_set_again(stream):
    g = Counted(stream)
    g.launch(7)
    assert g.launch() == (7, -1)
    assert g.launch(2) == (2, 0)
    assert g.launch() == (2, -1)


def test_a_kernel_after_the_node_is_seen_from_the_next_launch(stream):
    g = Counted(stream, planner_first=False)
    assert g.launch(7) == (CAPTURED, 0)
    assert g.launch() == (7, -1)


def test_a_grid_of_zero_is_refused_with_cudas_code_and_changes_nothing(stream):
    g = Counted(stream)
    g.launch(3)
    assert g.launch(0) == (3, 1)     # 1: cudaErrorInvalidValue
    assert g.launch() == (3, -1)


def test_a_three_dimensional_grid(stream):
    s = stream
    tally, err = zeros(1, s), zeros(1, s)
    with ng.capture(s) as cap:
        node = ng.DeviceNode()
        plan_grid3[1, 1, s](node, 2, 3, 1, err)
        with ng.device_updatable(node):
            count_blocks[1, 2, s](tally)
    cap.graph.launch(s)
    assert host(tally, s)[0] == 6 and host(err, s)[0] == 0


# ---------------------------------------------------------------- enabled


def test_a_disabled_node_runs_nothing_until_a_kernel_enables_it(stream):
    g = Counted(stream, planner=plan_enabled)
    assert g.launch(0) == (0, 0)
    assert g.launch() == (0, -1)      # the disabled state lasts
    assert g.launch(1) == (CAPTURED, 0)
    assert g.launch() == (CAPTURED, -1)


# ---------------------------------------------------------------- loops


def test_a_kernel_in_a_loop_body_sets_the_grid_of_the_same_iteration(stream):
    s = stream
    tally = zeros(8, s)
    pos = ng.DeviceScalar(0, np.int32, stream=s)
    with ng.capture(s) as cap:
        node = ng.DeviceNode()
        with ng.repeat(pos, until=5):
            plan_from_counter[1, 1, s](node, pos, 1)
            with ng.device_updatable(node):
                count_blocks_at[CAPTURED, 2, s](tally, pos)
    pos.update(0)
    cap.graph.launch(s)
    assert list(host(tally, s)[:5]) == [1, 2, 3, 4, 5]


@cuda.jit
def enable_even(node, pos):
    if cuda.grid(1) == 0:
        ng.set_enabled(node, pos[0] % 2 == 0)


def test_a_kernel_in_a_loop_body_turns_the_node_of_the_same_iteration_off(stream):
    s = stream
    tally = zeros(8, s)
    pos = ng.DeviceScalar(0, np.int32, stream=s)
    with ng.capture(s) as cap:
        node = ng.DeviceNode()
        with ng.repeat(pos, until=6):
            enable_even[1, 1, s](node, pos)
            with ng.device_updatable(node):
                count_blocks_at[2, 1, s](tally, pos)
    pos.update(0)
    cap.graph.launch(s)
    assert list(host(tally, s)[:6]) == [2, 0, 2, 0, 2, 0]


def test_a_kernel_in_a_loop_body_sets_a_node_after_the_loop(stream):
    s = stream
    tally, counts = zeros(1, s), zeros(8, s)
    pos = ng.DeviceScalar(0, np.int32, stream=s)
    with ng.capture(s) as cap:
        after = ng.DeviceNode()
        with ng.repeat(pos, until=3):
            plan_from_counter[1, 1, s](after, pos, 10)
            count_blocks_at[1, 1, s](counts, pos)
        with ng.device_updatable(after):
            count_blocks[CAPTURED, 2, s](tally)
    pos.update(0)
    cap.graph.launch(s)
    assert host(tally, s)[0] == 12   # set by the last pass: pos 2 + 10
    assert list(host(counts, s)[:3]) == [1, 1, 1]


def test_a_loop_holding_a_node_records_one_pass_per_iteration(stream):
    s = stream
    tally = zeros(8, s)
    pos = ng.DeviceScalar(0, np.int32, stream=s)
    with ng.capture(s) as cap:
        node = ng.DeviceNode()

        def step(loop):
            plan_from_counter[1, 1, s](node, pos, 2)
            with ng.device_updatable(node):
                count_blocks_at[CAPTURED, 1, s](tally, pos)

        loop = ng.repeat(pos, until=3)(step)
    assert loop.unroll == 1
    pos.update(0)
    cap.graph.launch(s)
    assert list(host(tally, s)[:3]) == [2, 3, 4]


def test_an_unrolled_loop_refuses_a_node_in_its_pass(stream):
    s = stream
    tally = zeros(8, s)
    pos = ng.DeviceScalar(0, np.int32, stream=s)
    with pytest.raises(ng.ConditionalError, match="device_updatable"):
        with ng.capture(s):
            node = ng.DeviceNode()

            def step(loop):
                with ng.device_updatable(node):
                    count_blocks_at[1, 1, s](tally, pos)

            ng.repeat(pos, until=3, unroll=2)(step)
    assert not ng.is_capturing(s)


# ---------------------------------------------------------------- compaction


@cuda.jit
def reset(count):
    if cuda.grid(1) == 0:
        count[0] = 0


@cuda.jit
def gather_active(flags, index, count):
    """Append the position of each active item to index; count them."""
    i = cuda.grid(1)
    if i < flags.size and flags[i]:
        index[cuda.atomic.add(count, 0, 1)] = i


@cuda.jit
def size_work(count, node, block):
    """The next kernel's grid: ceil(active / block), at least one block."""
    if cuda.grid(1) == 0:
        ng.set_grid(node, max(1, (count[0] + block - 1) // block))


@cuda.jit
def double_active(index, count, data, blocks):
    """data[index[i]] *= 2 for the active items; blocks[0] counts blocks."""
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(blocks, 0, 1)
    i = cuda.grid(1)
    if i < count[0]:
        data[index[i]] *= 2


def test_compaction_launches_only_the_blocks_the_active_items_need(stream):
    s, n, block = stream, 64, 4
    flags = cuda.to_device(np.zeros(n, np.int32), stream=s)
    data = cuda.to_device(np.ones(n, np.float32), stream=s)
    index, count, blocks = zeros(n, s), zeros(1, s), zeros(1, s)
    with ng.capture(s) as cap:
        node = ng.DeviceNode(name="work")
        reset[1, 1, s](count)
        gather_active[n // 8, 8, s](flags, index, count)
        size_work[1, 1, s](count, node, block)
        with ng.device_updatable(node):
            double_active[n // block, block, s](index, count, data, blocks)
    for active in (list(range(0, n, 5)), [3], list(range(n))):
        on = np.zeros(n, np.int32)
        on[active] = 1
        flags.copy_to_device(on, stream=s)
        data.copy_to_device(np.ones(n, np.float32), stream=s)
        blocks.copy_to_device(np.zeros(1, np.int32), stream=s)
        cap.graph.launch(s)
        assert host(blocks, s)[0] == -(-len(active) // block)
        assert np.array_equal(host(data, s), np.where(on == 1, 2.0, 1.0))


# ---------------------------------------------------------------- the graph


def test_a_rebinding_that_moves_the_nodes_arrays_sets_its_captured_grid(stream):
    g = Counted(stream)
    g.launch(7)
    other = zeros(1, stream)
    g.graph.rebind({g.tally: other})
    g.tally = other
    assert g.launch() == (CAPTURED, -1)
    assert g.launch(5) == (5, 0)


def test_after_a_rebinding_a_kernel_before_the_node_sets_its_grid_in_the_first_launch(stream):
    # The host sets the node whole before that launch's kernels run, so the
    # planner's change in that very launch holds.
    g = Counted(stream)
    g.launch(7)
    other = zeros(1, stream)
    g.graph.rebind({g.tally: other})
    g.tally = other
    assert g.launch(5) == (5, 0)


def test_an_uploaded_graph_sees_updates_too(stream):
    g = Counted(stream)
    g.graph.upload(stream)
    assert g.launch(6) == (6, 0)


def test_the_nodes_of_a_graph_describe_the_node_as_a_kernel_node(stream):
    g = Counted(stream)
    kinds = [node.kind for node in g.graph.nodes]
    assert kinds.count("kernel") == 2


# ---------------------------------------------------------------- refusals


def test_a_device_node_outside_a_capture_is_refused():
    with pytest.raises(ng.DeviceNodeError, match="capture"):
        ng.DeviceNode()


@pytest.mark.parametrize("launches", [0, 2])
def test_a_block_of_other_than_one_launch_is_refused_and_the_capture_goes_on(
        stream, launches):
    s = stream
    tally = zeros(1, s)
    with ng.capture(s) as cap:
        node = ng.DeviceNode()
        with pytest.raises(ng.DeviceNodeError, match="exactly one kernel"):
            with ng.device_updatable(node):
                for _ in range(launches):
                    count_blocks[1, 1, s](tally)
        assert not node.attached
        with ng.device_updatable(node):
            count_blocks[1, 1, s](tally)
    cap.graph.launch(s)
    assert host(tally, s)[0] == launches + 1


def test_a_node_attached_twice_is_refused_before_anything_is_recorded(stream):
    s = stream
    tally = zeros(1, s)
    with ng.capture(s) as cap:
        node = ng.DeviceNode()
        with ng.device_updatable(node):
            count_blocks[1, 1, s](tally)
        with pytest.raises(ng.DeviceNodeError, match="already has its kernel"):
            with ng.device_updatable(node):
                pass
    assert cap.graph.num_nodes == 1


def test_a_node_never_given_its_kernel_discards_the_capture(stream):
    with pytest.raises(ng.DeviceNodeError, match="never given its kernel"):
        with ng.capture(stream):
            ng.DeviceNode()
    assert not ng.is_capturing(stream)


def test_a_node_is_refused_as_an_argument_after_its_capture(stream):
    g = Counted(stream)
    with pytest.raises(ng.DeviceNodeError, match="has ended"):
        plan_grid[1, 1, stream](g.node, g.want, g.err)


@pytest.mark.parametrize("where", ["eager", "another capture"])
def test_a_node_is_refused_as_an_argument_of_a_launch_outside_its_capture(stream, where):
    s2 = cuda.stream()
    want = cuda.to_device(np.array([9], np.int32), stream=s2)
    err = cuda.to_device(np.array([-1], np.int32), stream=s2)
    tally = zeros(1, stream)
    with ng.capture(stream) as cap:
        node = ng.DeviceNode()
        with ng.device_updatable(node):
            count_blocks[CAPTURED, 2, stream](tally)
        if where == "eager":
            with pytest.raises(ng.DeviceNodeError, match="runs at once"):
                plan_grid[1, 1, s2](node, want, err)
        else:
            with ng.capture(s2, mode="relaxed") as other:
                with pytest.raises(ng.DeviceNodeError, match="another capture"):
                    plan_grid[1, 1, s2](node, want, err)
                count_blocks[1, 1, s2](tally)            # the capture goes on
            assert other.graph.num_nodes == 1
    cap.graph.launch(stream)
    assert int(host(tally, stream)[0]) == CAPTURED
    assert int(host(err, s2)[0]) == -1                   # the planner never ran


@pytest.mark.parametrize("direction", ["into", "from"])
def test_a_graph_holding_a_node_is_not_updated(stream, direction):
    g = Counted(stream)
    with ng.capture(stream) as cap:
        count_blocks[CAPTURED, 2, stream](g.tally)
    plain = cap.graph
    with pytest.raises(ng.DeviceNodeError, match="cuGraphExecUpdate"):
        if direction == "into":
            g.graph.update(plain)
        else:
            plain.update(g.graph)
    assert g.launch(3) == (3, 0)


def test_a_graph_holding_a_node_is_not_recorded_as_a_child_graph(stream, other_stream):
    g = Counted(stream)
    with records_nothing():
        with ng.capture(other_stream):
            with pytest.raises(ng.DeviceNodeError, match="child graph"):
                g.graph.launch(other_stream)
    assert g.launch(3) == (3, 0)
