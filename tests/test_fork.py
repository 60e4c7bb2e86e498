"""Several streams in one capture: streams forked into a capture (ng.fork, or
numba's events by hand) record into the same graph, in parallel, and must be
joined back before the capture ends."""

import gc
import weakref

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph import _registry
from conftest import host

N = 64


@pytest.fixture(autouse=True)
def no_capture_left_behind():
    yield
    left = _registry.active()
    for session in left:  # keep one failure from cascading into the next tests
        ng.capture.__exit__(ng.capture(session.stream), KeyError, KeyError(), None)
    assert not left, "a test left a capture active"


@cuda.jit
def add_range(x, start, stop, v):
    """x[start:stop] += v."""
    i = start + cuda.grid(1)
    if i < stop:
        x[i] += v


@cuda.jit
def total(x, out):
    """out[0] = sum(x), on one thread."""
    if cuda.grid(1) == 0:
        acc = 0.0
        for i in range(x.size):
            acc += x[i]
        out[0] = acc


@cuda.jit
def count_down(counter, cond):
    """counter -= 1; the loop goes on while counter > 0."""
    if cuda.grid(1) == 0:
        counter[0] -= 1
        ng.set_condition(cond, counter[0] > 0)


@pytest.fixture
def streams(stream):
    """The capturing stream and three side streams."""
    return stream, cuda.stream(), cuda.stream(), cuda.stream()


@pytest.fixture
def x(stream):
    """N float32 zeros, with the kernels compiled."""
    a = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    out = cuda.to_device(np.zeros(1, np.float32), stream=stream)
    add_range[1, N, stream](a, 0, N, np.float32(0.0))
    total[1, 1, stream](a, out)
    return a


@pytest.fixture
def out(stream):
    return cuda.to_device(np.zeros(1, np.float32), stream=stream)


def _usable(s, *others):
    """Every stream runs work at once, and a new capture on ``s`` works."""
    assert not ng.is_capturing(s)
    for other in others:
        assert not ng.is_capturing(other)
        y = cuda.to_device(np.zeros(N, np.float32), stream=other)
        add_range[1, N, other](y, 0, N, np.float32(1.0))
        np.testing.assert_array_equal(host(y, other), 1.0)
    y = cuda.to_device(np.zeros(N, np.float32), stream=s)
    with ng.capture(s) as cap:
        add_range[1, N, s](y, 0, N, np.float32(1.0))
    cap.graph.launch()
    np.testing.assert_array_equal(host(y, s), 1.0)


# ---------------------------------------------------------------- ng.fork


def test_two_streams_write_halves_and_the_joined_stream_reads_both(streams, x, out):
    s, s2 = streams[:2]
    with ng.capture(s) as cap:
        with ng.fork(s2):
            assert ng.is_capturing(s2)
            add_range[1, N, s2](x, 0, N // 2, np.float32(1.0))
        add_range[1, N, s](x, N // 2, N, np.float32(2.0))
        total[1, 1, s](x, out)              # after the join: reads both halves
    assert not ng.is_capturing(s2)
    np.testing.assert_array_equal(host(x, s), 0.0)  # recorded, not run
    for launches in (1, 2, 3):
        cap.graph.launch()
        expected = np.r_[np.full(N // 2, 1.0 * launches), np.full(N // 2, 2.0 * launches)]
        np.testing.assert_array_equal(host(x, s), expected)
        assert host(out, s)[0] == expected.sum()


def test_three_side_streams_each_write_a_quarter(streams, x, out):
    s, *sides = streams
    q = N // 4
    with ng.capture(s) as cap:
        for k, side in enumerate(sides):
            with ng.fork(side):
                add_range[1, N, side](x, k * q, (k + 1) * q, np.float32(k + 1))
        add_range[1, N, s](x, 3 * q, N, np.float32(4.0))
        total[1, 1, s](x, out)
    cap.graph.launch()
    expected = np.repeat(np.arange(1, 5, dtype=np.float32), q)
    np.testing.assert_array_equal(host(x, s), expected)
    assert host(out, s)[0] == expected.sum()


def test_nested_forks_fork_from_the_block_around_them(streams, x, out):
    s, s2, s3, s4 = streams
    far = cuda.to_device(np.zeros(N, np.float32), stream=s)
    far_out = cuda.to_device(np.zeros(1, np.float32), stream=s)
    with ng.capture(s) as cap:
        with ng.fork(s2) as outer:
            add_range[1, N, s2](x, 0, N // 2, np.float32(1.0))
            with ng.fork(s3) as inner:
                add_range[1, N, s3](x, N // 2, N, np.float32(2.0))
                with ng.fork(s4, parent=s):       # named: from the capture's stream
                    # Its own array: it runs beside the adds of s2 and s3.
                    add_range[1, N, s4](far, 0, N, np.float32(10.0))
            assert inner._parent is s2 and outer._parent is s
            add_range[1, N, s2](x, 0, N // 2, np.float32(1.0))   # after s3 joined s2
        total[1, 1, s](x, out)
        total[1, 1, s](far, far_out)                  # after s4 joined s
    cap.graph.launch()
    expected = np.r_[np.full(N // 2, 2.0), np.full(N // 2, 2.0)]
    np.testing.assert_array_equal(host(x, s), expected)
    assert host(out, s)[0] == expected.sum()
    assert host(far_out, s)[0] == 10.0 * N


def test_launches_ops_scalars_and_graph_memory_on_a_forked_stream_are_the_graph_s(
        streams, x, out):
    s, s2 = streams[:2]
    only_here = cuda.to_device(np.full(N, 3.0, np.float32), stream=s)
    step = ng.DeviceScalar(0.0, dtype=np.float32, stream=s2)
    ref = weakref.ref(only_here)
    with ng.capture(s) as cap:
        with ng.fork(s2):
            step.update(5.0)                               # recorded on s2
            tmp = ng.empty(N, np.float32, stream=s2)       # graph memory, on s2
            ng.copy_into(only_here, tmp, stream=s2)
            ng.add_into(tmp, step, tmp, stream=s2)
            ng.copy_into(tmp, x, stream=s2)
            ng.free(tmp)
        total[1, 1, s](x, out)
    del only_here
    gc.collect()
    assert ref() is not None                               # the graph keeps it
    step.update(100.0)
    s2.synchronize()              # the update is made on s2, the launch on s
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, s), 8.0)
    assert host(out, s)[0] == 8.0 * N
    assert cap.graph.memory_bytes == N * 4


def test_a_reduction_on_a_forked_stream_allocates_and_frees_its_scratch_there(streams):
    from numbagraph.backend import active
    from numbagraph.ops import _reduce_kernels, reduce as _reduce

    s, s2 = streams[:2]
    many = 4 * _reduce_kernels.ADDITIVE_UNROLL * active.launch_limits()[1]
    values = cuda.to_device(np.arange(many, dtype=np.float32) % 7, stream=s)
    result = ng.DeviceScalar(0.0, dtype=np.float32, stream=s)
    _reduce._scratch.pop((active.stream_handle(s2), active.current_device_id()), None)
    with ng.capture(s) as cap:
        with ng.fork(s2):
            ng.sum_into(values, result, stream=s2)
    assert cap.graph.memory_bytes > 0
    cap.graph.launch()
    assert result.value == float((np.arange(many) % 7).sum())


def test_a_fork_left_unjoined_is_refused_naming_the_stream_and_all_stays_usable(streams, x):
    s, s2 = streams[:2]
    forked = cuda.event()
    with pytest.raises(ng.ForeignStreamInCaptureError) as refused:
        with ng.capture(s):
            add_range[1, N, s](x, 0, N, np.float32(1.0))
            forked.record(s)
            forked.wait(s2)
            add_range[1, N, s2](x, 0, N, np.float32(1.0))
    message = str(refused.value)
    assert repr(s2) in message and "not joined back" in message
    assert "UNJOINED" in message and "ng.fork" in message
    np.testing.assert_array_equal(host(x, s), 0.0)     # no graph, nothing ran
    _usable(s, s2)


def test_a_fork_with_no_work_must_be_joined_back_too(streams, x):
    s, s2 = streams[:2]
    forked = cuda.event()
    with pytest.raises(ng.ForeignStreamInCaptureError, match="not joined back"):
        with ng.capture(s):
            add_range[1, N, s](x, 0, N, np.float32(1.0))
            forked.record(s)
            forked.wait(s2)
    _usable(s, s2)


def test_work_on_a_joined_stream_forks_it_again(streams, x):
    s, s2 = streams[:2]
    with pytest.raises(ng.ForeignStreamInCaptureError, match="not joined back"):
        with ng.capture(s):
            with ng.fork(s2):
                add_range[1, N, s2](x, 0, N, np.float32(1.0))
            add_range[1, N, s2](x, 0, N, np.float32(1.0))   # after the join
    _usable(s, s2)
    with ng.capture(s) as cap:
        with ng.fork(s2):
            add_range[1, N, s2](x, 0, N, np.float32(1.0))
        add_range[1, N, s2](x, 0, N, np.float32(1.0))
        with ng.fork(s2):                                    # joined again
            add_range[1, N, s2](x, 0, N, np.float32(1.0))
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, s), 3.0)


def test_numba_events_fork_and_join_by_hand(streams, x, out):
    s, s2 = streams[:2]
    fork, join = cuda.event(), cuda.event()
    with ng.capture(s) as cap:
        add_range[1, N, s](x, 0, N, np.float32(1.0))
        fork.record(s)
        fork.wait(s2)
        assert ng.is_capturing(s2)
        add_range[1, N, s2](x, 0, N // 2, np.float32(2.0))
        add_range[1, N, s](x, N // 2, N, np.float32(3.0))
        join.record(s2)
        join.wait(s)
        total[1, 1, s](x, out)
    assert not ng.is_capturing(s2)
    cap.graph.launch()
    expected = np.r_[np.full(N // 2, 3.0), np.full(N // 2, 4.0)]
    np.testing.assert_array_equal(host(x, s), expected)
    assert host(out, s)[0] == expected.sum()


def test_a_stream_joined_into_a_joined_stream_is_joined(streams, x):
    s, s2, s3 = streams[:3]
    a, b, c, d = (cuda.event() for _ in range(4))
    with ng.capture(s) as cap:
        a.record(s)
        a.wait(s2)
        b.record(s2)
        b.wait(s3)                        # s3 forked from s2
        add_range[1, N, s3](x, 0, N, np.float32(1.0))
        c.record(s3)
        c.wait(s2)                        # s3 joined into s2 ...
        d.record(s2)
        d.wait(s)                         # ... and s2 into s
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, s), 1.0)


def test_a_stream_joined_into_a_stream_after_that_stream_joined_is_not(streams, x):
    s, s2, s3 = streams[:3]
    a, b, c, d = (cuda.event() for _ in range(4))
    with pytest.raises(ng.ForeignStreamInCaptureError) as refused:
        with ng.capture(s):
            a.record(s)
            a.wait(s2)
            b.record(s2)
            b.wait(s3)
            add_range[1, N, s3](x, 0, N, np.float32(1.0))
            d.record(s2)
            d.wait(s)                     # s2 joined into s first ...
            c.record(s3)
            c.wait(s2)                    # ... then s3 into s2: s3's work is not in s
    assert repr(s2) in str(refused.value)
    _usable(s, s2, s3)


def test_a_refused_operation_on_a_forked_stream_ends_the_capture(streams, x):
    s, s2 = streams[:2]
    with pytest.raises(ng.SyncInCaptureError):
        with ng.capture(s):
            with ng.fork(s2):
                add_range[1, N, s2](x, 0, N, np.float32(1.0))
                s2.synchronize()
    with pytest.raises(ng.HostCopyInCaptureError):
        with ng.capture(s):
            with ng.fork(s2):
                x.copy_to_host(stream=s2)
    np.testing.assert_array_equal(host(x, s), 0.0)
    _usable(s, s2)


# ---------------------------------------------------------------- what ng.fork refuses


def test_fork_outside_a_capture_is_refused(streams):
    s, s2 = streams[:2]
    with pytest.raises(ng.CaptureStateError, match="captures on no stream"):
        with ng.fork(s2):
            pass
    with pytest.raises(ng.CaptureStateError, match="not capturing"):
        with ng.fork(s2, parent=s):
            pass
    with pytest.raises(TypeError):
        with ng.fork("s2"):
            pass


@pytest.mark.parametrize("case", ["own", "itself", "legacy", "twice", "other_capture"])
def test_a_bad_fork_is_refused_and_the_capture_goes_on(streams, x, case):
    s, s2, s3 = streams[:3]
    with ng.capture(s) as cap:
        add_range[1, N, s](x, 0, N, np.float32(1.0))
        with pytest.raises(ng.CaptureStateError) as refused:
            if case == "own":
                with ng.fork(s):
                    pass
            elif case == "itself":
                with ng.fork(s2):
                    with ng.fork(s2, parent=s2):
                        pass
            elif case == "legacy":
                with ng.fork(cuda.default_stream()):
                    pass
            elif case == "twice":
                with ng.fork(s2):
                    with ng.fork(s2, parent=s):
                        pass
            else:
                ng.begin_capture(s3, mode="relaxed")
                try:
                    with ng.fork(s3, parent=s):
                        pass
                finally:
                    ng.abort_capture(s3)
        assert "The capture goes on" in str(refused.value)
        add_range[1, N, s](x, 0, N, np.float32(1.0))
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, s), 2.0)


def test_several_captures_on_a_thread_need_a_parent(streams, x):
    s, s2, s3 = streams[:3]
    y = cuda.to_device(np.zeros(N, np.float32), stream=s2)
    with ng.capture(s) as one, ng.capture(s2) as two:
        with pytest.raises(ng.CaptureStateError, match="parent="):
            with ng.fork(s3):
                pass
        with ng.fork(s3, parent=s2):
            add_range[1, N, s3](y, 0, N, np.float32(1.0))
        add_range[1, N, s](x, 0, N, np.float32(1.0))
    one.graph.launch()
    two.graph.launch()
    np.testing.assert_array_equal(host(x, s), 1.0)
    np.testing.assert_array_equal(host(y, s2), 1.0)


def test_a_capture_is_ended_on_its_own_stream_only(streams, x):
    s, s2 = streams[:2]
    with ng.capture(s) as cap:
        with ng.fork(s2):
            add_range[1, N, s2](x, 0, N, np.float32(1.0))
            for end in (ng.end_capture, ng.abort_capture):
                with pytest.raises(ng.CaptureStateError, match="forked into the capture"):
                    end(s2)
            assert ng.is_capturing(s) and ng.is_capturing(s2)
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, s), 1.0)


def test_beginning_a_capture_on_a_forked_stream_is_refused(streams, x):
    s, s2 = streams[:2]
    with pytest.raises(ng.CaptureStateError, match="forked into the capture"):
        with ng.capture(s):
            with ng.fork(s2):
                ng.begin_capture(s2)
    _usable(s, s2)


# ---------------------------------------------------------------- conditionals


def test_a_conditional_block_while_a_fork_is_open_is_refused_and_the_capture_goes_on(
        streams, x):
    s, s2 = streams[:2]
    counter = cuda.to_device(np.array([3], np.int32), stream=s)
    _pos = ng.DeviceScalar(0, dtype=np.int32, stream=s)
    with ng.capture(s) as cap:
        more = ng.Condition(default=1)
        with ng.fork(s2):
            add_range[1, N, s2](x, 0, N, np.float32(1.0))
            with pytest.raises(ng.ConditionalError, match="not joined back") as refused:
                with ng.while_loop(more):
                    pass
            assert repr(s2) in str(refused.value)
            with pytest.raises(ng.ConditionalError, match="forked into the capture"):
                ng.while_loop(more, stream=s2)
        with ng.fork(s2):
            add_range[1, N, s2](x, 0, N, np.float32(1.0))
            with pytest.raises(ng.ConditionalError, match="not joined back"):
                with ng.repeat(_pos, until=2):
                    pass
            with pytest.raises(ng.ConditionalError, match="forked into the capture"):
                with ng.repeat(_pos, until=2, stream=s2):
                    pass
        with ng.while_loop(more):                 # once joined back: recorded
            add_range[1, N, s](x, 0, N, np.float32(1.0))
            count_down[1, 1, s](counter, more)
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, s), 5.0)


def test_a_fork_inside_a_loop_body_runs_at_every_pass(streams, x):
    s, s2 = streams[:2]
    counter = cuda.to_device(np.array([3], np.int32), stream=s)
    with ng.capture(s) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            with ng.fork(s2):
                add_range[1, N, s2](x, 0, N // 2, np.float32(1.0))
            add_range[1, N, s](x, N // 2, N, np.float32(2.0))
            count_down[1, 1, s](counter, more)
        assert not ng.is_capturing(s2)            # it left with the body
    cap.graph.launch()
    expected = np.r_[np.full(N // 2, 3.0), np.full(N // 2, 6.0)]
    np.testing.assert_array_equal(host(x, s), expected)


def test_a_stream_forked_and_joined_leaves_the_capture_at_a_conditional_block(streams, x):
    s, s2 = streams[:2]
    counter = cuda.to_device(np.array([1], np.int32), stream=s)
    with ng.capture(s) as cap:
        with ng.fork(s2):
            add_range[1, N, s2](x, 0, N, np.float32(1.0))
        assert ng.is_capturing(s2)
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            count_down[1, 1, s](counter, more)
        assert not ng.is_capturing(s2)
        add_range[1, N, s2](x, 0, N, np.float32(5.0))  # s2 runs at once now
        with ng.fork(s2):                              # and may fork again
            add_range[1, N, s2](x, 0, N, np.float32(1.0))
    np.testing.assert_array_equal(host(x, s2), 5.0)   # read where it was written
    cap.graph.launch()
    np.testing.assert_array_equal(host(x, s), 7.0)


def test_a_body_ending_with_a_fork_left_unjoined_is_refused(streams, x):
    s, s2 = streams[:2]
    counter = cuda.to_device(np.array([1], np.int32), stream=s)
    forked = cuda.event()
    with pytest.raises(ng.ConditionalError, match="not joined back"):
        with ng.capture(s):
            more = ng.Condition(default=1)
            with ng.while_loop(more):
                forked.record(s)
                forked.wait(s2)
                add_range[1, N, s2](x, 0, N, np.float32(1.0))
                count_down[1, 1, s](counter, more)
    _usable(s, s2)
