"""Conditional nodes: while loops and branches decided by kernels on the GPU."""

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from conftest import records_nothing
from numbagraph import conditional


@cuda.jit
def count_while_below(counter, limit, cond):
    """counter += 1, and keep cond set while counter < limit."""
    if cuda.grid(1) == 0:
        counter[0] += 1
        ng.set_condition(cond, counter[0] < limit[0])


@cuda.jit
def set_from(cond, value):
    """cond = value[0]."""
    if cuda.grid(1) == 0:
        ng.set_condition(cond, value[0])


@cuda.jit
def log_tag(log, tag):
    """Append tag to log; log[0] counts the entries."""
    if cuda.grid(1) == 0:
        log[0] += 1
        log[log[0]] = tag


@pytest.fixture
def counter(stream):
    return cuda.to_device(np.zeros(1, np.int32), stream=stream)


@pytest.fixture
def log(stream):
    return cuda.to_device(np.zeros(16, np.int32), stream=stream)


def logged(log, stream):
    host = log.copy_to_host(stream=stream)
    stream.synchronize()
    return list(host[1 : 1 + host[0]])


def scalar(value, stream):
    return ng.DeviceScalar(value, dtype=np.int32, stream=stream)


# ---------------------------------------------------------------- while


def counting_loop(stream, counter, limit, default=1):
    """The graph of one while loop that counts ``counter`` up to ``limit``."""
    with ng.capture(stream) as cap:
        more = ng.Condition(default=default)
        with ng.while_loop(more):
            count_while_below[1, 1, stream](counter, limit, more)
    return cap.graph


def logged_loop(stream, counter, log, limit):
    """The graph of: log 1, a while loop logging 2 per pass, log 3."""
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        log_tag[1, 1, stream](log, 1)
        with ng.while_loop(more):
            log_tag[1, 1, stream](log, 2)
            count_while_below[1, 1, stream](counter, limit, more)
        log_tag[1, 1, stream](log, 3)
    return cap.graph


def test_while_loop_repeats_until_a_kernel_clears_the_condition(stream, counter):
    counting_loop(stream, counter, scalar(5, stream)).launch()
    assert counter.copy_to_host(stream=stream)[0] == 5


def test_while_loop_tests_the_condition_before_the_first_pass(stream, counter):
    counting_loop(stream, counter, scalar(5, stream), default=0).launch()
    assert counter.copy_to_host(stream=stream)[0] == 0


def test_default_is_assigned_at_every_launch(stream, counter):
    graph = counting_loop(stream, counter, scalar(3, stream))
    graph.launch()
    graph.launch()  # loops again: one more pass, then counter >= limit
    assert counter.copy_to_host(stream=stream)[0] == 4


def test_scalar_updated_between_replays_is_seen_inside_the_body(stream, counter):
    limit = scalar(2, stream)
    graph = counting_loop(stream, counter, limit)
    graph.launch()
    limit.update(6)
    graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 6


def test_work_before_and_after_a_block_keeps_its_order(stream, counter, log):
    logged_loop(stream, counter, log, scalar(3, stream)).launch()
    assert logged(log, stream) == [1, 2, 2, 2, 3]


def test_a_conditional_node_counts_as_one_node(stream, counter, log):
    assert logged_loop(stream, counter, log, scalar(3, stream)).num_nodes == 3


def test_scalar_update_inside_a_body_is_recorded_into_the_body(stream, counter):
    limit = scalar(3, stream)
    marker = scalar(0, stream)
    with ng.capture(stream) as skipped:
        more = ng.Condition(default=0)
        with ng.while_loop(more):
            marker.update(7)
            count_while_below[1, 1, stream](counter, limit, more)
    skipped.graph.launch()
    assert marker.value == 0  # the body did not run, nor did the update
    with ng.capture(stream) as taken:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            marker.update(7)
            count_while_below[1, 1, stream](counter, limit, more)
    taken.graph.launch()
    assert marker.value == 7


# ---------------------------------------------------------------- branches


@pytest.mark.parametrize("flags", [[1], [0], [1, 0, 1]])
def test_if_then_runs_when_an_upstream_kernel_sets_the_condition(stream, log, flags):
    flag = scalar(0, stream)
    with ng.capture(stream) as cap:
        taken = ng.Condition()
        set_from[1, 1, stream](taken, flag)
        with ng.if_then(taken):
            log_tag[1, 1, stream](log, 1)
        log_tag[1, 1, stream](log, 2)
    expected = []
    for f in flags:
        flag.update(f)
        cap.graph.launch()
        expected += [1, 2] if f else [2]
    assert logged(log, stream) == expected


@pytest.mark.parametrize("value, branch", [(1, 1), (7, 1), (0, 2)])
def test_if_else_runs_exactly_one_branch(stream, log, value, branch):
    flag = scalar(value, stream)
    with ng.capture(stream) as cap:
        cond = ng.Condition()
        set_from[1, 1, stream](cond, flag)
        then, orelse = ng.if_else(cond)
        with then:
            log_tag[1, 1, stream](log, 1)
        with orelse:
            log_tag[1, 1, stream](log, 2)
    cap.graph.launch()
    assert logged(log, stream) == [branch]


def test_if_else_block_left_unopened_is_empty(stream, log):
    with ng.capture(stream) as cap:
        then, orelse = ng.if_else(ng.Condition(default=0))
        with then:
            log_tag[1, 1, stream](log, 1)
        log_tag[1, 1, stream](log, 2)
    cap.graph.launch()
    assert logged(log, stream) == [2]


@pytest.mark.parametrize("value", [0, 1, 2, 3])
def test_switch_runs_the_selected_case_and_none_past_the_last(stream, log, value):
    selector = scalar(value, stream)
    with ng.capture(stream) as cap:
        cond = ng.Condition()
        set_from[1, 1, stream](cond, selector)
        for k, case in enumerate(ng.switch(cond, 3)):
            with case:
                log_tag[1, 1, stream](log, 10 + k)
    cap.graph.launch()
    assert logged(log, stream) == ([10 + value] if value < 3 else [])


# ---------------------------------------------------------------- nesting


def test_while_loop_inside_an_if(stream, counter, log):
    limit = scalar(4, stream)
    flag = scalar(1, stream)
    with ng.capture(stream) as cap:
        taken = ng.Condition()
        more = ng.Condition(default=1)
        set_from[1, 1, stream](taken, flag)
        with ng.if_then(taken):
            with ng.while_loop(more):
                count_while_below[1, 1, stream](counter, limit, more)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 4
    flag.update(0)
    limit.update(9)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 4


def test_loop_inside_a_loop(stream):
    outer_count = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    inner_count = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    outer_limit, inner_limit, one = scalar(3, stream), scalar(2, stream), scalar(1, stream)
    with ng.capture(stream) as cap:
        outer = ng.Condition(default=1)
        inner = ng.Condition()
        with ng.while_loop(outer):
            set_from[1, 1, stream](inner, one)  # each inner loop starts afresh
            with ng.while_loop(inner):
                count_while_below[1, 1, stream](inner_count, inner_limit, inner)
            count_while_below[1, 1, stream](outer_count, outer_limit, outer)
    cap.graph.launch()
    assert outer_count.copy_to_host(stream=stream)[0] == 3
    # inner_count is never reset: the first inner loop counts to 2, each later
    # one makes a single pass before its test fails.
    assert inner_count.copy_to_host(stream=stream)[0] == 4


def test_condition_made_inside_a_body_drives_a_nested_block(stream, counter):
    limit = scalar(3, stream)
    flag = scalar(1, stream)
    with ng.capture(stream) as cap:
        taken = ng.Condition()
        set_from[1, 1, stream](taken, flag)
        with ng.if_then(taken):
            more = ng.Condition(default=1)
            with ng.while_loop(more):
                count_while_below[1, 1, stream](counter, limit, more)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 3


# ---------------------------------------------------------------- misuse


def test_condition_outside_a_capture_is_refused():
    with pytest.raises(ng.ConditionalError, match="only inside `with ng.capture"):
        ng.Condition(default=1)


def test_condition_on_a_stream_not_capturing_is_refused(stream):
    with pytest.raises(ng.ConditionalError, match="is not capturing"):
        ng.Condition(stream=stream)


def test_several_captures_need_the_stream_named(stream, other_stream, counter, log):
    limit = scalar(2, stream)
    with ng.capture(stream) as cap, ng.capture(other_stream):
        log_tag[1, 1, other_stream](log, 1)
        with pytest.raises(ng.ConditionalError, match="say which one with stream="):
            ng.Condition(default=1)
        more = ng.Condition(default=1, stream=stream)
        assert more.stream is stream
        with ng.while_loop(more):
            count_while_below[1, 1, stream](counter, limit, more)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


def test_condition_passed_to_a_kernel_after_its_capture_is_refused(stream, counter):
    limit = scalar(5, stream)
    with ng.capture(stream):
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            count_while_below[1, 1, stream](counter, limit, more)
    with pytest.raises(ng.ConditionalError, match="capture .* has ended"):
        count_while_below[1, 1, stream](counter, limit, more)
    assert counter.copy_to_host(stream=stream)[0] == 0  # nothing ran


def test_condition_of_an_ended_capture_opens_no_block(stream, counter):
    limit = scalar(2, stream)
    with ng.capture(stream):
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            count_while_below[1, 1, stream](counter, limit, more)
    with ng.capture(stream) as cap:
        with pytest.raises(ng.ConditionalError, match="has ended"):
            ng.while_loop(more)
        again = ng.Condition(default=1)
        with ng.while_loop(again):
            count_while_below[1, 1, stream](counter, limit, again)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


def test_block_on_another_stream_is_refused(stream, other_stream, counter):
    limit = scalar(2, stream)
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        with pytest.raises(ng.ConditionalError, match="belongs to the capture on"):
            ng.while_loop(more, stream=other_stream)
        with ng.while_loop(more, stream=stream):
            count_while_below[1, 1, stream](counter, limit, more)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


def test_a_condition_drives_one_block(stream, counter):
    limit = scalar(2, stream)
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            count_while_below[1, 1, stream](counter, limit, more)
        with pytest.raises(ng.ConditionalError, match="already drives a block"):
            ng.if_then(more)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


def test_a_block_records_once(stream, log):
    with ng.capture(stream) as cap:
        then, orelse = ng.if_else(ng.Condition(default=1))
        with then:
            log_tag[1, 1, stream](log, 1)
        with pytest.raises(ng.ConditionalError, match="recorded already"):
            with then:
                pass
    cap.graph.launch()
    assert logged(log, stream) == [1]


def test_a_block_opens_where_its_node_was_made(stream, log):
    with ng.capture(stream) as cap:
        then, orelse = ng.if_else(ng.Condition(default=0))
        with then:
            with pytest.raises(ng.ConditionalError, match="must open where its node was made"):
                with orelse:
                    pass
        with orelse:
            log_tag[1, 1, stream](log, 2)
    cap.graph.launch()
    assert logged(log, stream) == [2]


def test_condition_made_in_an_ended_block_is_refused(stream, counter):
    limit = scalar(2, stream)
    with ng.capture(stream) as cap:
        outer = ng.Condition(default=1)
        with ng.if_then(outer):
            inner = ng.Condition(default=1)
            with ng.while_loop(inner):
                count_while_below[1, 1, stream](counter, limit, inner)
        with pytest.raises(ng.ConditionalError, match="made inside .* which has ended"):
            count_while_below[1, 1, stream](counter, limit, inner)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


def test_unused_condition_fails_the_capture(stream):
    with pytest.raises(ng.NumbagraphError, match="drive no block"):
        with ng.capture(stream):
            ng.Condition(default=1)
    assert not ng.is_capturing(stream)


def test_ending_the_capture_inside_a_block_is_refused(stream, counter):
    limit = scalar(2, stream)
    ng.begin_capture(stream)
    more = ng.Condition(default=1)
    block = ng.while_loop(more)
    block.__enter__()
    count_while_below[1, 1, stream](counter, limit, more)
    with pytest.raises(ng.NumbagraphError, match="ended inside the body of an ng.while_loop"):
        ng.end_capture(stream)
    assert not ng.is_capturing(stream)
    block.__exit__(None, None, None)  # leaving it afterwards is harmless
    with ng.capture(stream) as cap:  # and the stream captures again
        again = ng.Condition(default=1)
        with ng.while_loop(again):
            count_while_below[1, 1, stream](counter, limit, again)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


def test_while_body_that_cannot_end_the_loop_is_refused(stream, log):
    with pytest.raises(ng.ConditionalError, match="nothing can end the loop"):
        with ng.capture(stream):
            more = ng.Condition(default=1)
            with ng.while_loop(more):
                log_tag[1, 1, stream](log, 1)
    assert not ng.is_capturing(stream)


def test_while_body_that_cannot_end_the_loop_fails_end_capture(stream, log):
    ng.begin_capture(stream)
    more = ng.Condition(default=1)
    with pytest.raises(ng.ConditionalError, match="nothing can end the loop"):
        with ng.while_loop(more):
            log_tag[1, 1, stream](log, 1)
    with pytest.raises(ng.NumbagraphError, match="nothing can end the loop"):
        ng.end_capture(stream)
    assert not ng.is_capturing(stream)


def test_exception_inside_a_block_discards_the_capture(stream, counter):
    limit = scalar(2, stream)
    with pytest.raises(KeyError, match="boom"):
        with ng.capture(stream):
            more = ng.Condition(default=1)
            with ng.while_loop(more):
                count_while_below[1, 1, stream](counter, limit, more)
                raise KeyError("boom")
    assert not ng.is_capturing(stream)
    counting_loop(stream, counter, limit).launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


@pytest.mark.parametrize(
    "default, error",
    [(-1, ValueError), (2**32, ValueError), (1.5, TypeError), ("1", TypeError)],
)
def test_bad_default_is_refused(stream, default, error):
    with records_nothing(), ng.capture(stream):
        with pytest.raises(error, match="Condition"):
            ng.Condition(default=default)


@pytest.mark.parametrize("n", [0, -1, True, 1.5])
def test_switch_needs_a_whole_number_of_cases(stream, n):
    with pytest.raises(ValueError, match="cases"):
        with ng.capture(stream):
            ng.switch(ng.Condition(), n)


def test_block_needs_a_condition(stream):
    with records_nothing(), ng.capture(stream):
        with pytest.raises(TypeError, match="takes an ng.Condition"):
            ng.while_loop(1)


def test_cuda_before_12_3_refuses_conditions(stream, monkeypatch):
    monkeypatch.setattr(conditional._backend, "conditional_version", lambda: (12, 2))
    with records_nothing(), ng.capture(stream):
        with pytest.raises(ng.ConditionalError, match="needs CUDA 12.3 or newer"):
            ng.Condition(default=1)


@pytest.mark.parametrize(
    "make", [lambda c: ng.if_else(c), lambda c: ng.switch(c, 2)], ids=["if_else", "switch"]
)
def test_cuda_before_12_8_refuses_if_else_and_switch(stream, monkeypatch, counter, make):
    monkeypatch.setattr(conditional._backend, "conditional_version", lambda: (12, 7))
    limit = scalar(2, stream)
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        with pytest.raises(ng.ConditionalError, match="needs CUDA 12.8 or newer"):
            make(more)
        with ng.while_loop(more):  # while loops need 12.3 only
            count_while_below[1, 1, stream](counter, limit, more)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


@pytest.mark.parametrize("refused", ["copy_to_host", "synchronize"])
def test_refused_operation_inside_a_body_ends_the_capture_cleanly(stream, counter, refused):
    limit = scalar(2, stream)
    with pytest.raises(ng.UncapturableOperationError):
        with ng.capture(stream):
            more = ng.Condition(default=1)
            with ng.while_loop(more):
                count_while_below[1, 1, stream](counter, limit, more)
                if refused == "copy_to_host":
                    counter.copy_to_host(stream=stream)
                else:
                    stream.synchronize()
    assert not ng.is_capturing(stream)
    assert counter.copy_to_host(stream=stream)[0] == 0  # nothing ran
    counting_loop(stream, counter, limit).launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


def test_refused_operation_in_a_nested_body_ends_the_capture_cleanly(stream, counter):
    limit = scalar(2, stream)
    with pytest.raises(ng.UncapturableOperationError):
        with ng.capture(stream):
            taken = ng.Condition(default=1)
            more = ng.Condition(default=1)
            with ng.if_then(taken):
                with ng.while_loop(more):
                    count_while_below[1, 1, stream](counter, limit, more)
                    stream.synchronize()
    assert not ng.is_capturing(stream)
    counting_loop(stream, counter, limit).launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


# ---------------------------------------------------------------- restarts

@pytest.mark.parametrize("where", ["before the loop", "inside the loop"])
def test_an_event_recorded_before_a_block_boundary_is_refused_after_it(
        stream, counter, log, where):
    # A block ends the capture and begins it again; CUDA cannot wait on an
    # event of the capture before that. Refused before the driver sees it.
    limit = scalar(3, stream)
    event = cuda.event()
    with ng.capture(stream) as cap:
        log_tag[1, 1, stream](log, 1)
        more = ng.Condition(default=1)
        if where == "before the loop":
            event.record(stream)
        with ng.while_loop(more):
            if where == "inside the loop":
                event.record(stream)
            count_while_below[1, 1, stream](counter, limit, more)
        with pytest.raises(ng.ConditionalError, match="record the event again after the block"):
            event.wait(stream)
        log_tag[1, 1, stream](log, 3)
        # Recorded again after the block, it can be waited on.
        event.record(stream)
        event.wait(stream)
        log_tag[1, 1, stream](log, 4)
    cap.graph.launch()
    assert logged(log, stream) == [1, 3, 4]
    assert counter.copy_to_host(stream=stream)[0] == 3


def _stop_capturing(handle):
    """Make the stream stop capturing behind numbagraph's back, as a failed
    restart of the capture would."""
    if ng.backend() == "simulator":
        from numbagraph.backend import simulator

        simulator._recordings.pop(simulator.capture_key(handle))._stop()
        return
    from cuda.bindings import driver as cu

    err, graph = cu.cuStreamEndCapture(handle)
    assert err == cu.CUresult.CUDA_SUCCESS
    cu.cuGraphDestroy(graph)


def test_a_capture_that_cannot_resume_after_a_block_ends_and_says_so(
        stream, counter, monkeypatch):
    from numbagraph.backend import active as backend

    def failing_begin_branch(node, index):
        _stop_capturing(stream.handle)
        raise RuntimeError("the capture could not be begun again")

    limit = scalar(2, stream)
    ng.begin_capture(stream)
    more = ng.Condition(default=1)
    monkeypatch.setattr(backend.ConditionalNode, "begin_branch", failing_begin_branch)
    with pytest.raises(ng.CaptureInvalidatedError, match="could not be resumed"):
        with ng.while_loop(more):
            pass
    monkeypatch.undo()
    assert not ng.is_capturing(stream)
    with pytest.raises(ng.CaptureStateError, match="not capturing"):
        ng.end_capture(stream)
    # The stream is usable: a new capture records and replays.
    counter.copy_to_device(np.zeros(1, np.int32), stream=stream)
    counting_loop(stream, counter, limit).launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


@pytest.mark.driver_only(reason="only the driver hands out the graph a paused capture "
                                 "records into, which someone must destroy")
def test_a_capture_that_cannot_resume_destroys_the_graph_it_had(stream, counter, monkeypatch):
    from cuda.bindings import driver as cu

    from numbagraph.backend import driver_base, driver_conditional

    paused, destroyed = [], []
    pause, destroy = driver_conditional._pause, cu.cuGraphDestroy

    def recording_pause(handle):
        saved = pause(handle)
        paused.append(int(saved[0]))
        return saved

    def refused_resume(handle, mode, graph, deps):
        raise driver_base.DriverError(
            "cuStreamBeginCaptureToGraph", cu.CUresult.CUDA_ERROR_INVALID_VALUE)

    def recording_destroy(graph):
        destroyed.append(int(graph))
        return destroy(graph)

    limit = scalar(2, stream)
    ng.begin_capture(stream)
    more = ng.Condition(default=1)
    monkeypatch.setattr(driver_conditional, "_pause", recording_pause)
    monkeypatch.setattr(driver_conditional, "_resume", refused_resume)
    monkeypatch.setattr(cu, "cuGraphDestroy", recording_destroy)
    with pytest.raises(ng.CaptureInvalidatedError, match="could not be resumed"):
        with ng.while_loop(more):
            pass
    monkeypatch.undo()
    assert paused and paused[0] in destroyed
    assert not ng.is_capturing(stream)
    counter.copy_to_device(np.zeros(1, np.int32), stream=stream)
    counting_loop(stream, counter, limit).launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


@pytest.mark.parametrize("opener", [
    lambda cond: ng.while_loop(cond),
    lambda cond: ng.if_then(cond),
    lambda cond: ng.if_else(cond)[0],
    lambda cond: ng.switch(cond, 3)[0],
])
def test_a_block_on_a_condition_nothing_can_have_set_is_refused(stream, counter, opener):
    limit = scalar(2, stream)
    with ng.capture(stream) as cap:
        cond = ng.Condition()  # no default, and no kernel given it yet
        with pytest.raises(ng.ConditionalError, match="no default and that no kernel"):
            opener(cond)
        # Nothing was recorded: a kernel that sets it makes the block legal.
        set_from[1, 1, stream](cond, limit)
        with ng.while_loop(cond):
            count_while_below[1, 1, stream](counter, limit, cond)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 2


def test_a_kernel_that_sets_a_condition_compiles_before_any_capture(stream):
    @cuda.jit
    def count_to(counter, limit, cond):
        if cuda.grid(1) == 0:
            counter[0] += 1
            ng.set_condition(cond, counter[0] < limit[0])

    counter = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    limit = scalar(4, stream)
    ng.precompile(count_to, counter, limit, ng.Condition)
    compiled = dict(getattr(count_to, "overloads", {}))
    if ng.backend() != "simulator":
        assert len(compiled) == 1
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            count_to[1, 1, stream](counter, limit, more)
    # The launch in the capture found the compiled kernel.
    assert dict(getattr(count_to, "overloads", {})) == compiled
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 4


def test_precompile_names_what_it_cannot_compile():
    with pytest.raises(TypeError, match="takes a @cuda.jit kernel"):
        ng.precompile(print, 1)


@pytest.mark.driver_only(reason="the simulator compiles nothing, so it types no argument")
def test_precompile_names_an_argument_numba_cannot_pass():
    with pytest.raises(TypeError, match="argument 1 .* numba cannot pass"):
        ng.precompile(set_from, ng.Condition, object())


def test_a_condition_set_later_in_an_enclosing_loop_may_drive_a_block_inside_it(stream, log):
    # Inside a body, a kernel later in the enclosing loop sets the condition
    # for the next pass: the block is legal.
    counter = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    limit = scalar(3, stream)
    with ng.capture(stream) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            inner = ng.Condition()
            with ng.if_then(inner):
                log_tag[1, 1, stream](log, 7)
            count_while_below[1, 1, stream](counter, limit, more)
            set_from[1, 1, stream](inner, limit)
    cap.graph.launch()
    assert counter.copy_to_host(stream=stream)[0] == 3
