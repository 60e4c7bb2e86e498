"""ng.increment and ng.repeat: counters the graph advances, and loops it runs
to a limit or to a stop a kernel decides."""

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng


@cuda.jit
def record(log, pos):
    """log[pos] = 10 * pos."""
    if cuda.grid(1) == 0:
        log[int(pos[0])] = int(pos[0]) * 10


@cuda.jit
def stop_at(pos, token, cond):
    """End the loop once pos reaches token."""
    if cuda.grid(1) == 0 and pos[0] == token:
        ng.set_condition(cond, 0)


@cuda.jit
def accumulate(total, step):
    if cuda.grid(1) == 0:
        total[0] += step[0]


@pytest.fixture
def tally(stream):
    """``(total, one)``: an int32 total at zero and a scalar 1, ``accumulate``
    compiled outside any capture."""
    total = zeros(1, stream)
    one = ng.DeviceScalar(1, np.int32, stream=stream)
    accumulate[1, 1, stream](total, one)
    total.copy_to_device(np.zeros(1, np.int32), stream=stream)
    return total, one


def zeros(n, stream, dtype=np.int32):
    return cuda.to_device(np.zeros(n, dtype), stream=stream)


def written(log, stream):
    return [i for i, v in enumerate(log.copy_to_host(stream=stream)) if v]


def test_increment_in_a_capture_advances_the_counter_at_every_launch(stream):
    log = zeros(8, stream)
    pos = ng.DeviceScalar(1, np.int32, stream=stream)
    record[1, 1, stream](log, pos)
    with ng.capture(stream) as cap:
        record[1, 1, stream](log, pos)
        ng.increment(pos, by=2)
    for _ in range(3):
        cap.graph.launch()
    assert pos.value == 7
    assert written(log, stream) == [1, 3, 5]


def test_increment_outside_a_capture_runs_at_once(stream):
    t = ng.DeviceScalar(0.5, np.float64, stream=stream)
    ng.increment(t, by=0.25)
    assert t.value == 0.75


def test_repeat_runs_until_the_counter_reaches_its_limit(stream):
    log = zeros(16, stream)
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    record[1, 1, stream](log, pos)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=5):
            record[1, 1, stream](log, pos)
    pos.update(2)
    cap.graph.launch()
    assert pos.value == 5
    assert written(log, stream) == [2, 3, 4]


def test_a_kernel_ends_the_loop_early_and_the_counter_says_where(stream):
    log = zeros(16, stream)
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    record[1, 1, stream](log, pos)
    ng.precompile(stop_at, pos, 0, ng.Condition)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=12) as loop:
            record[1, 1, stream](log, pos)
            stop_at[1, 1, stream](pos, 6, loop.cond)
    pos.update(1)
    cap.graph.launch()
    assert pos.value == 7           # the pass at 6 ran, then the loop ended
    assert written(log, stream) == [1, 2, 3, 4, 5, 6]
    pos.update(9)                   # past the stop token: the limit ends it
    cap.graph.launch()
    assert pos.value == 12


def test_a_counter_already_at_its_limit_runs_no_pass(stream, tally):
    total, one = tally
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=3):
            accumulate[1, 1, stream](total, one)
    pos.update(3)
    cap.graph.launch()
    assert total.copy_to_host(stream=stream)[0] == 0 and pos.value == 3


def test_a_device_scalar_limit_is_read_at_each_launch(stream, tally):
    total, one = tally
    pos = ng.DeviceScalar(0, np.int64, stream=stream)
    limit = ng.DeviceScalar(4, np.int64, stream=stream)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=limit):
            accumulate[1, 1, stream](total, one)
    pos.update(0)
    cap.graph.launch()
    limit.update(10)
    pos.update(0)
    cap.graph.launch()
    assert total.copy_to_host(stream=stream)[0] == 4 + 10


def test_a_float_counter_steps_time_to_its_end(stream, tally):
    total, one = tally
    t = ng.DeviceScalar(0.0, np.float64, stream=stream)
    with ng.capture(stream) as cap:
        with ng.repeat(t, until=1.0, by=0.125):
            accumulate[1, 1, stream](total, one)
    cap.graph.launch()
    assert t.value == 1.0
    assert total.copy_to_host(stream=stream)[0] == 8


def test_a_repeat_nests_inside_an_if_then(stream, tally):
    total, one = tally
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    for run, expected in ((1, 3), (0, 0)):
        total.copy_to_device(np.zeros(1, np.int32), stream=stream)
        with ng.capture(stream) as cap:
            go = ng.Condition(default=run)
            with ng.if_then(go):
                with ng.repeat(pos, until=3):
                    accumulate[1, 1, stream](total, one)
        pos.update(0)
        cap.graph.launch()
        assert total.copy_to_host(stream=stream)[0] == expected


def test_bad_counters_steps_and_limits_are_refused(stream):
    pos = ng.DeviceScalar(0, np.int8, stream=stream)
    flag = ng.DeviceScalar(True, np.bool_, stream=stream)
    with pytest.raises(TypeError, match="DeviceScalar counter"):
        ng.increment(zeros(1, stream))
    with pytest.raises(ng.ScalarValueError, match="cannot be advanced"):
        ng.increment(flag)
    with pytest.raises(ng.ScalarValueError, match="does not fit int8"):
        ng.increment(pos, by=300)
    with pytest.raises(ng.ScalarValueError, match="not a number"):
        ng.increment(pos, by="1")
    with ng.capture(stream):
        with pytest.raises(TypeError, match="until"):
            ng.repeat(pos, until="ten")
        ng.increment(pos)
    assert pos.value == 0


def test_repeat_outside_a_capture_is_refused(stream):
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    with pytest.raises(ng.ConditionalError):
        with ng.repeat(pos, until=3):
            pass


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the simulator's NumPy
def test_a_counter_that_wraps_around_ends_the_loop(stream, tally):
    total, one = tally
    pos = ng.DeviceScalar(0, np.int8, stream=stream)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=127, by=2):
            accumulate[1, 1, stream](total, one)
    pos.update(120)
    cap.graph.launch()     # 120 .. 126, then 126 + 2 wraps to -128: the loop ends
    assert total.copy_to_host(stream=stream)[0] == 4
    assert pos.value == -128


def test_a_float_counter_too_large_to_move_ends_the_loop(stream, tally):
    total, one = tally
    t = ng.DeviceScalar(0.0, np.float32, stream=stream)
    with ng.capture(stream) as cap:
        with ng.repeat(t, until=2.0 ** 25, by=1.0):
            accumulate[1, 1, stream](total, one)
    t.update(2.0 ** 24)    # + 1.0 rounds back to 2**24
    cap.graph.launch()
    assert total.copy_to_host(stream=stream)[0] == 1


@pytest.mark.parametrize("kwargs, error, match", [
    ({"until": 10, "by": 0}, ng.ScalarValueError, "above zero"),
    ({"until": 10, "by": -1}, ng.ScalarValueError, "above zero"),
    ({"until": float("nan")}, ng.ScalarValueError, "NaN"),
    ({"until": "ten"}, TypeError, "until"),
])
def test_loops_that_could_not_end_are_refused(stream, kwargs, error, match):
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    with pytest.raises(error, match=match):
        ng.repeat(pos, **kwargs)


def test_a_device_scalar_limit_of_another_dtype_is_refused(stream):
    pos = ng.DeviceScalar(0, np.uint64, stream=stream)
    with pytest.raises(ng.ScalarValueError, match="give until the counter's dtype"):
        ng.repeat(pos, until=ng.DeviceScalar(5, np.int64, stream=stream))


def test_a_loop_records_once_and_one_never_opened_leaves_no_trace(stream, tally):
    total, one = tally
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    with ng.capture(stream) as cap:
        ng.repeat(pos, until=3)            # made, never opened: nothing recorded
        loop = ng.repeat(pos, until=3)
        with loop:
            accumulate[1, 1, stream](total, one)
        with pytest.raises(ng.ConditionalError, match="recorded already"):
            with loop:
                pass
    assert cap.graph.num_nodes == 2        # the check before the loop, and the loop


def test_work_on_a_counter_of_another_stream_warns_that_it_ran_at_once(stream, other_stream):
    pos = ng.DeviceScalar(0, np.int32, stream=other_stream)
    seen = ng.HostScalar(np.int32)
    one = ng.DeviceScalar(1, np.int32, stream=stream)
    total = zeros(1, stream)
    accumulate[1, 1, stream](total, one)
    with ng.capture(stream):
        accumulate[1, 1, stream](total, one)
        with pytest.warns(ng.CaptureWarning, match=r"ng.increment\(by=1\) ran at once"):
            ng.increment(pos)
        with pytest.warns(ng.CaptureWarning, match="read_async.. ran at once"):
            pos.read_async(seen)


def test_stop_when_refuses_another_stream_and_limits_the_value_cannot_hold(
        stream, other_stream):
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    small = ng.DeviceScalar(0, np.int8, stream=stream)
    with ng.capture(stream):
        with ng.repeat(pos, until=3) as loop:
            with pytest.raises(ng.ConditionalError, match="record the check there"):
                ng.stop_when(loop.cond, pos, below=1, stream=other_stream)
            with pytest.raises(TypeError, match="not a int8 value"):
                ng.stop_when(loop.cond, small, above=1000)
            with pytest.raises(TypeError, match="not a int32 value"):
                ng.stop_when(loop.cond, pos, above=2.5)


def test_a_limit_the_counter_cannot_hold_is_refused(stream):
    pos = ng.DeviceScalar(0, np.int8, stream=stream)
    with ng.capture(stream):
        with pytest.raises(ng.ScalarValueError, match="counter can reach"):
            ng.repeat(pos, until=1000)
        ng.increment(pos)


def test_a_wide_unsigned_counter_counts_exactly(stream):
    start = 2**63 + 5
    pos = ng.DeviceScalar(start, np.uint64, stream=stream)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=start + 3):
            ng.increment(pos, by=0)
    cap.graph.launch()
    assert pos.value == start + 3


def test_read_async_copies_into_a_host_scalar_in_stream_order(stream):
    pos = ng.DeviceScalar(41, np.int32, stream=stream)
    seen = ng.HostScalar(np.int32)
    assert seen.value == 0
    pos.read_async(seen)
    stream.synchronize()
    assert seen.value == 41


def test_a_recorded_read_shows_the_progress_of_a_loop_on_the_gpu(stream, tally):
    total, one = tally
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    seen = ng.HostScalar(np.int32)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=6):
            accumulate[1, 1, stream](total, one)
            pos.read_async(seen)            # each pass: where the loop is
    cap.graph.launch()
    stream.synchronize()
    assert seen.value == 5                  # read before the last advance
    assert pos.value == 6


def test_read_async_refuses_another_dtype_or_kind(stream):
    pos = ng.DeviceScalar(1, np.int32, stream=stream)
    with pytest.raises(ng.ScalarValueError, match="make a HostScalar of int32"):
        pos.read_async(ng.HostScalar(np.float32))
    with pytest.raises(TypeError, match="HostScalar"):
        pos.read_async(np.zeros(1, np.int32))
    with pytest.raises(ng.ScalarValueError, match="does not support"):
        ng.HostScalar(np.complex64)


def test_a_host_scalar_is_made_outside_a_capture(stream):
    with pytest.raises(ng.CaptureInvalidatedError):   # the refusal ended the capture
        with ng.capture(stream):
            with pytest.raises(ng.AllocationInCaptureError, match="HostScalar"):
                ng.HostScalar(np.int32)
    assert not ng.is_capturing(stream)


@cuda.jit
def halve_residual(res):
    if cuda.grid(1) == 0:
        res[0] = res[0] / 2


def test_stop_when_ends_a_loop_at_a_tolerance(stream):
    res = cuda.to_device(np.array([1.0], np.float64), stream=stream)
    it = ng.DeviceScalar(0, np.int32, stream=stream)
    halve_residual[1, 1, stream](res)
    with ng.capture(stream) as cap:
        with ng.repeat(it, until=100) as loop:
            halve_residual[1, 1, stream](res)
            ng.stop_when(loop.cond, res, below=1e-3)
    res.copy_to_device(np.array([1.0]), stream=stream)
    cap.graph.launch()
    assert it.value == 10                    # 2**-10 < 1e-3 <= 2**-9
    assert res.copy_to_host(stream=stream)[0] == 2.0 ** -10


def test_stop_when_above_reads_a_device_scalar(stream, tally):
    total, one = tally
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    with ng.capture(stream) as cap:
        with ng.repeat(pos, until=50) as loop:
            ng.increment(one)                # 1, 2, 3, ... added each pass
            accumulate[1, 1, stream](total, one)
            ng.stop_when(loop.cond, one, above=4)
    one.update(1)
    cap.graph.launch()
    assert total.copy_to_host(stream=stream)[0] == 2 + 3 + 4 + 5
    assert pos.value == 4


def test_stop_when_refuses_what_it_cannot_read(stream):
    pos = ng.DeviceScalar(0, np.int32, stream=stream)
    with ng.capture(stream):
        with ng.repeat(pos, until=3) as loop:
            with pytest.raises(ValueError, match="exactly one"):
                ng.stop_when(loop.cond, pos)
            with pytest.raises(TypeError, match="not a number"):
                ng.stop_when(loop.cond, pos, below="x")
            with pytest.raises(TypeError, match="DeviceScalar or a device array"):
                ng.stop_when(loop.cond, np.zeros(1), below=1)
            with pytest.raises(TypeError, match="takes a Condition"):
                ng.stop_when(pos, pos, below=1)
