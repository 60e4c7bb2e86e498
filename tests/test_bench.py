"""The benchmark CLI runs end to end and reports what it could not measure.

Timings are not checked: under the simulator they measure Python, and on a
GPU they belong in the benchmark report, not in a test.
"""

import contextlib
import json

import numpy as np
import pytest

import numbagraph as ng
from conftest import ON_SIMULATOR
from numbagraph.bench import (SUITES, capture_cost, collectives, graphed, memory, ops, sizes,
                              streams)
from numbagraph.bench.__main__ import main
from numbagraph.bench.apps import parse_timings
from numbagraph.bench.core import Config, Context, Row, SuiteResult
from numbagraph.bench.report import text_report
from numbagraph.bench.targets import TARGETS, Target, evaluate
from numbagraph.bench.timing import Contender, measure_many

REPLAY_PEERS = ["numbagraph", "numbagraph, non-blocking stream", "cuda.core", "PyTorch",
                "CuPy", "C++", "C++, blocking stream"]


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory):
    """One quick run of the replay suite: exit status, results folder, JSON."""
    out = tmp_path_factory.mktemp("bench")
    status = main(["--quick", "--suites", "replay", "--out", str(out)])
    return status, out, json.loads((out / "results.json").read_text())


def test_quick_run_succeeds(replay_run):
    status, _, _ = replay_run
    assert status == 0


def test_writes_json_and_markdown(replay_run):
    _, out, doc = replay_run
    assert set(doc) == {"environment", "config", "suites", "targets"}
    assert "replay" in (out / "results.md").read_text()


def test_json_records_the_environment(replay_run):
    _, _, doc = replay_run
    env = doc["environment"]
    assert env["gpu"]["name"]
    assert {"numba-cuda", "numpy"} <= set(env["packages"])


def test_numbagraph_is_measured_at_every_graph_size(replay_run):
    _, _, doc = replay_run
    rows = [r for r in doc["suites"]["replay"]["rows"] if r["peer"] == "numbagraph"]
    assert [r["param"] for r in rows] == list(doc["config"]["graph_sizes"])
    assert all(r["value"] > 0 and r["trials"] for r in rows)


@pytest.mark.parametrize("peer", REPLAY_PEERS)
def test_every_peer_is_measured_or_skipped_with_a_reason(replay_run, peer):
    _, _, doc = replay_run
    suite = doc["suites"]["replay"]
    measured = any(r["peer"] == peer for r in suite["rows"])
    reasons = dict(suite["skipped"])
    assert measured or reasons.get(peer), f"{peer} neither measured nor explained"
    assert not str(reasons.get(peer, "")).startswith("failed")


def test_targets_of_the_suite_are_judged(replay_run):
    _, _, doc = replay_run
    verdicts = {t["target"]: t["verdict"] for t in doc["targets"]}
    assert set(verdicts) == {
        "replay per node at 100 nodes <= 1.05x C++",
        "replay per node at 1000 nodes <= 1.05x C++",
    }
    assert set(verdicts.values()) <= {"PASS", "MISS", "n/a"}


@pytest.mark.skipif(not ON_SIMULATOR, reason="on a GPU the suites run at benchmark size")
def test_every_suite_but_the_examples_runs(tmp_path, capsys):
    suites = [name for name in SUITES if name != "apps"]
    assert main(["--quick", "--suites", *suites, "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert set(doc["suites"]) == set(suites)
    assert all(doc["suites"][name]["error"] is None for name in suites)
    printed = capsys.readouterr()
    assert "== targets" in printed.out
    assert "[" in printed.err  # progress lines while it runs
    targets = printed.out.split("== targets\n")[1].splitlines()
    assert targets == [f"  n/a   {len(doc['targets'])} targets not judged: simulator "
                       "timings measure Python (each target in results.md)"]
    footprints = {r["case"] for r in doc["suites"]["memory"]["rows"] if "graph" in r["case"]}
    assert footprints == {memory.footprint_case(1, memory.SIMULATED_TEMPORARY),
                          memory.footprint_case(memory.GRAPHS, memory.SIMULATED_TEMPORARY)}
    assert "256 MiB" not in printed.out


@pytest.fixture(scope="module")
def graphed_run(tmp_path_factory):
    """One quick run of the graphed suite: exit status and JSON."""
    out = tmp_path_factory.mktemp("bench")
    status = main(["--quick", "--suites", "graphed", "--out", str(out)])
    return status, json.loads((out / "results.json").read_text())


def _graphed_steps(doc):
    return graphed.SIMULATED_STEPS if doc["config"]["simulated"] else graphed.STEPS


def test_graphed_run_succeeds(graphed_run):
    status, doc = graphed_run
    assert status == 0
    assert doc["suites"]["graphed"]["error"] is None


@pytest.mark.parametrize("change", [graphed.SAME, graphed.ONE, graphed.ALL, graphed.UNSEEN])
@pytest.mark.parametrize("peer", list(graphed.STEP_PEERS))
def test_graphed_step_is_measured_in_every_case_by_every_peer(graphed_run, change, peer):
    _, doc = graphed_run
    suite = doc["suites"]["graphed"]
    for nodes in _graphed_steps(doc):
        rows = [r for r in suite["rows"]
                if r["case"] == graphed.case(nodes, change) and r["peer"] == peer]
        assert len(rows) == 1 and rows[0]["value"] > 0 and rows[0]["trials"]


@pytest.mark.parametrize("nbytes", graphed.SIZES)
def test_graphed_input_sizes_are_measured_or_skipped_with_a_reason(graphed_run, nbytes):
    _, doc = graphed_run
    suite = doc["suites"]["graphed"]
    reasons = dict(suite["skipped"])
    measured = {r["peer"] for r in suite["rows"] if r["case"] == graphed.size_case(nbytes)}
    assert graphed.PEER in measured
    assert graphed.TORCH in measured or reasons.get(graphed.TORCH)
    assert not any(str(why).startswith("failed") for why in reasons.values())


def test_graphed_targets_are_judged(graphed_run):
    _, doc = graphed_run
    verdicts = {t["target"]: t["verdict"] for t in doc["targets"]}
    assert set(verdicts) == {t.name for t in TARGETS if t.suite == "graphed"}
    assert len(verdicts) == 20
    assert set(verdicts.values()) <= {"PASS", "MISS", "n/a"}


def _graphed_fit(doc):
    if doc["config"]["simulated"]:
        return graphed.SIMULATED_FIT_NODES, graphed.SIMULATED_MOVED
    return graphed.FIT_NODES, graphed.MOVED


@pytest.mark.parametrize("peer", list(graphed.SIGNATURE_PEERS))
def test_graphed_new_signature_is_measured_by_every_peer(graphed_run, peer):
    _, doc = graphed_run
    nodes = _graphed_steps(doc)[-1]
    rows = [r for r in doc["suites"]["graphed"]["rows"]
            if r["case"] == graphed.case(nodes, graphed.NEW_SIGNATURE) and r["peer"] == peer]
    assert len(rows) == 1 and rows[0]["value"] > 0 and rows[0]["unit"] == graphed.UNIT


@pytest.mark.parametrize("kind", graphed.NODE_KINDS)
def test_graphed_rebinding_is_fitted_from_the_nodes_moved(graphed_run, kind):
    _, doc = graphed_run
    rows = doc["suites"]["graphed"]["rows"]
    nodes, moved = _graphed_fit(doc)
    for k in moved:
        found = {r["peer"]: r for r in rows if r["case"] == graphed.moved_case(nodes, k, kind)}
        # The C++ floor's peers join them where it was built (never on the simulator).
        floor = {graphed.CPP, graphed.CPP_LAUNCH} if not ON_SIMULATOR else set()
        assert {graphed.PEER, graphed.PLAIN} <= set(found) <= {graphed.PEER, graphed.PLAIN} | floor
        assert all(r["unit"] == graphed.HOST_UNIT and r["clock"] == "host" and r["value"] > 0
                   for r in found.values())
    fit = {r["peer"]: r for r in rows if r["case"] == graphed.fit_case(kind)}
    assert set(fit) == {graphed.PER_NODE, graphed.FIXED}
    assert all(r["unit"] == graphed.FIT_UNIT and len(r["trials"]) == doc["config"]["trials"]
               for r in fit.values())


@pytest.mark.parametrize("peer", [graphed.BINDINGS, graphed.CPP])
def test_graphed_driver_calls_are_measured_or_skipped_with_a_reason(graphed_run, peer):
    _, doc = graphed_run
    suite = doc["suites"]["graphed"]
    reasons = dict(suite["skipped"])
    measured = {r["case"] for r in suite["rows"] if r["peer"] == peer}
    if ON_SIMULATOR:
        assert not measured and "needs the CUDA driver" in reasons[peer]
    else:
        expected = {graphed.set_case(kind) for kind in graphed.NODE_KINDS}
        if peer == graphed.CPP:
            nodes, moved = _graphed_fit(doc)
            expected |= {graphed.moved_case(nodes, k, kind)
                         for k in moved for kind in graphed.NODE_KINDS}
            expected |= {graphed.case(n, graphed.UNSEEN) for n in _graphed_steps(doc)}
        assert measured == expected or reasons.get(peer)
    assert not str(reasons.get(peer, "")).startswith("failed")


def test_rebinding_fit_is_the_line_through_the_calls_less_the_plain_launch():
    rows = {}
    nodes, moved = 100, (1, 10, 100)
    for k in moved:
        # numbagraph's call: the plain launch, 1.5 us fixed and 0.25 us per node moved.
        for peer, extra in ((graphed.PLAIN, 0.0), (graphed.PEER, 1.5 + 0.25 * k)):
            rows[graphed.moved_case(nodes, k, "kernel"), peer] = Row.of(
                graphed.moved_case(nodes, k, "kernel"), peer, [3.0 + extra, 4.0 + extra],
                graphed.HOST_UNIT, "host")
    result = SuiteResult(graphed.NAME, graphed.TITLE, graphed.UNIT)
    graphed._fit(Context(Config.for_run(True), say=lambda text: None), result, "kernel",
                 nodes, moved, rows)
    fit = {r.peer: r for r in result.rows}
    assert fit[graphed.PER_NODE].value == pytest.approx(0.25)
    assert fit[graphed.FIXED].value == pytest.approx(1.5)
    assert fit[graphed.PER_NODE].trials == pytest.approx([0.25, 0.25])


class _Floor:
    """The C++ floor's answer to ``moved``: per kind and count moved, a
    launch alone of 2.5 us, and setting and launching 2.5 + 3 + 0.5 a node."""

    def __init__(self):
        self.asked = []

    def run(self, mode, **options):
        self.asked.append((mode, options))
        kinds = [options["kind"]] if options.get("kind", "all") != "all" else graphed.NODE_KINDS
        return [line for kind in kinds for k in options["sizes"]
                for line in ({"label": f"{kind} moved", "param": k,
                              "trials": [5.5 + 0.5 * k, 5.5 + 0.5 * k]},
                             {"label": f"{kind} launch", "param": k, "trials": [2.5, 2.5]})]


def test_cpp_floor_of_moved_nodes_is_fitted_as_numbagraph_is():
    ctx = Context(Config.for_run(True), say=lambda text: None)
    floor = ctx.shared("floor", _Floor)
    result = SuiteResult(graphed.NAME, graphed.TITLE, graphed.UNIT)
    graphed._cpp_moved(ctx, result, 100, (1, 10, 100))
    (mode, options), = floor.asked
    assert mode == "moved" and options["nodes"] == 100 and tuple(options["sizes"]) == (1, 10, 100)
    assert not result.skipped
    for kind in graphed.NODE_KINDS:
        fit = {r.peer: r.value for r in result.rows if r.case == graphed.cpp_fit_case(kind)}
        assert fit == {graphed.PER_NODE: pytest.approx(0.5), graphed.FIXED: pytest.approx(3.0)}
        for k in (1, 10, 100):
            peers = {r.peer: r for r in result.rows
                     if r.case == graphed.moved_case(100, k, kind)}
            assert set(peers) == {graphed.CPP, graphed.CPP_LAUNCH}
            assert peers[graphed.CPP_LAUNCH].value == pytest.approx(2.5)
            assert all(r.unit == graphed.HOST_UNIT for r in peers.values())


def test_cpp_floor_of_new_each_call_times_the_kernel_steps_back_to_back():
    ctx = Context(Config.for_run(True), say=lambda text: None)
    floor = ctx.shared("floor", _Floor)
    result = SuiteResult(graphed.NAME, graphed.TITLE, graphed.UNIT)
    graphed._cpp_new_each_call(ctx, result, (10, 100))
    assert [(mode, o["nodes"], tuple(o["sizes"]), o["alone"], o["kind"])
            for mode, o in floor.asked] == [("moved", 10, (10,), 0, "kernel"),
                                            ("moved", 100, (100,), 0, "kernel")]
    found = {(r.case, r.peer): r.value for r in result.rows}
    assert found == {
        (graphed.case(10, graphed.UNSEEN), graphed.CPP): pytest.approx(10.5),
        (graphed.case(10, graphed.UNSEEN), graphed.CPP_LAUNCH): pytest.approx(2.5),
        (graphed.case(100, graphed.UNSEEN), graphed.CPP): pytest.approx(55.5),
        (graphed.case(100, graphed.UNSEEN), graphed.CPP_LAUNCH): pytest.approx(2.5)}


def test_rebinding_fit_is_left_out_without_a_peer_at_every_count():
    result = SuiteResult(graphed.NAME, graphed.TITLE, graphed.UNIT)
    graphed._fit(Context(Config.for_run(True), say=lambda text: None), result, "kernel",
                 100, (1, 10, 100), {})
    assert not result.rows


def test_fit_line_needs_two_distinct_x():
    assert graphed.fit_line([(1, 3.0), (3, 7.0), (2, 5.0)]) == pytest.approx((1.0, 2.0))
    with pytest.raises(ValueError):
        graphed.fit_line([(2, 1.0), (2, 3.0)])


@pytest.mark.parametrize("fixed, verdict", [(1.9, "PASS"), (-0.3, "PASS"), (2.1, "MISS")])
def test_rebinding_fixed_part_is_judged_in_microseconds(fixed, verdict):
    target = next(t for t in TARGETS if t.case == graphed.fit_case("kernel")
                  and t.peer == graphed.FIXED)
    suite = SuiteResult("graphed", "t", "us/call")
    suite.rows = [Row.of(graphed.fit_case("kernel"), graphed.FIXED, [fixed], "us", "host"),
                  Row.of(graphed.set_case("kernel"), graphed.BINDINGS, [0.4], "us/node",
                         "wall")]
    assert target.check({"graphed": suite})["verdict"] == verdict


def _stale(real):
    """``ng.graphed`` made to keep calling with the first arrays it saw."""

    def stale(fn, **options):
        f, first = real(fn, **options), []

        def call(*args):
            first[:] = first or [args]
            return f(*first[0])

        call.cache_info, call.clear = f.cache_info, f.clear
        return call

    return stale


def test_graphed_suite_fails_a_call_that_ran_on_the_old_arrays(tmp_path, monkeypatch):
    monkeypatch.setattr(ng, "graphed", _stale(ng.graphed))
    assert main(["--quick", "--suites", "graphed", "--out", str(tmp_path)]) == 1
    suite = json.loads((tmp_path / "results.json").read_text())["suites"]["graphed"]
    why = dict(suite["skipped"])[graphed.PEER]
    assert why.startswith("failed") and "other arrays than it was given" in why


@pytest.fixture(scope="module")
def sizes_run(tmp_path_factory):
    """One quick run of the sizes suite: exit status and JSON."""
    out = tmp_path_factory.mktemp("bench")
    status = main(["--quick", "--suites", "sizes", "--out", str(out)])
    return status, json.loads((out / "results.json").read_text())


def _sizes_rows(doc, case):
    return {r["peer"]: r for r in doc["suites"]["sizes"]["rows"] if r["case"] == case}


def test_sizes_run_succeeds(sizes_run):
    status, doc = sizes_run
    suite = doc["suites"]["sizes"]
    assert status == 0
    assert suite["error"] is None and not suite["failures"]
    assert not any(str(why).startswith("failed") for _, why in suite["skipped"])


@pytest.mark.parametrize("peer", list(sizes.NEW_SIZE_PEERS))
def test_sizes_new_size_is_measured_by_every_peer(sizes_run, peer):
    _, doc = sizes_run
    steps = sizes.SIMULATED_STEPS if doc["config"]["simulated"] else sizes.STEPS
    for nodes in steps:
        row = _sizes_rows(doc, sizes.case(nodes))[peer]
        assert row["value"] > 0 and row["trials"] and row["unit"] == sizes.UNIT


def test_sizes_sixteen_sizes_are_one_graph_captured_once(sizes_run):
    _, doc = sizes_run
    timed = _sizes_rows(doc, sizes.SIXTEEN)
    assert set(timed) == {sizes.UPDATE, sizes.PER_SIZE}
    for case, per_size in ((sizes.GRAPHS, 16), (sizes.CAPTURES, 16)):
        counts = {peer: r["value"] for peer, r in _sizes_rows(doc, case).items()}
        assert counts == {sizes.UPDATE: 1, sizes.PER_SIZE: per_size}


def test_sizes_particle_modes_and_the_best_of_them_are_measured(sizes_run):
    _, doc = sizes_run
    rows = _sizes_rows(doc, sizes.PARTICLES)
    assert set(rows) == {*sizes.EXAMPLE_MODES.values(), sizes.BEST}
    assert all(r["unit"] == sizes.STEP_UNIT and r["value"] > 0
               and len(r["trials"]) == doc["config"]["trials"] for r in rows.values())
    best = min((r for peer, r in rows.items() if peer not in (sizes.MAX_GRID, sizes.BEST)),
               key=lambda r: r["value"])
    assert rows[sizes.BEST]["value"] == best["value"] and best["peer"] in rows[sizes.BEST]["note"]


def test_the_particle_example_s_modes_are_read_from_what_it_prints():
    text = ("numbagraph particles on a GPU\n"
            "  (a) a graph per count:      120.5 us/step  matches NumPy (calls: 9 captured)\n"
            "  (b) one graph, max size:     20.0 us/step  matches NumPy (4096 blocks)\n"
            "  (d) grids set on the GPU, one launch:  8.25 us/step  DIFFERS from NumPy\n")
    assert sizes.parse_modes(text) == {
        sizes.PER_COUNT: (120.5, "matches NumPy (calls: 9 captured)"),
        sizes.MAX_GRID: (20.0, "matches NumPy (4096 blocks)"),
        sizes.DEVICE_GRIDS: (8.25, "DIFFERS from NumPy"),
    }


def test_sizes_suite_fails_a_particle_mode_that_differs_from_numpy(tmp_path, monkeypatch):
    real = sizes._run_example

    def differing(main):
        return real(main).replace("matches NumPy", "DIFFERS from NumPy", 1)

    monkeypatch.setattr(sizes, "_run_example", differing)
    assert main(["--quick", "--suites", "sizes", "--out", str(tmp_path)]) == 1
    suite = json.loads((tmp_path / "results.json").read_text())["suites"]["sizes"]
    why = dict(suite["skipped"])[sizes.EXAMPLE]
    assert why.startswith("failed") and "DIFFERS from NumPy" in why
    assert not _sizes_rows({"suites": {"sizes": suite}}, sizes.PARTICLES)


def test_sizes_targets_are_judged(sizes_run):
    _, doc = sizes_run
    verdicts = {t["target"]: t["verdict"] for t in doc["targets"]}
    expected = {t.name for t in TARGETS if t.suite == "sizes"}
    assert set(verdicts) == expected and len(expected) == 4
    assert set(verdicts.values()) <= {"PASS", "MISS", "n/a"}


def test_particle_rows_take_the_fastest_mode_other_than_the_max_grid():
    rows = sizes.particle_rows({sizes.MAX_GRID: [4.0, 6.0], sizes.UPDATE_MODE: [9.0, 9.0],
                                sizes.DEVICE_GRIDS: [7.0, 8.0]})
    found = {r.peer: r for r in rows}
    assert set(found) == {sizes.MAX_GRID, sizes.UPDATE_MODE, sizes.DEVICE_GRIDS, sizes.BEST}
    assert found[sizes.BEST].value == 7.5 and found[sizes.BEST].trials == [7.0, 8.0]
    assert sizes.DEVICE_GRIDS in found[sizes.BEST].note
    target = next(t for t in TARGETS if t.suite == "sizes" and t.peer == sizes.BEST)
    suite = SuiteResult("sizes", "t", sizes.UNIT)
    suite.rows = rows
    assert target.check({"sizes": suite})["verdict"] == "MISS"   # 7.5 against 5.0
    assert not any(r.peer == sizes.BEST
                   for r in sizes.particle_rows({sizes.UPDATE_MODE: [1.0]}))


@pytest.mark.parametrize("graphs, verdict", [(1, "PASS"), (2, "MISS")])
def test_sizes_more_than_one_graph_misses_its_target(graphs, verdict):
    target = next(t for t in TARGETS if t.suite == "sizes" and t.case == sizes.GRAPHS)
    suite = SuiteResult("sizes", "t", sizes.UNIT)
    suite.rows = [Row.of(sizes.GRAPHS, sizes.UPDATE, [graphs], sizes.COUNT_UNIT, "cache_info")]
    assert target.check({"sizes": suite})["verdict"] == verdict


def test_a_target_whose_reference_measured_zero_is_not_judged():
    suite = SuiteResult("sizes", "t", sizes.UNIT)
    suite.rows = [Row.of(sizes.GRAPHS, sizes.UPDATE, [0], sizes.COUNT_UNIT, "cache_info")]
    target = next(t for t in TARGETS if t.suite == "sizes" and t.case == sizes.GRAPHS)
    got = target.check({"sizes": suite})
    assert got["verdict"] == "n/a" and "measured 0" in got["why"]


def test_sizes_suite_fails_a_call_that_kept_the_old_size(tmp_path, monkeypatch):
    monkeypatch.setattr(ng, "graphed", _stale(ng.graphed))
    assert main(["--quick", "--suites", "sizes", "--out", str(tmp_path)]) == 1
    suite = json.loads((tmp_path / "results.json").read_text())["suites"]["sizes"]
    why = dict(suite["skipped"])[sizes.UPDATE]
    assert why.startswith("failed") and "at another size" in why


def test_sizes_suite_fails_a_mode_that_captures_each_size(tmp_path, monkeypatch):
    real = ng.graphed

    def capturing(fn, **options):
        options.pop("sizes", None)
        return real(fn, **options)

    monkeypatch.setattr(ng, "graphed", capturing)
    assert main(["--quick", "--suites", "sizes", "--out", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / "results.json").read_text())
    why = dict(doc["suites"]["sizes"]["skipped"])[sizes.UPDATE]
    assert why.startswith("failed") and "cache_info()" in why and "resizes" in why
    assert _sizes_rows(doc, sizes.GRAPHS)[sizes.UPDATE]["value"] == 16


@pytest.fixture(scope="module")
def ops_run(tmp_path_factory):
    """One quick run of the ops suite: exit status and JSON."""
    out = tmp_path_factory.mktemp("bench")
    status = main(["--quick", "--suites", "ops", "--out", str(out)])
    return status, json.loads((out / "results.json").read_text())


def _ops_size(doc, *dims):
    return tuple(ops.SIMULATED[d] for d in dims) if doc["config"]["simulated"] else dims


def _ops_cases(doc):
    size = lambda *dims: _ops_size(doc, *dims)  # noqa: E731
    cases = [ops.matmul_case(*size(*s), kind) for kind in (ops.FLOAT32, ops.TF32)
             for s in ops.MATMUL_SHAPES]
    cases += [ops.matmul_case(*size(*s), ops.FLOAT16) for s in ops.FLOAT16_MATMUL_SHAPES]
    cases += [ops.matvec_case(*size(*s)) for s in ops.MATVEC_SHAPES]
    cases += [ops.rows_case("softmax", *size(*s)) for s in ops.SOFTMAX_SHAPES]
    cases += [ops.rows_case(op, *size(*ops.NORM_SHAPE)) for op in ("layernorm", "rmsnorm")]
    cases += [ops.reduce_case(op, *size(ops.REDUCE_SIZE)) for op in ("max", "argmax")]
    return cases + [ops.take_case(*size(*ops.TAKE_SHAPE))]


def test_ops_run_succeeds(ops_run):
    status, doc = ops_run
    assert status == 0
    assert doc["suites"]["ops"]["error"] is None


def test_ops_every_case_is_measured_by_numbagraph(ops_run):
    _, doc = ops_run
    rows = doc["suites"]["ops"]["rows"]
    measured = {r["case"]: r for r in rows if r["peer"] == "numbagraph"}
    for case in _ops_cases(doc):
        assert case in measured, f"numbagraph not measured at {case}"
        assert measured[case]["value"] > 0 and measured[case]["trials"]
        assert measured[case]["unit"] == ops.UNIT


@pytest.mark.parametrize("peer", ["PyTorch", "CuPy"])
def test_ops_peers_are_measured_or_skipped_with_a_reason(ops_run, peer):
    _, doc = ops_run
    suite = doc["suites"]["ops"]
    reasons = dict(suite["skipped"])
    assert any(r["peer"] == peer for r in suite["rows"]) or reasons.get(peer)
    assert not any(str(why).startswith("failed") for why in reasons.values())


def test_ops_matvec_bandwidth_is_a_share_of_the_device_copy(ops_run):
    _, doc = ops_run
    rows = doc["suites"]["ops"]["rows"]
    for shape in ops.MATVEC_SHAPES:
        m, k = _ops_size(doc, *shape)
        copy = [r for r in rows if r["case"] == ops.matvec_case(m, k) and r["peer"] == ops.COPY]
        share = [r for r in rows
                 if r["case"] == ops.matvec_bandwidth_case(m, k) and r["peer"] == "numbagraph"]
        assert len(copy) == 1 and len(share) == 1
        assert share[0]["unit"] == ops.PERCENT and share[0]["value"] > 0


def test_ops_poisoned_outputs_are_on_the_device_before_a_peer_runs(monkeypatch):
    # A peer on a non-blocking stream (PyTorch's, CuPy's) does not wait for
    # the legacy stream's copy: poisoning waits for the device itself.
    log = []

    class Output:
        dtype, shape = np.dtype(np.float32), (3,)

        def copy_to_device(self, host):
            assert np.isnan(host).all()
            log.append("poison")

    monkeypatch.setattr(ops.cuda, "synchronize", lambda: log.append("synchronize"))
    ops._poison([Output(), Output()])
    assert log == ["poison", "poison", "synchronize"]


def test_ops_targets_are_judged(ops_run):
    _, doc = ops_run
    verdicts = {t["target"]: t["verdict"] for t in doc["targets"]}
    expected = {t.name for t in TARGETS if t.suite == "ops"}
    assert set(verdicts) == expected and len(expected) == 24
    assert set(verdicts.values()) <= {"PASS", "MISS", "n/a"}


def test_ops_targets_ask_for_a_time_within_reach_of_pytorch():
    found = {t.name: t for t in TARGETS if t.suite == "ops"}
    matmul = found["matmul 4096x4096x4096 tf32 >= 0.9x PyTorch's speed"]
    assert (matmul.peer, matmul.ref_peer, matmul.at_least) == ("numbagraph", "PyTorch", False)
    assert matmul.limit == pytest.approx(1 / 0.9)
    take = found["take_into a row of 32000x4096 <= 2x PyTorch's eager call"]
    assert (take.limit, take.at_least) == (2.0, False)


def test_ops_suite_fails_a_peer_whose_output_is_wrong(tmp_path, monkeypatch):
    def wrong(x, out, *, stream):
        ng.copy_into(x, out, stream=stream)     # the input, not its softmax

    monkeypatch.setattr(ng, "softmax_into", wrong)
    monkeypatch.setattr(ops, "_cases", lambda ctx: [
        lambda: ops._softmax(ctx, ops.SOFTMAX_SHAPES[0])])
    assert main(["--quick", "--suites", "ops", "--out", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / "results.json").read_text())
    why = dict(doc["suites"]["ops"]["skipped"])["numbagraph"]
    assert why.startswith("failed") and "expected" in why and "softmax" in why


@pytest.fixture(scope="module")
def streams_run(tmp_path_factory):
    """One quick run of the streams suite: exit status and JSON."""
    out = tmp_path_factory.mktemp("bench")
    status = main(["--quick", "--suites", "streams", "--out", str(out)])
    return status, out, json.loads((out / "results.json").read_text())


def test_streams_run_succeeds(streams_run):
    status, out, doc = streams_run
    assert status == 0
    assert doc["suites"]["streams"]["error"] is None
    # only the driver's C host node, which the simulator cannot record
    skipped = [streams.C_HOST] if ON_SIMULATOR else []
    assert [peer for peer, _ in doc["suites"]["streams"]["skipped"]] == skipped
    assert "streams" in (out / "results.md").read_text()


@pytest.mark.parametrize("case, peers", [
    (streams.FORK, [streams.FORKED, streams.SEQUENTIAL]),
    (streams.CHILD, [streams.AS_CHILD, streams.FLAT]),
    (streams.STEP, [streams.PLAIN, streams.HOST, streams.READBACK] if ON_SIMULATOR
     else [streams.PLAIN, streams.HOST, streams.C_HOST, streams.READBACK]),
])
def test_streams_every_case_is_measured_by_each_of_its_peers(streams_run, case, peers):
    _, _, doc = streams_run
    rows = [r for r in doc["suites"]["streams"]["rows"] if r["case"] == case]
    assert [r["peer"] for r in rows] == peers
    assert all(r["value"] > 0 and r["trials"] and r["unit"] == streams.UNIT for r in rows)


def test_streams_targets_are_judged(streams_run):
    _, _, doc = streams_run
    verdicts = {t["target"]: t for t in doc["targets"]}
    expected = {t.name for t in TARGETS if t.suite == "streams"}
    assert set(verdicts) == expected and len(expected) == 5
    skipped = dict(doc["suites"]["streams"]["skipped"])   # the C host node on the simulator
    for target in TARGETS:
        if target.suite == "streams":
            verdict = verdicts[target.name]
            assert verdict["verdict"] in {"PASS", "MISS", "n/a"}
            measured = target.peer not in skipped and target.ref_peer not in skipped
            assert ("ratio" in verdict) == measured
            assert measured or verdict["why"] == skipped[target.ref_peer]


def test_streams_suite_fails_a_fork_that_records_one_branch(tmp_path, monkeypatch):
    # Without a fork, the launch on the second stream runs at once instead
    # of being recorded: the graph holds one kernel of the two.
    monkeypatch.setattr(ng, "fork", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(streams, "run", lambda ctx: _fork_case_only(ctx))
    assert main(["--quick", "--suites", "streams", "--out", str(tmp_path)]) == 1
    suite = json.loads((tmp_path / "results.json").read_text())["suites"]["streams"]
    why = dict(suite["skipped"])[streams.FORKED]
    assert why.startswith("failed") and "forked graph" in why
    assert [r["peer"] for r in suite["rows"]] == [streams.SEQUENTIAL]


def _fork_case_only(ctx):
    result = SuiteResult(streams.NAME, streams.TITLE, streams.UNIT)
    ctx.compare(result, streams.FORK,
                {streams.FORKED: lambda: streams._fork(ctx, True),
                 streams.SEQUENTIAL: lambda: streams._fork(ctx, False)}, unit=streams.UNIT)
    return result


@pytest.fixture(scope="module")
def capture_run(tmp_path_factory):
    """One quick run of the capture suite: exit status and JSON."""
    out = tmp_path_factory.mktemp("bench")
    status = main(["--quick", "--suites", "capture", "--out", str(out)])
    return status, json.loads((out / "results.json").read_text())


def test_capture_run_succeeds(capture_run):
    status, doc = capture_run
    assert status == 0
    suite = doc["suites"]["capture"]
    assert suite["error"] is None and not suite["failures"]


def test_capture_numbagraph_update_is_measured_at_every_size(capture_run):
    _, doc = capture_run
    rows = {r["case"]: r for r in doc["suites"]["capture"]["rows"]
            if r["peer"] == "numbagraph" and r["unit"] == capture_cost.PHASE_UNIT}
    assert set(rows) == {capture_cost.phase_case(capture_cost.UPDATE_ALONE, n)
                         for n in doc["config"]["capture_sizes"]}
    assert all(r["value"] > 0 and r["trials"] for r in rows.values())


@pytest.mark.parametrize("peer", ["C++", "cuda.bindings"])
def test_capture_phases_are_measured_or_skipped_with_a_reason(capture_run, peer):
    _, doc = capture_run
    suite = doc["suites"]["capture"]
    reasons = dict(suite["skipped"])
    measured = {r["case"] for r in suite["rows"]
                if r["peer"] == peer and r["unit"] == capture_cost.PHASE_UNIT}
    expected = {capture_cost.phase_case(phase, n) for phase in capture_cost.PHASES
                for n in doc["config"]["capture_sizes"]}
    assert measured == expected or (not measured and reasons.get(peer))
    assert not str(reasons.get(peer, "")).startswith("failed")


@pytest.fixture(scope="module")
def dist_run(tmp_path_factory):
    """One quick run of the dist suite: exit status, results folder, JSON."""
    out = tmp_path_factory.mktemp("bench")
    status = main(["--quick", "--suites", "dist", "--out", str(out)])
    return status, out, json.loads((out / "results.json").read_text())


def _dist_sizes(doc):
    return collectives.SIMULATED_SIZES if doc["config"]["simulated"] else collectives.SIZES


@pytest.mark.skipif(not ON_SIMULATOR, reason="on a GPU the ranks and PyTorch depend on "
                    "the machine")
def test_dist_runs_one_rank_in_process_on_the_simulator(dist_run):
    status, out, doc = dist_run
    suite = doc["suites"]["dist"]
    assert status == 0 and suite["error"] is None and not suite["failures"]
    assert suite["unjudged"].startswith(collectives.SEVERAL)
    assert any("world size 1" in note and "copy" in note for note in suite["notes"])
    assert [peer for peer, _ in suite["skipped"]] == [collectives.TORCH]
    assert "dist" in (out / "results.md").read_text()


def test_dist_every_size_is_measured_in_a_step_and_as_bandwidth(dist_run):
    _, _, doc = dist_run
    suite = doc["suites"]["dist"]
    if not ON_SIMULATOR and collectives.PEER in dict(suite["skipped"]):
        pytest.skip(f"ng.dist cannot run here: {dict(suite['skipped'])[collectives.PEER]}")
    rows = suite["rows"]
    for nbytes in _dist_sizes(doc):
        steps = [r for r in rows if r["case"] == collectives.step_case(nbytes)]
        assert [r["peer"] for r in steps] == [collectives.IN_GRAPH, collectives.BETWEEN]
        assert all(r["unit"] == "us/step" and r["value"] > 0 and r["trials"] for r in steps)
        bandwidth = [r for r in rows if r["case"] == collectives.bandwidth_case(nbytes)
                     and r["peer"] == collectives.PEER]
        assert len(bandwidth) == 1 and bandwidth[0]["unit"] == "GB/s"
        assert bandwidth[0]["value"] > 0


@pytest.mark.skipif(not ON_SIMULATOR, reason="several GPUs judge the targets")
def test_dist_targets_are_not_judged_on_one_rank(dist_run):
    _, _, doc = dist_run
    verdicts = {t["target"]: t for t in doc["targets"]}
    expected = {t.name for t in TARGETS if t.suite == "dist"}
    assert set(verdicts) == expected and len(expected) == 4
    assert all(v["verdict"] == "n/a" and v["why"].startswith(collectives.SEVERAL)
               for v in verdicts.values())


@pytest.mark.parametrize("nbytes, ranks, expected", [
    (1 << 30, 1, 1.0737), (1 << 30, 2, 1.0737), (1 << 30, 8, 1.0737 * 1.75)])
def test_dist_bus_bandwidth_is_nccls_definition(nbytes, ranks, expected):
    assert collectives.bus_bandwidth(nbytes, 1.0, ranks) == pytest.approx(expected, rel=1e-4)


@pytest.mark.skipif(not ON_SIMULATOR, reason="spawns a rank of world size 1")
def test_dist_ranks_in_processes_of_their_own_give_rank_zeros_rows():
    ctx = Context(Config.for_run(True), say=lambda text: None)
    result = SuiteResult(collectives.NAME, collectives.TITLE, collectives.UNIT)
    collectives.run_ranks(ctx, result, collectives.PEER, 1)
    assert not result.skipped and not result.failures
    peers = {(r.case, r.peer) for r in result.rows}
    for nbytes in collectives.SIMULATED_SIZES:
        assert (collectives.step_case(nbytes), collectives.IN_GRAPH) in peers
        assert (collectives.bandwidth_case(nbytes), collectives.PEER) in peers


def test_dist_rank_that_fails_is_reported_with_its_error():
    ctx = Context(Config.for_run(True), say=lambda text: None)
    result = SuiteResult(collectives.NAME, collectives.TITLE, collectives.UNIT)
    collectives.run_ranks(ctx, result, "nobody", 1)
    why = dict(result.skipped)["nobody"]
    assert why.startswith("failed") and "rank 0 exited with status 1" in why
    assert "unknown peer 'nobody'" in why and not result.rows


@pytest.mark.skipif(not ON_SIMULATOR, reason="ranks of several GPUs run in processes the "
                    "patch does not reach")
def test_dist_suite_fails_an_all_reduce_that_never_ran(tmp_path, monkeypatch):
    monkeypatch.setattr(ng.dist, "all_reduce_into", lambda x, out, op="sum", **kw: None)
    assert main(["--quick", "--suites", "dist", "--out", str(tmp_path)]) == 1
    suite = json.loads((tmp_path / "results.json").read_text())["suites"]["dist"]
    reasons = dict(suite["skipped"])
    assert all(reasons[peer].startswith("failed") and "sum over the ranks" in reasons[peer]
               for peer in (collectives.IN_GRAPH, collectives.BETWEEN, collectives.PEER))
    assert not suite["rows"]


def test_unknown_suite_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--suites", "replay,nosuch"])
    assert exc.value.code == 2
    assert "nosuch" in capsys.readouterr().err


def test_list_names_every_suite(capsys):
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in SUITES)


def _earlier_run(out, backend):
    """A folder holding what a run on ``backend`` wrote: results.json,
    results.md and the capture suite's plot."""
    gpu = {"cuda": {"name": "NVIDIA H200"}, "simulator": {"name": "FakeCUDADevice"}}[backend]
    doc = {"environment": {"numbagraph_backend": backend, "gpu": gpu},
           "config": {"simulated": backend == "simulator"}, "suites": {}, "targets": []}
    (out / "results.json").write_text(json.dumps(doc))
    (out / "results.md").write_text("earlier tables\n")
    (out / "capture.png").write_bytes(b"earlier plot")
    return {p.name: p.read_bytes() for p in out.iterdir()}


@pytest.mark.skipif(not ON_SIMULATOR, reason="only a simulator run is refused")
def test_simulator_run_refuses_to_overwrite_a_gpu_run(tmp_path, capsys):
    before = _earlier_run(tmp_path, "cuda")
    with pytest.raises(SystemExit) as exc:
        main(["--quick", "--suites", "capture", "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "GPU run (NVIDIA H200)" in err
    assert "results.json, results.md, capture.png" in err
    assert "--force" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.skipif(not ON_SIMULATOR, reason="only a simulator run is refused")
def test_force_overwrites_a_gpu_run_from_the_simulator(tmp_path):
    _earlier_run(tmp_path, "cuda")
    assert main(["--quick", "--suites", "capture", "--out", str(tmp_path), "--force"]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["environment"]["numbagraph_backend"] == "simulator"


@pytest.mark.skipif(not ON_SIMULATOR, reason="on a GPU the suites run at benchmark size")
def test_a_simulator_run_overwrites_a_simulator_run(tmp_path):
    _earlier_run(tmp_path, "simulator")
    assert main(["--quick", "--suites", "capture", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "results.md").read_text() != "earlier tables\n"


@pytest.mark.parametrize(
    "line, expected",
    [
        ("  eager :  12.5 ms  ( 1.25 us per kernel)",
         [("eager", 12.5, "ms"), ("eager per kernel", 1.25, "us")]),
        ("  graph: 4.0 µs/token", [("graph per token", 4.0, "us")]),
        ("to solution: host loop 3 ms, graph 1 ms",
         [("to solution host loop", 3.0, "ms"), ("to solution graph", 1.0, "ms")]),
        ("  speed-up 12.3x; results match", [("speed-up", 12.3, "x")]),
        ("  200 steps x 100 kernels on 1024 float32", []),
    ],
)
def test_example_timings_are_parsed(line, expected):
    assert parse_timings(line) == expected


def _suite(rows):
    result = SuiteResult("s", "t", "us")
    result.rows = [Row.of(case, peer, [value], "us", "wall") for case, peer, value in rows]
    result.skipped = [["Peer", "Peer not installed"]]
    return result


@pytest.mark.parametrize(
    "value, at_least, verdict",
    [(1.0, False, "PASS"), (1.2, False, "MISS"), (1.2, True, "PASS"), (1.0, True, "MISS")],
)
def test_target_compares_the_ratio_with_its_limit(value, at_least, verdict):
    target = Target("t", "s", "c", "ng", "c", "ref", 1.1, at_least)
    got = target.check({"s": _suite([("c", "ng", value), ("c", "ref", 1.0)])})
    assert got["verdict"] == verdict
    assert got["ratio"] == pytest.approx(value)


@pytest.mark.parametrize("value, verdict", [(1.9, "PASS"), (2.1, "MISS")])
def test_target_slack_is_added_to_the_bound(value, verdict):
    target = Target("t", "s", "c", "ng", "c", "ref", 1.0, slack=1.0)
    got = target.check({"s": _suite([("c", "ng", value), ("c", "ref", 1.0)])})
    assert got["verdict"] == verdict
    assert got["limit"] == pytest.approx(2.0)
    assert got["ratio"] == pytest.approx(value)


def test_target_without_its_reference_says_why():
    target = Target("t", "s", "c", "ng", "c", "Peer", 1.1)
    got = target.check({"s": _suite([("c", "ng", 1.0)])})
    assert got["verdict"] == "n/a"
    assert got["why"] == "Peer not installed"


def test_contenders_take_turns_trial_by_trial():
    calls = []
    contenders = {name: Contender(lambda name=name: calls.append(name), 1, lambda: None)
                  for name in "abc"}
    timings = measure_many(contenders, trials=3, warmup=1)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert all(len(t.trials) == 3 and t.clock == "wall" for t in timings.values())


def test_a_failing_contender_is_dropped_and_the_others_measured():
    def broken():
        raise RuntimeError("boom")

    errors = []
    contenders = {
        "ok": Contender(lambda: None, 1, lambda: None),
        "broken": Contender(broken, 1, lambda: None),
    }
    timings = measure_many(contenders, trials=2,
                           on_error=lambda name, exc: errors.append((name, str(exc))))
    assert list(timings) == ["ok"]
    assert errors == [("broken", "boom")]


def test_unjudged_targets_keep_their_ratio_and_say_why():
    suite = _suite([("100 nodes", "numbagraph", 1.0), ("100 nodes", "C++", 2.0)])
    suite.name = "replay"
    verdicts = evaluate({"replay": suite}, unjudged="simulator timings measure Python")
    judged = [v for v in verdicts if "ratio" in v]
    assert judged and all(v["verdict"] == "n/a" for v in judged)
    assert judged[0]["why"] == "simulator timings measure Python"
    assert judged[0]["ratio"] == pytest.approx(0.5)


def test_printed_limits_keep_three_significant_digits():
    target = Target("t", "s", "c", "ng", "c", "ref", 1 / 3)
    printed = text_report([], [target.check({"s": _suite([("c", "ng", 1.0),
                                                            ("c", "ref", 7.0)])})], "env")
    assert "(needs <= 0.333)" in printed


def test_targets_not_judged_by_the_run_are_one_line():
    targets = [Target(f"t{i}", "s", "c", "ng", "c", "ref", 1.1) for i in range(3)]
    verdicts = [t.check({"s": _suite([("c", "ng", 1.0), ("c", "ref", 1.0)])})
                for t in targets]
    for v in verdicts:
        v.update(verdict="n/a", why="simulator timings measure Python")
    printed = text_report([], verdicts, "env", "simulator timings measure Python")
    assert printed.split("== targets\n")[1] == (
        "  n/a   3 targets not judged: simulator timings measure Python "
        "(each target in results.md)")


def test_targets_not_applicable_are_counted_by_reason_after_the_verdicts():
    rows = [("c", "ng", 1.0), ("c", "ref", 2.0)]
    verdicts = [Target("judged", "s", "c", "ng", "c", "ref", 1.1).check({"s": _suite(rows)})]
    verdicts += [Target(f"peer {i}", "s", "c", "ng", "c", "Peer", 1.1).check(
        {"s": _suite(rows)}) for i in range(2)]
    verdicts.append(Target("other", "s", "d", "ng", "c", "ref", 1.1).check({"s": _suite(rows)}))
    printed = text_report([], verdicts, "env").split("== targets\n")[1].splitlines()
    assert printed == [
        "  PASS  judged: 1.00 vs 2.00 us = 0.500x (needs <= 1.1)",
        "  n/a   2 targets: Peer not installed (named in results.md)",
        "  n/a   other: no ng result for d",
    ]


def test_the_profile_reports_every_hot_path():
    from numbagraph.bench.profiling import profile_hot_paths

    ctx = Context(Config.for_run(True), say=lambda text: None)
    try:
        text = profile_hot_paths(ctx)
    finally:
        ctx.close()
    titles = [line for line in text.splitlines() if line.startswith("== ")]
    assert len(titles) == 5
    assert "two sets of arrays in turn (" in titles[2]
    assert "turn, max_graphs=1 (" in titles[3] and "new each call" in titles[4]
    assert text.count("   ncalls") == 5
