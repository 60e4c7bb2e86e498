"""ng.dist: communicators from launchers, and collectives eager and in
graphs. A process is one rank here (world size 1): on the simulator, and
on one GPU. Tests of several ranks need several GPUs and skip without them."""

import importlib.util
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph import dist
from numbagraph._rebind import FixedNodesError
from numbagraph.backend import active

from conftest import ON_SIMULATOR

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAS_NCCL = importlib.util.find_spec("nccl") is not None
needs_nccl = pytest.mark.skipif(
    not ON_SIMULATOR and not HAS_NCCL,
    reason="collectives on the driver need nccl4py: pip install -e \".[dist]\"")
simulator_only = pytest.mark.skipif(
    not ON_SIMULATOR, reason="the simulator's model of one rank")

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK",
                 "PMIX_RANK", "MV2_COMM_WORLD_RANK", "MPI_LOCALRANKID",
                 "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def comm(no_launcher):
    if not ON_SIMULATOR and not HAS_NCCL:
        pytest.skip("collectives on the driver need nccl4py: pip install -e \".[dist]\"")
    c = ng.dist.init(rank=0, world_size=1)
    yield c
    c.close()


@cuda.jit
def scale_add(x, a, b):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * a + b


@cuda.jit
def descend(w, g, lr):
    i = cuda.grid(1)
    if i < w.size:
        w[i] -= lr * g[i]


def on_device(values, stream):
    return cuda.to_device(np.ascontiguousarray(values), stream=stream)


# ---------------------------------------------------------------- init

def test_importing_numbagraph_imports_no_nccl():
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys, numbagraph; print(any(m == 'nccl' or m.startswith('nccl.') "
         "for m in sys.modules), 'mpi4py' in sys.modules)"],
        capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


@needs_nccl
def test_init_from_explicit_arguments(no_launcher):
    with ng.dist.init(rank=0, world_size=1) as c:
        assert (c.rank, c.size, c.launcher) == (0, 1, "explicit")
        assert c.device == 0
        assert ng.dist.current() is c
    assert c.closed and ng.dist.current() is None


@needs_nccl
def test_init_from_a_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29555")
    with ng.dist.init() as c:
        assert (c.rank, c.size, c.local_rank, c.launcher) == (0, 1, 0, "torchrun")
        assert c.device == 0


@needs_nccl
def test_init_without_a_launcher_is_one_process(no_launcher):
    with ng.dist.init() as c:
        assert (c.rank, c.size, c.launcher) == (0, 1, "single")


@needs_nccl
def test_init_turns_nvlink_multicast_off_where_unset(no_launcher, monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    with ng.dist.init():
        assert os.environ["NCCL_NVLS_ENABLE"] == "0"


def test_unique_ids_are_128_bytes_and_differ():
    if not ON_SIMULATOR and not HAS_NCCL:
        pytest.skip("unique ids on the driver come from NCCL: pip install -e \".[dist]\"")
    first, second = ng.dist.unique_id(), ng.dist.unique_id()
    assert len(first) == len(second) == 128 and first != second


@pytest.mark.parametrize("kwargs, says", [
    ({"rank": 0}, "pass both rank= and world_size="),
    ({"rank": 1, "world_size": 1}, "rank must be an int in [0, 1)"),
    ({"rank": 0, "world_size": 0}, "world_size must be a positive int"),
    ({"rank": 0, "world_size": 2}, "needs unique_id="),
    ({"rank": 0, "world_size": 1, "unique_id": b"short"}, "128 bytes"),
    ({"rank": 0, "world_size": 1, "device": "0"}, "device must be a device ordinal"),
])
def test_bad_init_arguments_are_refused(no_launcher, kwargs, says):
    with pytest.raises(ng.DistError, match=says.replace("[", r"\[").replace(")", r"\)")):
        ng.dist.init(**kwargs)
    assert ng.dist.current() is None


def test_a_launcher_number_that_is_not_one_is_named(monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ng.DistError, match="RANK='zero'"):
        ng.dist.init()


@simulator_only
def test_the_simulator_refuses_several_ranks(no_launcher):
    with pytest.raises(ng.DistError, match="simulator runs one process as one rank"):
        ng.dist.init(rank=0, world_size=2, unique_id=ng.dist.unique_id())


@pytest.mark.driver_only(reason="the driver imports nccl4py; the simulator needs none")
@pytest.mark.skipif(HAS_NCCL, reason="nccl4py is installed: its absence cannot be seen")
def test_the_driver_without_nccl4py_names_the_extra(no_launcher):
    with pytest.raises(ng.DistError, match=r'pip install -e "\.\[dist\]"'):
        ng.dist.init()


@needs_nccl
@pytest.mark.filterwarnings("ignore::numbagraph.CaptureWarning")
def test_init_is_refused_while_a_capture_is_in_progress(no_launcher, stream):
    with ng.capture(stream):
        with pytest.raises(ng.DistError, match="before any capture begins"):
            ng.dist.init()


def test_the_socket_store_gives_every_rank_rank_0s_id():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    got = {}

    def rank(r):
        got[r] = dist._socket_exchange("127.0.0.1", port, r, 3, 20.0, lambda: b"u" * 128)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {0: b"u" * 128, 1: b"u" * 128, 2: b"u" * 128}


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


WHAT_TO_CHECK = r"MASTER_ADDR.*MASTER_PORT.*firewall.*all 2 ranks were started"


def test_a_rank_that_cannot_reach_rank_0_says_where_and_what_to_check():
    port = _free_port()  # nobody listens there
    with pytest.raises(ng.DistError, match=rf"rank 1 of 2 .*127\.0\.0\.1:{port}.*"
                                           + WHAT_TO_CHECK):
        dist._socket_exchange("127.0.0.1", port, 1, 2, 0.3, lambda: b"u" * 128)


def test_a_rank_0_that_cannot_listen_says_which_port(monkeypatch):
    def refused(address):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(socket, "create_server", refused)
    with pytest.raises(ng.DistError, match=r"rank 0 of 2 could not listen on port 29500 "
                                           r"\(PermissionError.*" + WHAT_TO_CHECK):
        dist._socket_exchange("10.0.0.1", 29500, 0, 2, 1.0, lambda: b"u" * 128)


def test_a_rank_0_no_rank_reaches_says_how_many_came():
    port = _free_port()
    with pytest.raises(ng.DistError, match=r"rank 0 of 2 .*0 of the 1 others connected.*"
                                           + WHAT_TO_CHECK):
        dist._socket_exchange("127.0.0.1", port, 0, 2, 0.2, lambda: b"u" * 128)


def test_a_master_addr_that_names_no_machine_is_said_at_once(monkeypatch):
    def unknown(address, timeout):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", unknown)
    with pytest.raises(ng.DistError, match=r"rank 1 of 2 could not find the machine "
                                           r"nowhere\.invalid.*" + WHAT_TO_CHECK):
        dist._socket_exchange("nowhere.invalid", 29500, 1, 2, 300.0, lambda: b"u" * 128)


def test_a_tcpstore_that_fails_is_said_as_the_socket_is(monkeypatch):
    import types

    class TCPStore:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("The client socket has timed out after 1s")

    monkeypatch.setitem(sys.modules, "torch.distributed",
                        types.SimpleNamespace(TCPStore=TCPStore))
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29501")
    with pytest.raises(ng.DistError, match=r"rank 1 of 2 could not reach torch's TCPStore "
                                           r"\(RuntimeError.*10\.0\.0\.1:29501.*"
                                           + WHAT_TO_CHECK):
        dist._torch_exchange(1, 2, "numbagraph/dist/0/1", 1.0)


# ---------------------------------------------------------------- collectives, eager

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max", "avg"])
def test_all_reduce_of_one_rank_is_its_input(comm, stream, dtype, op):
    x = on_device(np.arange(10).astype(dtype), stream)
    out = on_device(np.zeros(10, dtype), stream)
    ng.dist.all_reduce_into(x, out, op, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.arange(10).astype(dtype))


def test_all_reduce_in_place_keeps_its_input(comm, stream):
    x = on_device(np.arange(6, dtype=np.float32).reshape(2, 3), stream)
    ng.dist.all_reduce_into(x, x, stream=stream)
    np.testing.assert_array_equal(x.copy_to_host(stream=stream),
                                  np.arange(6, dtype=np.float32).reshape(2, 3))


def test_broadcast_from_the_only_rank(comm, stream):
    x = on_device(np.arange(5, dtype=np.float64), stream)
    out = on_device(np.zeros(5), stream)
    ng.dist.broadcast_into(x, out, root=0, stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.arange(5.0))


def test_reduce_scatter_and_all_gather_of_one_rank(comm, stream):
    x = on_device(np.arange(8, dtype=np.int32), stream)
    part = on_device(np.zeros(8, np.int32), stream)
    ng.dist.reduce_scatter_into(x, part, stream=stream)
    gathered = on_device(np.zeros((1, 8), np.int32), stream)
    ng.dist.all_gather_into(part, gathered, stream=stream)
    np.testing.assert_array_equal(gathered.copy_to_host(stream=stream)[0], np.arange(8))


def test_foreign_arrays_are_taken_by_their_interface(comm, stream):
    class Foreign:
        def __init__(self, dev):
            self.dev = dev
            self.__cuda_array_interface__ = active.array_interface(dev)

    x = on_device(np.arange(4, dtype=np.float32), stream)
    out = on_device(np.zeros(4, np.float32), stream)
    ng.dist.all_reduce_into(Foreign(x), Foreign(out), stream=stream)
    np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.arange(4))


# ---------------------------------------------------------------- in graphs

def _step(w, g, stream):
    """One data-parallel step: a gradient from w, summed over the ranks,
    then a descent step."""
    scale_add[1, 32, stream](g, np.float32(0.5), np.float32(1.0))
    ng.dist.all_reduce_into(g, g, stream=stream)
    descend[1, 32, stream](w, g, np.float32(0.1))


@pytest.mark.parametrize("replays", [1, 4])
def test_a_captured_step_replayed_n_times_equals_n_eager_steps(comm, stream, replays):
    start = np.linspace(-1, 1, 32).astype(np.float32)
    w_eager, g_eager = on_device(start, stream), on_device(start, stream)
    for _ in range(replays):
        _step(w_eager, g_eager, stream)
    w, g = on_device(start, stream), on_device(start, stream)
    stream.synchronize()
    with ng.capture(stream) as cap:
        _step(w, g, stream)
    np.testing.assert_array_equal(w.copy_to_host(stream=stream), start)  # recorded, not run
    for _ in range(replays):
        cap.graph.launch()
    np.testing.assert_array_equal(w.copy_to_host(stream=stream),
                                  w_eager.copy_to_host(stream=stream))
    np.testing.assert_array_equal(g.copy_to_host(stream=stream),
                                  g_eager.copy_to_host(stream=stream))
    cap.graph.close()


def test_every_collective_records_into_a_capture(comm, stream):
    x = on_device(np.arange(4, dtype=np.float32), stream)
    outs = [on_device(np.zeros(4, np.float32), stream) for _ in range(4)]
    with ng.capture(stream) as cap:
        ng.dist.all_reduce_into(x, outs[0], stream=stream)
        ng.dist.broadcast_into(x, outs[1], stream=stream)
        ng.dist.reduce_scatter_into(x, outs[2], stream=stream)
        ng.dist.all_gather_into(x, outs[3], stream=stream)
    assert not outs[0].copy_to_host(stream=stream).any()
    cap.graph.launch()
    for out in outs:
        np.testing.assert_array_equal(out.copy_to_host(stream=stream), np.arange(4))
    cap.graph.close()


def test_a_graph_with_collectives_refuses_to_move_their_arrays(comm, stream):
    x = on_device(np.arange(4, dtype=np.float32), stream)
    out, other = on_device(np.zeros(4, np.float32), stream), on_device(np.zeros(4, np.float32), stream)
    with ng.capture(stream) as cap:
        ng.dist.all_reduce_into(x, out, stream=stream)
    with pytest.raises(FixedNodesError, match="NCCL all_reduce"):
        cap.graph.rebind({out: other})
    assert issubclass(FixedNodesError, ng.RebindError)
    cap.graph.close()


def test_a_graph_keeps_its_communicator_open_until_it_is_closed(comm, stream):
    x = on_device(np.arange(4, dtype=np.float32), stream)
    with ng.capture(stream) as cap:
        ng.dist.all_reduce_into(x, x, stream=stream)
    with pytest.raises(ng.DistError, match="cannot be closed"):
        comm.close()
    assert not comm.closed
    cap.graph.close()
    comm.close()
    assert comm.closed


@pytest.mark.filterwarnings("ignore::numbagraph.CaptureWarning")
def test_a_communicator_is_not_closed_while_a_capture_is_in_progress(comm, stream):
    with ng.capture(stream):
        with pytest.raises(ng.DistError, match="while a capture is in progress"):
            comm.close()
        assert not comm.closed
    comm.close()
    assert comm.closed


# ---------------------------------------------------------------- refusals

def _refused(call, says, *outs, stream, error=ng.DistError):
    before = [o.copy_to_host(stream=stream) for o in outs]
    with pytest.raises(error, match=says):
        call()
    for o, b in zip(outs, before):
        np.testing.assert_array_equal(o.copy_to_host(stream=stream), b)


@pytest.mark.parametrize("dtype", [np.bool_, np.complex64, np.int16])
def test_a_dtype_nccl_has_no_type_for_is_refused(comm, stream, dtype):
    x = on_device(np.ones(4, dtype), stream)
    out = on_device(np.zeros(4, dtype), stream)
    _refused(lambda: ng.dist.all_reduce_into(x, out, stream=stream), "NCCL has no type for",
             out, stream=stream)


def test_mismatched_dtypes_and_shapes_are_refused(comm, stream):
    x = on_device(np.ones(4, np.float32), stream)
    wide = on_device(np.zeros(4, np.float64), stream)
    long = on_device(np.zeros(5, np.float32), stream)
    _refused(lambda: ng.dist.all_reduce_into(x, wide, stream=stream), "one dtype for both",
             wide, stream=stream)
    _refused(lambda: ng.dist.broadcast_into(x, long, stream=stream), "must be the same",
             long, stream=stream)
    _refused(lambda: ng.dist.reduce_scatter_into(x, long, stream=stream),
             "x must hold world size", long, stream=stream)
    _refused(lambda: ng.dist.all_gather_into(x, long, stream=stream),
             "out must hold world size", long, stream=stream)


def test_layouts_nccl_cannot_read_are_refused(comm, stream):
    x = on_device(np.arange(8, dtype=np.float32), stream)
    out = on_device(np.zeros(4, np.float32), stream)
    _refused(lambda: ng.dist.all_reduce_into(x[::2], out, stream=stream), "not C-contiguous",
             out, stream=stream)
    _refused(lambda: ng.dist.all_reduce_into(x[:4], x[2:6], stream=stream), "overlap",
             x, stream=stream)
    _refused(lambda: ng.dist.all_reduce_into(np.ones(4, np.float32), out, stream=stream),
             "must be a device array", out, stream=stream)


def test_bad_arguments_are_refused(comm, stream):
    x = on_device(np.ones(4, np.float32), stream)
    out = on_device(np.zeros(4, np.float32), stream)
    _refused(lambda: ng.dist.all_reduce_into(x, out, "mean", stream=stream),
             "op='mean' is not one of", out, stream=stream)
    _refused(lambda: ng.dist.broadcast_into(x, out, root=1, stream=stream),
             r"root must be a rank, an int in \[0, 1\)", out, stream=stream)
    _refused(lambda: ng.dist.all_reduce_into(x, out, stream=None), "stream= is required",
             out, stream=stream)
    _refused(lambda: ng.dist.all_reduce_into(x, out, stream=stream, comm="world"),
             "takes an ng.dist.Communicator", out, stream=stream)


def test_a_stream_of_another_device_than_the_communicators_is_refused(comm, stream,
                                                                     monkeypatch):
    x = on_device(np.ones(4, np.float32), stream)
    out = on_device(np.zeros(4, np.float32), stream)
    monkeypatch.setattr(comm, "device", comm.device + 1)
    _refused(lambda: ng.dist.all_reduce_into(x, out, stream=stream),
             f"the stream belongs to device {comm.device - 1}", out, stream=stream,
             error=ng.DeviceMismatchError)


def test_a_closed_communicator_is_refused(comm, stream):
    x = on_device(np.ones(4, np.float32), stream)
    comm.close()
    with pytest.raises(ng.DistError, match="needs a communicator"):
        ng.dist.all_reduce_into(x, x, stream=stream)
    with pytest.raises(ng.DistError, match="the communicator is closed"):
        ng.dist.all_reduce_into(x, x, stream=stream, comm=comm)


def test_a_collective_in_a_conditional_body_is_refused(comm, stream):
    x = on_device(np.ones(4, np.float32), stream)
    with ng.capture(stream) as cap:
        cond = ng.Condition(default=1)
        with ng.if_then(cond):
            with pytest.raises(ng.DistError, match="conditional body"):
                ng.dist.all_reduce_into(x, x, stream=stream)
    cap.graph.close()


# ---------------------------------------------------------------- the example, several GPUs

@needs_nccl
def test_the_example_runs_as_one_process(no_launcher):
    done = subprocess.run([sys.executable, "examples/data_parallel_step.py", "--steps", "3",
                           "--size", "64"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "match the single-process computation" in done.stdout


def _gpus() -> int:
    return 0 if ON_SIMULATOR else len(cuda.gpus)


@pytest.mark.driver_only(reason="several ranks need several GPUs and NCCL")
@pytest.mark.skipif(not HAS_NCCL, reason="needs nccl4py: pip install -e \".[dist]\"")
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun (PyTorch)")
def test_the_example_runs_on_two_gpus_under_torchrun():
    if _gpus() < 2:
        pytest.skip(f"needs 2 GPUs; this machine has {_gpus()}")
    done = subprocess.run(["torchrun", "--standalone", "--nproc-per-node=2",
                           "examples/data_parallel_step.py", "--steps", "5"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("match the single-process computation") == 2
