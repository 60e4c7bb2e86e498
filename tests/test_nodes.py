"""A captured graph's nodes: records, the summary table, DOT text and files,
the same on the driver and on the simulator."""

import gc
import inspect
import shutil
import weakref

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph import NodeArg


@cuda.jit
def scale(x, factor, bias):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * factor[0] + bias


@cuda.jit
def shift(x, by):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += by


@cuda.jit
def mixed(x, pair, flag, scale_by):
    i = cuda.grid(1)
    if i < x.size and flag:
        x[i] = x[i] * scale_by + pair[0] + pair[1]


@cuda.jit
def countdown(n, cond):
    """n -= 1, and keep cond set while n > 0."""
    if cuda.grid(1) == 0:
        n[0] -= 1
        ng.set_condition(cond, n[0] > 0)


@cuda.jit
def set_from(cond, value):
    if cuda.grid(1) == 0:
        ng.set_condition(cond, value[0])


def line_of(kernel):
    """``file:line`` where the kernel's Python function is written."""
    return f"{inspect.getsourcefile(kernel.py_func)}:{inspect.getsourcelines(kernel.py_func)[1]}"


def array(n, dtype=np.float32):
    return NodeArg("array", dtype=np.dtype(dtype).name, shape=(n,))


@pytest.fixture
def x(stream):
    return cuda.to_device(np.ones(32, np.float32), stream=stream)


@pytest.fixture
def y(stream):
    return cuda.to_device(np.ones(32, np.float32), stream=stream)


@pytest.fixture
def factor(stream):
    return ng.DeviceScalar(2.0, dtype=np.float32, stream=stream, name="factor")


@pytest.fixture
def warm(stream, x, factor):
    """Every kernel of this file compiled for the arguments the tests give."""
    scale[1, 32, stream](x, factor, np.float32(0.0))
    shift[1, 32, stream](x, 0)
    stream.synchronize()


# ---------------------------------------------------------------- records


def test_kernels_fills_and_copies_are_listed_in_order_with_what_they_read(
        stream, x, y, factor, warm):
    wide = ng.DeviceScalar(0, dtype=np.int64, stream=stream, name="wide")
    with ng.capture(stream) as cap:
        scale[1, 32, stream](x, factor, np.float32(0.5))
        shift[(2, 1), (16, 1, 1), stream, 64](y, 3)
        factor.update(4.0)
        wide.update(2**33 + 5)
        ng.copy_into(x, y, stream=stream)
    nodes = cap.graph.nodes

    assert [n.kind for n in nodes] == ["kernel", "kernel", "memset", "memset", "memset", "memcpy"]
    assert [n.depends for n in nodes] == [(), (0,), (1,), (2,), (3,), (4,)]
    first, second = nodes[0], nodes[1]
    assert (first.name, first.source) == ("scale", line_of(scale))
    assert (first.grid, first.block, first.shared) == ((1, 1, 1), (32, 1, 1), 0)
    assert first.args == (array(32), NodeArg("DeviceScalar", dtype="float32", shape=(1,),
                                              name="factor"),
                          NodeArg("scalar", dtype="float32", value=0.5))
    assert (second.name, second.source) == ("shift", line_of(shift))
    assert (second.grid, second.block, second.shared) == ((2, 1, 1), (16, 1, 1), 64)
    assert second.args == (array(32), NodeArg("scalar", dtype="int64", value=3))
    # A float32 update is a memset of its bits; an 8-byte one two 4-byte
    # memsets, the low word first.
    assert [(n.nbytes, n.value, n.element_size) for n in nodes[2:5]] == [
        (4, 0x40800000, 4), (4, 5, 4), (4, 2, 4)]
    assert (nodes[5].nbytes, nodes[5].direction) == (32 * 4, "device to device")
    assert all(n.bodies == () for n in nodes)


def test_numbers_are_typed_as_a_launch_types_them_and_other_arguments_by_type(stream, x):
    with ng.capture(stream) as cap:
        mixed[1, 32, stream](x, (1, 2), True, 2.5)
        mixed[1, 32, stream](x, (1, 2), np.bool_(False), np.float64(-0.0))
    first, second = cap.graph.nodes
    assert first.args == (array(32), NodeArg("other", type="tuple"),
                          NodeArg("scalar", dtype="bool", value=True),
                          NodeArg("scalar", dtype="float64", value=2.5))
    assert [str(arg) for arg in second.args] == [
        "float32[32]", "tuple", "bool(False)", "float64(-0.0)"]


def test_the_records_are_made_once_and_frozen(stream, x, factor, warm):
    with ng.capture(stream) as cap:
        scale[1, 32, stream](x, factor, np.float32(1.0))
    graph = cap.graph
    assert graph.nodes is graph.nodes
    with pytest.raises(AttributeError):
        graph.nodes[0].name = "other"


def test_a_copy_into_host_memory_is_a_device_to_host_copy(stream, warm):
    d = cuda.to_device(np.arange(4, dtype=np.float32), stream=stream)
    pinned = cuda.pinned_array(4, np.float32)
    with ng.capture(stream) as cap:
        d.copy_to_host(pinned, stream=stream)
    (copy,) = cap.graph.nodes
    assert (copy.kind, copy.nbytes, copy.direction) == ("memcpy", 16, "device to host")


def test_a_read_back_into_a_host_scalar_is_one_kernel_node(stream, factor, warm):
    seen = ng.HostScalar(np.float32)
    with ng.capture(stream) as cap:
        factor.read_async(seen)
    (store,) = cap.graph.nodes
    assert (store.kind, store.grid, store.block) == ("kernel", (1, 1, 1), (1, 1, 1))
    factor.update(2.5)
    cap.graph.launch()
    stream.synchronize()
    assert seen.value == 2.5


def test_unnamed_scalars_and_conditions_have_no_name(stream, x, warm):
    plain = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream)
    with ng.capture(stream) as cap:
        scale[1, 32, stream](x, plain, np.float32(0.0))
    arg = cap.graph.nodes[0].args[1]
    assert arg.name is None and str(arg) == "DeviceScalar(float32)"
    assert plain.name is None


def test_names_must_be_strings_and_show_in_reprs(stream):
    with pytest.raises(TypeError, match="name is a str"):
        ng.DeviceScalar(1, stream=stream, name=3)
    assert "name='pos'" in repr(ng.DeviceScalar(1, stream=stream, name="pos"))
    with ng.capture(stream) as cap:
        with pytest.raises(TypeError, match="name is a str"):
            ng.Condition(default=1, name=b"more")
        more = ng.Condition(default=0, name="more")
        assert more.name == "more" and "'more'" in repr(more)
        with ng.if_then(more):
            pass
    cap.graph.close()


# ---------------------------------------------------------------- conditionals


def test_conditional_bodies_are_nested_and_launches_keep_their_order(stream, x, warm):
    n = ng.DeviceScalar(3, dtype=np.int32, stream=stream, name="n")
    flag = ng.DeviceScalar(1, dtype=np.int32, stream=stream, name="flag")
    with ng.capture(stream) as cap:
        shift[1, 32, stream](x, 1)
        n.update(3)
        more = ng.Condition(default=1, name="more")
        with ng.while_loop(more):
            countdown[1, 1, stream](n, more)
            shift[1, 32, stream](x, 2)
        take = ng.Condition(name="take")
        set_from[1, 1, stream](take, flag)
        with ng.if_then(take):
            shift[1, 32, stream](x, 4)
        shift[1, 32, stream](x, 8)
    graph = cap.graph
    nodes = graph.nodes

    assert [(n.kind, n.label) for n in nodes] == [
        ("kernel", "shift"), ("memset", "memset"), ("conditional", "while"),
        ("kernel", "set_from"), ("conditional", "if"), ("kernel", "shift")]
    loop, branch = nodes[2], nodes[4]
    assert loop.conditional == "while" and loop.depends == (1,)
    assert loop.args == (NodeArg("Condition", value=1, name="more"),)
    assert [(n.name, n.depends) for n in loop.body] == [("countdown", ()), ("shift", (0,))]
    assert loop.body[0].args == (NodeArg("DeviceScalar", dtype="int32", shape=(1,), name="n"),
                                 NodeArg("Condition", value=1, name="more"))
    assert branch.conditional == "if" and len(branch.bodies) == 1
    assert branch.args == (NodeArg("Condition", value=None, name="take"),)
    # Each launch of one kernel keeps its own arguments, bodies included.
    shifts = [nodes[0], loop.body[1], branch.body[0], nodes[5]]
    assert [s.args[1].value for s in shifts] == [1, 2, 4, 8]
    graph.launch()
    stream.synchronize()
    assert x.copy_to_host(stream=stream)[0] == 2 + 1 + 2 * 3 + 4 + 8   # 2 after warm


def test_a_node_without_one_body_says_so(stream, x, factor, warm):
    with ng.capture(stream) as cap:
        scale[1, 32, stream](x, factor, np.float32(1.0))
    with pytest.raises(ValueError, match="0 bodies"):
        cap.graph.nodes[0].body


# ---------------------------------------------------------------- several streams
#
# CUDA's rule for a capture's dependencies: each stream of the capture has a
# set of last nodes; a node recorded on a stream depends on that set and is
# the stream's set next; an event recorded on a stream stands for its set
# then, and a stream that waits on it adds that set to its own (a stream
# forked in starts from it; the origin joining a fork takes the union).
# Nodes are listed in the order they were made.


@pytest.fixture
def z(stream):
    return cuda.to_device(np.ones(32, np.float32), stream=stream)


def branches(nodes):
    """Each node's ``shift`` argument and dependencies."""
    return [(n.args[1].value, n.depends) for n in nodes]


@pytest.mark.parametrize("how", ["ng.fork", "events"])
def test_forked_work_depends_on_the_fork_and_the_join_on_both_branches(
        stream, x, y, factor, warm, how):
    s, s2 = stream, cuda.stream()
    fork, join = cuda.event(), cuda.event()
    with ng.capture(s) as cap:
        scale[1, 32, s](x, factor, np.float32(1.0))
        if how == "ng.fork":
            with ng.fork(s2):
                shift[1, 32, s2](y, 1)
                scale[1, 32, s](x, factor, np.float32(2.0))
        else:
            fork.record(s)
            fork.wait(s2)
            shift[1, 32, s2](y, 1)
            scale[1, 32, s](x, factor, np.float32(2.0))
            join.record(s2)
            join.wait(s)
        shift[1, 32, s](x, 3)
    nodes = cap.graph.nodes
    assert [(n.name, n.depends) for n in nodes] == [
        ("scale", ()), ("shift", (0,)), ("scale", (0,)), ("shift", (1, 2))]
    assert (nodes[1].args[1].value, nodes[2].args[2].value, nodes[3].args[1].value) == (1, 2.0, 3)
    cap.graph.launch()
    s.synchronize()
    assert y.copy_to_host(stream=s)[0] == 1 + 1
    assert x.copy_to_host(stream=s)[0] == (2 * 2 + 1) * 2 + 2 + 3   # 2 after warm


def test_a_join_depends_on_the_origin_s_work_before_the_fork_too(stream, x, y, warm):
    s, s2 = stream, cuda.stream()
    with ng.capture(s) as cap:
        shift[1, 32, s](x, 0)
        with ng.fork(s2):
            shift[1, 32, s2](y, 1)
        shift[1, 32, s](x, 2)          # the origin's set {0} and the fork's {1}
    assert branches(cap.graph.nodes) == [(0, ()), (1, (0,)), (2, (0, 1))]


def test_a_nested_fork_branches_from_the_stream_around_it(stream, x, y, z, warm):
    s, s2, s3 = stream, cuda.stream(), cuda.stream()
    with ng.capture(s) as cap:
        shift[1, 32, s](x, 0)
        with ng.fork(s2):
            shift[1, 32, s2](y, 1)
            with ng.fork(s3):                    # forked from s2
                shift[1, 32, s3](z, 2)
                shift[1, 32, s2](y, 3)
            shift[1, 32, s](x, 4)                # s: in parallel with all of s2's
            shift[1, 32, s2](y, 5)               # after s3 joined s2
        shift[1, 32, s](x, 6)
    assert branches(cap.graph.nodes) == [
        (0, ()), (1, (0,)), (2, (1,)), (3, (1,)), (4, (0,)), (5, (2, 3)), (6, (4, 5))]
    cap.graph.launch()
    s.synchronize()
    assert [a.copy_to_host(stream=s)[0] for a in (x, y, z)] == [2 + 10, 1 + 9, 1 + 2]


def test_three_side_streams_fork_from_one_node_and_join_into_one(stream, x, warm):
    s, s2, s3, s4 = stream, cuda.stream(), cuda.stream(), cuda.stream()
    sides = [cuda.to_device(np.zeros(32, np.float32), stream=s) for _ in range(3)]
    with ng.capture(s) as cap:
        shift[1, 32, s](x, 0)
        with ng.fork(s2), ng.fork(s3, parent=s), ng.fork(s4, parent=s):
            for k, (side, ys) in enumerate(zip((s2, s3, s4), sides), start=1):
                shift[1, 32, side](ys, k)
            shift[1, 32, s](x, 4)
        shift[1, 32, s](x, 5)
    assert branches(cap.graph.nodes) == [
        (0, ()), (1, (0,)), (2, (0,)), (3, (0,)), (4, (0,)), (5, (1, 2, 3, 4))]
    cap.graph.launch()
    s.synchronize()
    assert [ys.copy_to_host(stream=s)[0] for ys in sides] == [1, 2, 3]


def test_every_kind_of_node_on_a_forked_stream_chains_on_its_branch(stream, x, y, warm):
    s, s2 = stream, cuda.stream()
    wide = ng.DeviceScalar(0, dtype=np.int64, stream=s2, name="wide")
    with ng.capture(s2) as inner:
        shift[1, 32, s2](y, 7)
    child = inner.graph
    seen = []
    with ng.capture(s) as cap:
        shift[1, 32, s](x, 1)
        with ng.fork(s2):
            tmp = ng.zeros(32, np.float32, stream=s2)
            wide.update(2**33 + 5)
            ng.copy_into(y, tmp, stream=s2)
            ng.on_host(seen.append, 1, stream=s2)
            child.launch(s2)
            ng.free(tmp)
            shift[1, 32, s](x, 2)
        shift[1, 32, s](x, 3)
    nodes = cap.graph.nodes
    assert [(n.kind, n.label) for n in nodes] == [
        ("kernel", "shift"), ("memory", "alloc"), ("memset", "memset"), ("memset", "memset"),
        ("memset", "memset"), ("memcpy", "memcpy"), ("host", "host"), ("child", "child graph"),
        ("memory", "free"), ("kernel", "shift"), ("kernel", "shift")]
    assert [n.depends for n in nodes] == [
        (), (0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,), (0,), (8, 9)]
    assert [(n.name, n.depends) for n in nodes[7].body] == [("shift", ())]
    cap.graph.launch()
    s.synchronize()
    assert seen == [1]
    assert y.copy_to_host(stream=s)[0] == 1 + 7
    assert x.copy_to_host(stream=s)[0] == 2 + 1 + 2 + 3


def test_a_fork_inside_a_conditional_body_branches_in_the_body(stream, x, y, warm):
    s, s2 = stream, cuda.stream()
    flag = ng.DeviceScalar(1, dtype=np.int32, stream=s, name="flag")
    with ng.capture(s) as cap:
        shift[1, 32, s](x, 1)
        take = ng.Condition(name="take")
        set_from[1, 1, s](take, flag)
        with ng.if_then(take):
            shift[1, 32, s](x, 2)                # the body's own first node
            with ng.fork(s2):
                shift[1, 32, s2](y, 3)
                shift[1, 32, s](x, 4)
            shift[1, 32, s](x, 5)
        shift[1, 32, s](x, 6)
    nodes = cap.graph.nodes
    assert [(n.kind, n.depends) for n in nodes] == [
        ("kernel", ()), ("kernel", (0,)), ("conditional", (1,)), ("kernel", (2,))]
    assert branches(nodes[2].body) == [(2, ()), (3, (0,)), (4, (0,)), (5, (1, 2))]
    cap.graph.launch()
    s.synchronize()
    assert x.copy_to_host(stream=s)[0] == 2 + 1 + 2 + 4 + 5 + 6
    assert y.copy_to_host(stream=s)[0] == 1 + 3


# ---------------------------------------------------------------- memory


def test_graph_owned_memory_is_memory_nodes(stream, x, warm):
    with ng.capture(stream) as cap:
        tmp = ng.empty(32, np.float32, stream=stream)
        zero = ng.zeros((4, 8), np.int16, stream=stream)
        shift[1, 32, stream](tmp, 1)
        ng.copy_into(tmp, x, stream=stream)
        ng.free(tmp)
    graph = cap.graph
    nodes = graph.nodes
    assert [(n.kind, n.action) for n in nodes] == [
        ("memory", "alloc"), ("memory", "alloc"), ("memset", None), ("kernel", None),
        ("memcpy", None), ("memory", "free")]
    assert [n.nbytes for n in nodes] == [128, 64, 64, None, 128, 128]
    assert (nodes[2].value, nodes[2].element_size) == (0, 1)
    assert nodes[3].args == (array(32), NodeArg("scalar", dtype="int64", value=1))
    assert graph.memory_bytes == 128 + 64
    del zero


# ---------------------------------------------------------------- after changes


def test_a_rebound_graph_keeps_its_records_and_drops_the_old_arrays(stream, factor, warm):
    old = cuda.to_device(np.ones(16, np.float32), stream=stream)
    new = cuda.to_device(np.ones(16, np.float32), stream=stream)
    with ng.capture(stream) as cap:
        scale[1, 16, stream](old, factor, np.float32(1.0))
    graph = cap.graph
    graph.rebind({old: new})
    gone = weakref.ref(old)
    del old
    gc.collect()
    assert gone() is None, "the rebound graph still holds the old array"
    (node,) = graph.nodes      # described only now, after the rebinding
    assert node.name == "scale"
    assert node.args == (array(16), NodeArg("DeviceScalar", dtype="float32", shape=(1,),
                                            name="factor"),
                         NodeArg("scalar", dtype="float32", value=1.0))


def test_an_updated_graph_describes_what_it_took(stream, x, y, warm):
    with ng.capture(stream) as first:
        shift[1, 32, stream](x, 1)
    with ng.capture(stream) as second:
        shift[1, 32, stream](y, 7)
    graph = first.graph
    assert graph.nodes[0].args[1].value == 1
    graph.update(second.graph)
    assert graph.nodes[0].args[1].value == 7


@pytest.mark.parametrize("fate", ["closed", "dropped"])
def test_an_updated_graph_describes_what_it_runs_whatever_became_of_its_source(
        stream, x, y, warm, fate):
    with ng.capture(stream) as first:
        shift[1, 32, stream](x, 1)
    with ng.capture(stream) as second:
        shift[1, 32, stream](y, 7)
    graph = first.graph
    graph.update(second.graph)
    if fate == "closed":
        second.graph.close()
    del second
    gc.collect()
    (node,) = graph.nodes
    assert (node.name, node.args[1].value) == ("shift", 7)


# ---------------------------------------------------------------- text


def captured_loop(stream, x, factor):
    n = ng.DeviceScalar(2, dtype=np.int32, stream=stream, name="n")
    with ng.capture(stream) as cap:
        scale[1, 32, stream](x, factor, np.float32(0.5))
        more = ng.Condition(default=1, name="more")
        with ng.while_loop(more):
            countdown[1, 1, stream](n, more)
        factor.update(1.0)
    return cap.graph


def test_summary_is_a_row_per_node_with_bodies_indented(stream, x, factor, warm):
    text = captured_loop(stream, x, factor).summary()
    lines = text.splitlines()
    assert lines[0].split() == ["#", "kind", "name", "grid", "block", "shared", "args",
                                "depends", "on"]
    assert lines[1].split()[:3] == ["0", "kernel", "scale"]
    assert "(1, 1, 1)  (32, 1, 1)" in lines[1]
    assert "float32[32], factor=DeviceScalar(float32), float32(0.5)" in lines[1]
    assert lines[2].split()[:3] == ["1", "conditional", "while"]
    assert "more=Condition(default=1)" in lines[2] and lines[2].endswith(" 0")
    assert lines[3].strip() == "body of 1 (while):"
    assert lines[4].startswith("  0 ") and lines[4].split()[1:3] == ["kernel", "countdown"]
    assert "n=DeviceScalar(int32), more=Condition(default=1)" in lines[4]
    assert lines[5].split()[:3] == ["2", "memset", "-"]
    assert "4 B = 0x3f800000 (4-byte elements)" in lines[5]
    assert len(lines) == 6


def test_dot_names_kernels_as_in_python_and_draws_bodies_as_clusters(
        stream, x, factor, warm):
    dot = captured_loop(stream, x, factor).to_dot()
    assert dot.startswith("digraph captured {") and dot.rstrip().endswith("}")
    assert 'n0 [label="scale\\ngrid (1, 1, 1) block (32, 1, 1)\\n' in dot
    assert f'tooltip="{line_of(scale)}"' in dot
    assert 'n1 [label="while\\nmore=Condition(default=1)", shape=diamond];' in dot
    assert "subgraph cluster_n1_0 {" in dot and 'label="body of while";' in dot
    assert 'n1_0_0 [label="countdown' in dot
    assert "n0 -> n1;" in dot and "n1 -> n2;" in dot and "n1 -> n1_0_0 [style=dashed];" in dot
    # numba's symbols are mangled C++ names: none appears.
    assert "_Z" not in dot and "cudapy" not in dot


def test_dot_quotes_what_names_hold(stream, x, warm):
    odd = ng.DeviceScalar(1.0, dtype=np.float32, stream=stream, name='say "hi" \\ there')
    with ng.capture(stream) as cap:
        scale[1, 32, stream](x, odd, np.float32(0.0))
    dot = cap.graph.to_dot()
    assert 'say \\"hi\\" \\\\ there=DeviceScalar(float32)' in dot


# ---------------------------------------------------------------- files


def test_save_dot_writes_the_dot_text(stream, x, factor, warm, tmp_path):
    graph = captured_loop(stream, x, factor)
    graph.save(tmp_path / "loop.dot")
    graph.save(str(tmp_path / "again.DOT"))
    assert (tmp_path / "loop.dot").read_text() == graph.to_dot()
    assert (tmp_path / "again.DOT").read_text() == graph.to_dot()


def test_save_svg_without_graphviz_says_to_install_it(stream, x, factor, warm, tmp_path,
                                                      monkeypatch):
    graph = captured_loop(stream, x, factor)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    for name in ("loop.svg", "loop.png"):
        with pytest.raises(ng.NumbagraphError, match="Install Graphviz") as found:
            graph.save(tmp_path / name)
        assert "apt install graphviz" in str(found.value) and ".dot" in str(found.value)
        assert not (tmp_path / name).exists()


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_save_svg_draws_with_graphviz(stream, x, factor, warm, tmp_path):
    graph = captured_loop(stream, x, factor)
    graph.save(tmp_path / "loop.svg")
    assert "<svg" in (tmp_path / "loop.svg").read_text()


def test_save_refuses_other_suffixes_and_non_paths(stream, x, factor, warm, tmp_path):
    graph = captured_loop(stream, x, factor)
    for name in ("loop.txt", "loop", "loop.gv"):
        with pytest.raises(ValueError, match=r"\.dot .*\.svg or \.png"):
            graph.save(tmp_path / name)
    with pytest.raises(TypeError, match="file path"):
        graph.save(3)
    assert list(tmp_path.iterdir()) == []


def test_a_closed_graph_refuses_every_description(stream, x, factor, warm, tmp_path):
    graph = captured_loop(stream, x, factor)
    graph.close()
    for describe in (lambda: graph.nodes, graph.summary, graph.to_dot,
                     lambda: graph.save(tmp_path / "loop.dot")):
        with pytest.raises(ng.GraphClosedError):
            describe()
    assert list(tmp_path.iterdir()) == []
