"""ng.repeat called with a function that records one pass: several passes per
iteration of the loop's while node (``unroll``), each behaving exactly as
the loop with one pass per iteration would: the same passes, in the same
order, reading the same counter values, stopped by a kernel at the same pass,
and the counter left at the same value."""

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph import loops


@cuda.jit
def trace(log, pos):
    """Append pos[0] to log: log[0] counts the entries, log[1:] holds them."""
    if cuda.grid(1) == 0:
        n = int(log[0]) + 1
        log[0] = n
        log[n] = pos[0]


@cuda.jit
def stop_at(pos, token, cond):
    """End the loop after the pass where pos reaches token."""
    if cuda.grid(1) == 0 and pos[0] == token:
        ng.set_condition(cond, 0)


@cuda.jit
def set_to(cond, value):
    """Set cond to value."""
    if cuda.grid(1) == 0:
        ng.set_condition(cond, value)


@cuda.jit
def reset(counter):
    """counter[0] = 0."""
    if cuda.grid(1) == 0:
        counter[0] = 0


@cuda.jit
def add_position(acc, pos):
    """acc[0] += pos[0] + 1."""
    if cuda.grid(1) == 0:
        acc[0] += pos[0] + 1


@cuda.jit
def double_into(out, pos):
    """out[0] = 2 * pos[0]."""
    if cuda.grid(1) == 0:
        out[0] = 2 * pos[0]


LOG = 80  # entries a log holds (log[0] is the count)


def new_log(stream):
    return cuda.to_device(np.zeros(LOG + 1, np.float64), stream=stream)


def clear(array, stream):
    array.copy_to_device(np.zeros(array.shape, array.dtype), stream=stream)


def entries(log, stream):
    """The values trace appended, in order."""
    host = log.copy_to_host(stream=stream)
    return host[1:1 + int(host[0])].tolist()


def counted(start, until, by=1):
    """What a counted loop does: the counter's value at each pass, and the
    counter afterwards."""
    values, c = [], start
    while c < until:
        values.append(c)
        c += by
    return values, c


@pytest.fixture
def pos(stream):
    """An int32 counter at 0; trace, stop_at and set_to compiled for it
    outside any capture."""
    counter = ng.DeviceScalar(0, np.int32, stream=stream)
    log = new_log(stream)
    trace[1, 1, stream](log, counter)
    ng.precompile(stop_at, counter, 0, ng.Condition)
    ng.precompile(set_to, ng.Condition, 0)
    return counter


@pytest.fixture
def log(stream):
    return new_log(stream)


def record(stream, counter, until, record_pass, *, by=1, unroll):
    """A capture holding only ``ng.repeat(...)(record_pass)``; its graph and
    the loop."""
    with ng.capture(stream) as cap:
        loop = ng.repeat(counter, until=until, by=by, unroll=unroll)(record_pass)
    return cap.graph, loop


# ---------------------------------------------------------------- counted loops

COUNTED = [
    pytest.param(np.int32, 0, 12, 1, id="0-to-12"),
    pytest.param(np.int32, 0, 7, 1, id="remainder"),
    pytest.param(np.int32, 5, 16, 1, id="from-5"),
    pytest.param(np.int64, 0, 37, 1, id="many-iterations"),
    pytest.param(np.int32, 1, 12, 2, id="by-2"),
    pytest.param(np.float32, 0.25, 3.0, 0.5, id="float-by-0.5"),
    pytest.param(np.int32, 4, 5, 1, id="one-pass"),
]


@pytest.mark.parametrize("unroll", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype, start, until, by", COUNTED)
def test_a_counted_loop_runs_each_pass_once_in_order_and_leaves_the_counter_past_its_limit(
        stream, log, unroll, dtype, start, until, by):
    counter = ng.DeviceScalar(start, dtype, stream=stream)

    def step(loop):
        trace[1, 1, stream](log, loop.counter)

    graph, loop = record(stream, counter, until, step, by=by, unroll=unroll)
    assert loop.unroll == unroll
    graph.launch()
    values, end = counted(start, until, by)
    assert entries(log, stream) == values
    assert counter.value == end


@pytest.mark.parametrize("unroll", [1, 4])
@pytest.mark.parametrize("start", [10, 13], ids=["at-limit", "past-limit"])
def test_a_counter_already_at_its_limit_runs_no_pass(stream, log, pos, unroll, start):
    graph, _ = record(stream, pos, 10, lambda loop: trace[1, 1, stream](log, pos),
                      unroll=unroll)
    pos.update(start)
    graph.launch()
    assert entries(log, stream) == []
    assert pos.value == start


@pytest.mark.parametrize("unroll", [1, 3, 4])
def test_a_relaunch_loops_again_from_the_counter_s_new_value(stream, log, pos, unroll):
    graph, _ = record(stream, pos, 10, lambda loop: trace[1, 1, stream](log, pos),
                      unroll=unroll)
    for start in (0, 6, 2, 9, 10):
        clear(log, stream)
        pos.update(start)
        graph.launch()
        assert entries(log, stream) == list(range(start, 10))
        assert pos.value == 10
    clear(log, stream)
    graph.launch()                       # the counter is still at its limit
    assert entries(log, stream) == [] and pos.value == 10


def test_two_unrolled_loops_in_one_capture_each_keep_their_own_count(stream, log, pos):
    other = ng.DeviceScalar(0, np.int32, stream=stream)
    trace[1, 1, stream](log, other)
    clear(log, stream)
    with ng.capture(stream) as cap:
        ng.repeat(pos, until=5, unroll=3)(lambda loop: trace[1, 1, stream](log, pos))
        ng.repeat(other, until=4, unroll=2)(lambda loop: trace[1, 1, stream](log, other))
    cap.graph.launch()
    assert entries(log, stream) == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert (pos.value, other.value) == (5, 4)


def test_the_largest_unroll_records_max_unroll_passes(stream, log, pos):
    graph, loop = record(stream, pos, 70, lambda loop: trace[1, 1, stream](log, pos),
                         unroll=ng.MAX_UNROLL)
    assert loop.unroll == ng.MAX_UNROLL == 64
    graph.launch()
    assert entries(log, stream) == list(range(70))
    assert pos.value == 70


@pytest.mark.parametrize("unroll", [1, 3, "auto"])
def test_the_function_records_one_pass_per_call_and_the_decorator_gives_the_loop(
        stream, log, pos, unroll):
    calls = []
    with ng.capture(stream):
        @ng.repeat(pos, until=5, unroll=unroll)
        def loop(loop_):
            calls.append(loop_)
            trace[1, 1, stream](log, pos)
    assert isinstance(loop, ng.RepeatLoop)
    assert isinstance(loop.cond, ng.Condition)
    assert calls == [loop] * loop.unroll


def test_an_empty_pass_still_moves_the_counter_to_its_limit(stream, pos):
    graph, loop = record(stream, pos, 11, lambda loop: None, unroll=4)
    graph.launch()
    assert loop.unroll == 4 and pos.value == 11


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the simulator's NumPy
@pytest.mark.parametrize("unroll", [1, 4])
@pytest.mark.parametrize("dtype, start, until, by, passes, end", [
    pytest.param(np.int8, 120, 127, 2, [120, 122, 124, 126], -128, id="int8-wraps"),
    pytest.param(np.float32, 2.0 ** 24, 2.0 ** 25, 1.0, [2.0 ** 24], 2.0 ** 24,
                 id="float-stuck"),
])
def test_a_counter_that_cannot_move_forward_ends_the_loop_after_that_pass(
        stream, log, unroll, dtype, start, until, by, passes, end):
    counter = ng.DeviceScalar(start, dtype, stream=stream)
    graph, _ = record(stream, counter, until,
                      lambda loop: trace[1, 1, stream](log, counter), by=by, unroll=unroll)
    graph.launch()
    assert entries(log, stream) == passes
    assert counter.value == end


# ---------------------------------------------------------------- stops on the device

def stopped_run(stream, log, pos, unroll, token, until=10, stop_first=False):
    """Launch a loop from 0 whose pass traces pos and stops at ``token``;
    the values traced and the counter afterwards."""
    def step(loop):
        if stop_first:
            stop_at[1, 1, stream](pos, token, loop.cond)
        trace[1, 1, stream](log, pos)
        if not stop_first:
            stop_at[1, 1, stream](pos, token, loop.cond)

    graph, loop = record(stream, pos, until, step, unroll=unroll)
    assert loop.unroll == unroll
    clear(log, stream)
    pos.update(0)
    graph.launch()
    return entries(log, stream), pos.value


# until=10 with unroll=4: iterations of passes 0-3, 4-7 and 8-9; a token of
# -1 never stops the loop.
@pytest.mark.parametrize("token", [*range(10), -1])
def test_a_device_stop_at_any_pass_of_an_iteration_ends_the_loop_as_unroll_1_does(
        stream, log, pos, token):
    unrolled = stopped_run(stream, log, pos, 4, token)
    one = stopped_run(stream, log, pos, 1, token)
    assert unrolled == one
    last = 9 if token < 0 else token
    assert unrolled == (list(range(last + 1)), last + 1)


@pytest.mark.parametrize("unroll", [1, 4])
def test_a_relaunch_after_a_device_stop_loops_again_from_the_new_start(
        stream, log, pos, unroll):
    def step(loop):
        trace[1, 1, stream](log, pos)
        stop_at[1, 1, stream](pos, 5, loop.cond)

    graph, _ = record(stream, pos, 10, step, unroll=unroll)
    for start, passes in ((0, [0, 1, 2, 3, 4, 5]), (6, [6, 7, 8, 9]), (3, [3, 4, 5])):
        clear(log, stream)
        pos.update(start)
        graph.launch()
        assert entries(log, stream) == passes
        assert pos.value == passes[-1] + 1


@pytest.mark.parametrize("token", [0, 1, 2, 3, 6])
def test_the_pass_that_stops_the_loop_runs_its_later_kernels(stream, log, pos, token):
    unrolled = stopped_run(stream, log, pos, 4, token, stop_first=True)
    assert unrolled == stopped_run(stream, log, pos, 1, token, stop_first=True)
    assert unrolled == (list(range(token + 1)), token + 1)


@pytest.mark.parametrize("unroll", [2, 4, 8, "auto"])
@pytest.mark.parametrize("limit, passes", [(0, 1), (5, 3), (20, 6), (1000, 12)])
def test_stop_when_above_a_value_the_passes_accumulate_stops_as_unroll_1_does(
        stream, pos, unroll, limit, passes):
    acc = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    add_position[1, 1, stream](acc, pos)

    def run(unroll):
        def step(loop):
            add_position[1, 1, stream](acc, pos)
            ng.stop_when(loop.cond, acc, above=limit)

        graph, _ = record(stream, pos, 12, step, unroll=unroll)
        clear(acc, stream)
        pos.update(0)
        graph.launch()
        return int(acc.copy_to_host(stream=stream)[0]), pos.value

    result = run(unroll)
    assert result == run(1)
    assert result == (passes * (passes + 1) // 2, passes)


@pytest.mark.parametrize("unroll", [3, 4, "auto"])
def test_stop_when_below_reads_a_device_scalar_an_increment_in_the_pass_moves(
        stream, pos, unroll):
    remaining = ng.DeviceScalar(0, np.int32, stream=stream)

    def run(unroll):
        def step(loop):
            ng.increment(remaining, by=-3)
            ng.stop_when(loop.cond, remaining, below=0)

        graph, _ = record(stream, pos, 50, step, unroll=unroll)
        remaining.update(20)
        pos.update(0)
        graph.launch()
        return remaining.value, pos.value

    result = run(unroll)
    assert result == run(1)
    assert result == (-1, 7)             # 17, 14, 11, 8, 5, 2, -1


# ---------------------------------------------------------------- limits and nesting

@pytest.mark.parametrize("unroll", [1, 3, 4])
def test_a_device_scalar_limit_is_read_at_each_launch(stream, log, pos, unroll):
    limit = ng.DeviceScalar(5, np.int32, stream=stream)
    graph, _ = record(stream, pos, limit, lambda loop: trace[1, 1, stream](log, pos),
                      unroll=unroll)
    for until in (5, 11, 0, 2, 9):
        limit.update(until)
        pos.update(0)
        clear(log, stream)
        graph.launch()
        assert entries(log, stream) == list(range(until))
        assert pos.value == until


@pytest.mark.parametrize("unroll", [1, 4])
@pytest.mark.parametrize("run", [1, 0])
def test_an_unrolled_loop_nests_inside_an_if_then(stream, log, pos, unroll, run):
    with ng.capture(stream) as cap:
        go = ng.Condition(default=run)
        with ng.if_then(go):
            loop = ng.repeat(pos, until=7, unroll=unroll)(
                lambda loop: trace[1, 1, stream](log, pos))
    assert loop.unroll == unroll
    pos.update(1)
    cap.graph.launch()
    assert entries(log, stream) == (list(range(1, 7)) if run else [])
    assert pos.value == (7 if run else 1)


@pytest.mark.parametrize("unroll", [1, 4])
def test_an_unrolled_loop_nests_inside_a_repeat(stream, log, pos, unroll):
    outer = ng.DeviceScalar(0, np.int32, stream=stream)
    with ng.capture(stream) as cap:
        with ng.repeat(outer, until=3):
            pos.update(0)
            ng.repeat(pos, until=6, unroll=unroll)(
                lambda loop: trace[1, 1, stream](log, pos))
    cap.graph.launch()
    assert entries(log, stream) == list(range(6)) * 3
    assert outer.value == 3 and pos.value == 6


@pytest.mark.parametrize("unroll", [1, 3, 4])
def test_a_kernel_of_a_pass_reads_what_an_earlier_kernel_of_that_pass_wrote(
        stream, log, pos, unroll):
    doubled = cuda.to_device(np.zeros(1, np.float64), stream=stream)
    double_into[1, 1, stream](doubled, pos)
    trace[1, 1, stream](log, doubled)

    def step(loop):
        double_into[1, 1, stream](doubled, pos)
        trace[1, 1, stream](log, doubled)

    graph, _ = record(stream, pos, 7, step, unroll=unroll)
    clear(log, stream)
    graph.launch()
    assert entries(log, stream) == [2 * v for v in range(7)]
    assert pos.value == 7


@pytest.mark.parametrize("unroll", [1, 3, 4])
def test_an_op_given_the_counter_reads_its_value_for_the_pass(stream, log, pos, unroll):
    shifted = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    ng.add_into(pos, 100, shifted, stream=stream)
    trace[1, 1, stream](log, shifted)

    def step(loop):
        ng.add_into(pos, 100, shifted, stream=stream)
        trace[1, 1, stream](log, shifted)

    graph, _ = record(stream, pos, 7, step, unroll=unroll)
    clear(log, stream)
    graph.launch()
    assert entries(log, stream) == [100 + v for v in range(7)]
    assert pos.value == 7


# ---------------------------------------------------------------- unroll="auto"

@pytest.mark.parametrize("kernels", [1, 2])
def test_auto_unrolls_a_pass_of_kernel_launches_by_auto_passes(stream, log, pos, kernels):
    def step(loop):
        for _ in range(kernels):
            trace[1, 1, stream](log, pos)

    graph, loop = record(stream, pos, 20, step, unroll="auto")
    assert loop.unroll == loops.auto_passes(kernels) > 1
    graph.launch()
    assert entries(log, stream) == [v for v in range(20) for _ in range(kernels)]
    assert pos.value == 20


EXTRAS = ["scalar-update", "device-copy", "if-block", "while-block"]


@pytest.fixture
def extra_work(stream, log, pos):
    """Work a pass may do besides kernel launches: ``extra_work(name)``,
    called inside the capture, gives (a function recording that work, a
    check of what it left after a launch); its arrays are made here."""
    other = ng.DeviceScalar(0, np.int32, stream=stream)
    source = cuda.to_device(np.arange(4, dtype=np.float32), stream=stream)
    target = cuda.to_device(np.zeros(4, np.float32), stream=stream)

    def make(extra):
        if extra == "scalar-update":
            return lambda: other.update(5), lambda: other.value == 5
        if extra == "device-copy":
            return (lambda: target.copy_to_device(source, stream=stream),
                    lambda: target.copy_to_host(stream=stream).tolist() == [0, 1, 2, 3])
        # if-block and while-block trace pos a second time, in a block of
        # their own: the while loop's kernel ends it after one pass.
        if extra == "if-block":
            go = ng.Condition(default=1)

            def nested():
                with ng.if_then(go):
                    trace[1, 1, stream](log, pos)
        else:
            more = ng.Condition()

            def nested():
                set_to[1, 1, stream](more, 1)
                with ng.while_loop(more):
                    trace[1, 1, stream](log, pos)
                    set_to[1, 1, stream](more, 0)

        return nested, lambda: True

    return make


@pytest.mark.parametrize("extra", EXTRAS)
def test_auto_records_one_pass_per_iteration_when_a_pass_does_more_than_launch_kernels(
        stream, log, pos, extra_work, extra):
    traced_twice = extra in ("if-block", "while-block")
    results = []
    for unroll in ("auto", 1):
        clear(log, stream)
        with ng.capture(stream) as cap:
            work, check = extra_work(extra)

            def step(loop):
                trace[1, 1, stream](log, pos)
                work()

            loop = ng.repeat(pos, until=6, unroll=unroll)(step)
        assert loop.unroll == 1
        pos.update(0)
        cap.graph.launch()
        assert check()
        results.append((entries(log, stream), pos.value))
    assert results[0] == results[1]
    assert results[0] == ([v for v in range(6) for _ in range(1 + traced_twice)], 6)


@pytest.mark.parametrize("outer_unroll", ["auto", 1])
def test_a_pass_holding_an_unrolled_loop_is_recorded_once_per_iteration(
        stream, log, pos, outer_unroll):
    inner = ng.DeviceScalar(0, np.int32, stream=stream)
    reset[1, 1, stream](inner)

    def step(loop):
        reset[1, 1, stream](inner)
        ng.repeat(inner, until=5, unroll=2)(lambda loop: trace[1, 1, stream](log, inner))
        trace[1, 1, stream](log, pos)

    graph, loop = record(stream, pos, 3, step, unroll=outer_unroll)
    assert loop.unroll == 1
    graph.launch()
    assert entries(log, stream) == [0, 1, 2, 3, 4, 0] + [0, 1, 2, 3, 4, 1] + [0, 1, 2, 3, 4, 2]
    assert pos.value == 3 and inner.value == 5


# ---------------------------------------------------------------- refusals

def test_a_with_block_refuses_an_unroll_above_1_and_the_capture_goes_on(stream, log, pos):
    with ng.capture(stream) as cap:
        loop = ng.repeat(pos, until=5, unroll=4)
        with pytest.raises(ng.ConditionalError, match="function"):
            with loop:
                trace[1, 1, stream](log, pos)     # never runs
        assert loop.cond is None and loop.unroll is None
        trace[1, 1, stream](log, pos)
    assert cap.graph.num_nodes == 1
    pos.update(3)
    cap.graph.launch()
    assert entries(log, stream) == [3] and pos.value == 3


@pytest.mark.parametrize("unroll", [0, 65, -1, True, False, "fast", "AUTO", 2.0, None])
def test_an_unroll_that_is_not_auto_or_1_to_64_is_refused(pos, unroll):
    with pytest.raises(ValueError, match="unroll="):
        ng.repeat(pos, until=5, unroll=unroll)


@pytest.mark.parametrize("extra", EXTRAS)
def test_an_explicit_unroll_refuses_a_pass_that_does_more_than_launch_kernels(
        stream, log, pos, extra_work, extra):
    with pytest.raises(ng.ConditionalError,
                       match=r"the pass recorded 1 node\(s\) other than kernel launches"):
        with ng.capture(stream):
            work, _ = extra_work(extra)

            def step(loop):
                trace[1, 1, stream](log, pos)
                work()

            ng.repeat(pos, until=6, unroll=4)(step)
    assert not ng.is_capturing(stream)


def test_a_later_pass_that_records_more_than_the_first_is_refused(stream, log, pos):
    other = ng.DeviceScalar(0, np.int32, stream=stream)
    calls = []

    def step(loop):
        calls.append(loop)
        trace[1, 1, stream](log, pos)
        if len(calls) == 2:
            other.update(1)

    with pytest.raises(ng.ConditionalError, match="pass 2 recorded 1 node"):
        with ng.capture(stream):
            ng.repeat(pos, until=6, unroll=4)(step)
    assert not ng.is_capturing(stream)


@pytest.mark.parametrize("unroll", [1, 4, "auto"])
def test_a_loop_given_something_not_callable_is_refused_and_the_capture_goes_on(
        stream, log, pos, unroll):
    with ng.capture(stream) as cap:
        loop = ng.repeat(pos, until=5, unroll=unroll)
        with pytest.raises(TypeError, match="function that records one pass"):
            loop(42)
        assert loop.cond is None
        trace[1, 1, stream](log, pos)
    cap.graph.launch()
    assert entries(log, stream) == [0]


@pytest.mark.parametrize("unroll, again", [
    (1, "function"), (4, "function"), ("auto", "function"), (1, "with"), ("auto", "with")])
def test_a_loop_records_once(stream, log, pos, unroll, again):
    with ng.capture(stream) as cap:
        loop = ng.repeat(pos, until=5, unroll=unroll)(
            lambda loop: trace[1, 1, stream](log, pos))
        with pytest.raises(ng.ConditionalError, match="recorded already"):
            if again == "function":
                loop(lambda loop: trace[1, 1, stream](log, pos))
            else:
                with loop:
                    pass
    cap.graph.launch()
    assert entries(log, stream) == list(range(5))


@pytest.mark.parametrize("unroll", [1, 4, "auto"])
def test_a_loop_called_outside_a_capture_is_refused(stream, pos, unroll):
    with pytest.raises(ng.ConditionalError):
        ng.repeat(pos, until=5, unroll=unroll)(lambda loop: None)


def test_a_loop_with_a_body_graph_refuses_an_unroll_above_1(stream, log, pos):
    with ng.capture(stream) as body:
        trace[1, 1, stream](log, pos)
    with ng.capture(stream) as cap:
        with pytest.raises(ng.ConditionalError, match="body="):
            ng.repeat(pos, until=5, unroll=4, body=body.graph)(lambda loop: None)
        trace[1, 1, stream](log, pos)
    clear(log, stream)
    cap.graph.launch()
    assert entries(log, stream) == [0]
