"""The soak runs end to end and fails when what it checks does not hold.

Its timings are not checked: they belong in docs/reliability.md, not in a
test.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import numbagraph as ng
from numbagraph.soak import WORKLOADS, Plan, Result
from numbagraph.soak import __main__ as cli
from numbagraph.soak.core import mismatch
from numbagraph.soak.kernels import mix_reference
from numbagraph.soak import workloads
from numbagraph.soak.memory import (EACH_SECOND, Growth, Limits, MIB, Sample, assess,
                                    each_second, judge_growth, judge_series, theil_sen_slope)
from numbagraph.soak.refusals import Env, Kind, Rounds
from numbagraph.soak.threads import documented_global_refusal

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMES = ["cycles", "replays", *(f"threads/{m}" for m in ng.CAPTURE_MODES), "threads/shared",
         "refusals", "conditionals", "rebinds"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick run, as CI makes it: exit status, report, JSON."""
    out = tmp_path_factory.mktemp("soak") / "soak.json"
    done = subprocess.run([sys.executable, "-m", "numbagraph.soak", "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    return done, json.loads(out.read_text()) if out.exists() else None


def test_quick_run_exits_zero(quick_run):
    done, _ = quick_run
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", NAMES)
def test_quick_run_reports_every_workload_passed(quick_run, name):
    done, _ = quick_run
    lines = [line for line in done.stdout.splitlines() if line.split(" ", 1)[0] == name]
    assert len(lines) == 1, done.stdout
    assert "  PASS" in lines[0] and "FAIL" not in lines[0]


def test_quick_run_names_its_backend_and_writes_json(quick_run):
    done, doc = quick_run
    assert f"backend {ng.backend()}" in done.stdout.splitlines()[0]
    assert doc["passed"] and doc["backend"] == ng.backend()
    assert [r["name"] for r in doc["results"]] == NAMES


def test_global_threads_count_only_documented_refusals(quick_run):
    _, doc = quick_run
    results = {r["name"]: r for r in doc["results"]}
    for mode in ("thread_local", "relaxed"):
        assert results[f"threads/{mode}"]["details"]["refusals"] == {}
    documented = {"CaptureInvalidatedError", "SyncInCaptureError", "UncapturableOperationError"}
    refused = results["threads/global"]["details"]["refusals"]
    assert {name.split(" ")[0] for name in refused} <= documented


# ---------------------------------------------------------------- its checks fail


def _growth(device=0, host=0, objects=0):
    return Growth(device=device, host=host, objects=objects, peak_host=host, units=100, samples=10)


def test_growth_within_the_bounds_passes():
    assert judge_growth(_growth(device=2 * MIB, host=4 * MIB, objects=256), Limits()) == []
    assert judge_growth(_growth(device=None), Limits()) == []


@pytest.mark.parametrize("growth, named", [
    (_growth(device=2 * MIB + 1), "device memory grew"),
    (_growth(host=5 * MIB), "host memory grew"),
    (_growth(objects=10_000), "more Python objects"),
])
def test_growth_beyond_a_bound_fails_naming_it(growth, named):
    why = judge_growth(growth, Limits())
    assert len(why) == 1 and named in why[0]


def test_mismatch_names_the_first_wrong_element():
    assert mismatch("x", [1, 2, 3], np.array([1, 2, 3])) is None
    why = mismatch("x", [1, 2, 3], np.array([1, 5, 7]))
    assert "2 of 3 values wrong" in why and "element 1 is 5, expected 2" in why
    assert "shape" in mismatch("x", [1, 2], np.array([1]))


def test_mix_reference_matches_the_kernel_arithmetic():
    model = mix_reference(3)
    acc, prime = [0, 0], 2_147_483_647
    for pos, salt in [(0, 5), (1, 1 << 61), (2, 12345)]:
        model.replay(pos, salt)
        for _ in range(3):
            acc = [(a * 31 + pos + salt + i) % prime for i, a in enumerate(acc)]
    assert model.expected(2) == acc


def test_a_failing_workload_fails_the_run(monkeypatch, capsys):
    def broken(plan):
        return [Result("cycles", 10, "cycles", failures=["x: element 0 is 9, expected 10"])]

    monkeypatch.setitem(WORKLOADS, "cycles", broken)
    assert cli.main(["--quick", "--only", "cycles"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("cycles"))
    assert "FAIL" in line and "expected 10" in line
    assert out.splitlines()[-1].startswith("FAIL: 0 of 1")


def test_a_workload_that_raises_fails_and_the_others_run(monkeypatch, capsys):
    def raises(plan):
        raise RuntimeError("boom")

    monkeypatch.setitem(WORKLOADS, "cycles", raises)
    monkeypatch.setitem(WORKLOADS, "replays", lambda plan: [Result("replays", 1, "replays")])
    assert cli.main(["--only", "cycles,replays", "--quick"]) == 1
    out = capsys.readouterr().out
    assert "raised RuntimeError: boom" in out
    assert any(line.startswith("replays") and "PASS" in line for line in out.splitlines())


def test_an_operation_that_is_not_refused_is_a_failure():
    rounds = Rounds(Env.make(Plan.for_run(quick=True).width))
    why = rounds.refuse(Kind("harmless", ng.AllocationInCaptureError, lambda e: None))
    assert why == ["harmless was not refused", "harmless left the stream capturing"]


def test_the_wrong_error_is_a_failure():
    rounds = Rounds(Env.make(Plan.for_run(quick=True).width))

    def wrong(e):
        raise ng.HostCopyInCaptureError("not an allocation")

    why = rounds.refuse(Kind("mislabelled", ng.AllocationInCaptureError, wrong,
                             in_capture=False))
    assert why and "raised HostCopyInCaptureError" in why[0]


@pytest.mark.parametrize("error, documented", [
    (ng.CaptureInvalidatedError("invalidated by an operation refused on another thread"), True),
    (ng.UncapturableOperationError("instantiating a graph (its first launch) cannot run"), True),
    (ng.SyncInCaptureError("x.synchronize() cannot run while s captures: it blocks the host "
                           "... while any thread captures in mode 'global'"), True),
    (ng.AllocationInCaptureError("cuda.device_array() cannot run while any thread captures "
                                 "in mode 'global'"), False),
    (ng.CaptureInvalidatedError("the capture was already ended"), False),
    (RuntimeError("instantiating a graph"), False),
])
def test_only_documented_refusals_are_retried_in_global_mode(error, documented):
    assert (documented_global_refusal(error) is not None) == documented


def test_unknown_workload_is_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--only", "cycles,nope"])
    assert "unknown workload nope" in capsys.readouterr().err


# ------------------------------------------------- a plateau is not a leak

KIB = 1024
SECONDS = [float(t) for t in range(31)]   # the baseline, then a sample each second of 30 s


def _device(values, positions=SECONDS, limits=Limits()):
    return judge_series(positions, values, rise_bound=limits.device,
                        trend_bound=limits.device_trend, what="device memory", unit="s")


def _steps(*at, block=2 * MIB):
    """Device memory that rises one allocator block at each second in ``at``."""
    return [block * sum(t >= s for s in at) for t in SECONDS]


def test_theil_sen_slope_ignores_a_step_and_an_outlier():
    xs = list(range(10))
    assert theil_sen_slope(xs, [3 * x + 1 for x in xs]) == 3
    assert theil_sen_slope(xs, [0] * 9 + [10**9]) == 0
    assert theil_sen_slope(xs, [0, 0, 5, 5, 5, 5, 5, 5, 5, 5]) == 0
    assert theil_sen_slope([1, 1], [0, 5]) is None


def test_a_plateau_passes():
    trend = _device([0] * 31)
    assert trend.passed and trend.slope == 0 and trend.first == 15


def test_a_staircase_that_ends_flat_passes():
    # Pools filling as the work starts: three blocks by 14 s, flat after.
    trend = _device(_steps(3, 8, 14))
    assert trend.passed, trend.failures
    assert trend.slope == 0 and trend.rise == 0
    assert sum(trend.values) and trend.values[-1] == 6 * MIB


@pytest.mark.parametrize("at", [16, 27])
def test_one_block_after_the_warm_up_that_stays_passes(at):
    trend = _device(_steps(4, 10, at))
    assert trend.passed, trend.failures
    assert trend.slope == 0 and trend.rise == 2 * MIB


def test_a_small_steady_leak_fails():
    # 64 KiB a second: under one block in the whole run.
    trend = _device([64 * KIB * t for t in SECONDS])
    assert trend.slope == 64 * KIB and trend.projected == 64 * KIB * 30
    assert len(trend.failures) == 1
    why = trend.failures[0]
    assert why.startswith("device memory keeps growing after warm-up: +64.0 KiB/s")
    assert "samples 15-30 of 0-30 (15.0-30.0 s)" in why and "bound 1.00 MiB" in why


def test_a_leak_counted_in_allocator_blocks_fails():
    # 256 KiB a second, seen as one 2 MiB block every 8 s.
    trend = _device([2 * MIB * int(256 * KIB * t // (2 * MIB)) for t in SECONDS])
    assert not trend.passed and trend.slope > 0


def test_a_leak_that_starts_after_the_warm_up_fails():
    values = [2 * MIB if t >= 3 else 0 for t in SECONDS]           # a plateau first,
    values = [v + max(0.0, t - 12) * 64 * KIB for v, t in zip(values, SECONDS)]  # then a leak
    trend = _device(values)
    assert not trend.passed and "keeps growing" in trend.failures[0]


def test_a_jump_at_the_end_fails_by_its_rise():
    trend = _device([0] * 30 + [64 * MIB])
    assert trend.slope == 0
    assert trend.failures == ("device memory rose +64.00 MiB after warm-up, over samples "
                              "15-30 of 0-30 (15.0-30.0 s) (bound 2.00 MiB)",)


def test_noisy_flat_passes_and_noisy_leak_fails():
    rng = np.random.default_rng(7)
    noise = rng.integers(-256, 257, size=len(SECONDS)) * KIB
    limits = Limits()

    def host(values):
        return judge_series(SECONDS, values, rise_bound=limits.host,
                            trend_bound=limits.host_trend, what="host memory", unit="s")

    assert host(list(noise)).passed
    leaking = host([n + 128 * KIB * t for n, t in zip(noise, SECONDS)])
    assert [why.split(":")[0] for why in leaking.failures] == [
        "host memory keeps growing after warm-up"]


def test_streams_capturing_at_once_may_each_keep_a_block_of_the_device():
    limits = Limits()
    eight = limits.capturing_at_once(8)
    assert eight.device == 8 * limits.device == 16 * MIB
    # The trend bound, which a leak breaks, and the host's and objects' stay.
    assert eight.device_trend == limits.device_trend == MIB
    assert (eight.host, eight.host_trend, eight.objects, eight.objects_trend) == (
        limits.host, limits.host_trend, limits.objects, limits.objects_trend)
    assert limits.capturing_at_once(1) == limits == limits.capturing_at_once(0)
    # Four blocks at once, then one at a time (seen on an H200), flat after.
    assert _device(_steps(3, 3, 3, 3), limits=eight).passed
    assert _device(_steps(7, 14), limits=eight).passed
    # A leak counted in blocks still fails, by its trend.
    leak = _device([2 * MIB * int(256 * KIB * t // (2 * MIB)) for t in SECONDS], limits=eight)
    assert [why.split(":")[0] for why in leak.failures] == [
        "device memory keeps growing after warm-up"]
    # A quick run, too short for a trend, is held to the rise bound.
    quick = [0.0, 1.0, 2.0]
    assert judge_series(quick, [0, 8 * MIB, 8 * MIB], rise_bound=eight.device,
                        trend_bound=eight.device_trend).passed
    assert not judge_series(quick, [0, 8 * MIB, 8 * MIB], rise_bound=limits.device,
                            trend_bound=limits.device_trend).passed
    assert not judge_series(quick, [0, 8 * MIB, 18 * MIB], rise_bound=eight.device,
                            trend_bound=eight.device_trend).passed


def test_too_few_samples_judge_the_whole_growth():
    trend = judge_series([0, 100], [0, 3 * MIB], rise_bound=2 * MIB, trend_bound=MIB,
                         what="device memory", unit="cycle")
    assert trend.slope is None and trend.first == 0
    assert trend.failures == ("device memory grew 3.00 MiB (bound 2 MiB)",)


def test_samples_of_units_of_work_are_judged_per_unit():
    # One object kept per cycle is +1/cycle: 2 000 over the run.
    positions = [0, *range(200, 2001, 200), 2000]
    trend = judge_series(positions, [p for p in positions], rise_bound=256, trend_bound=128,
                         what="Python objects", unit="cycle")
    assert trend.first == 5 and trend.slope == 1 and trend.projected == 2000
    assert trend.failures[0].startswith("Python objects keep growing after warm-up: +1/cycle")
    assert "(cycles 1000-2000)" in trend.failures[0]


def test_assess_judges_each_quantity_of_a_gauges_samples():
    base = Sample(device=100 * MIB, host=50 * MIB, objects=1000)
    trail = [base] + [Sample(100 * MIB + (2 * MIB if i > 2 else 0), 50 * MIB + i * 64 * KIB,
                             1000 + 100 * i) for i in range(1, 11)]
    growth = Growth(device=2 * MIB, host=640 * KIB, objects=1000, peak_host=640 * KIB,
                    units=1000, samples=10, positions=tuple(range(0, 1001, 100)),
                    trail=tuple(trail))
    trends = assess(growth, Limits(), "cycle")
    assert trends["device"].passed
    assert trends["host"].passed and trends["host"].slope == 64 * KIB / 100
    assert not trends["objects"].passed and trends["objects"].slope == 1


def test_a_result_judges_the_threads_per_second_device_samples():
    def judged(during, last):
        result = Result("threads/relaxed", 1000, "captures", seconds=30.0,
                        details={EACH_SECOND: during})
        result.judge(Growth(device=last, host=0, objects=0, peak_host=0, units=1000,
                            samples=1), Limits())
        return result

    plateau = judged(_steps(3, 9, 16)[1:30], 6 * MIB)
    assert plateau.passed, plateau.failures
    assert plateau.trends["device"].unit == "s" and plateau.trends["device"].first == 15
    leak = judged([64 * KIB * t for t in range(1, 30)], 30 * 64 * KIB)
    assert not leak.passed and "device memory keeps growing" in leak.failures[0]
    assert each_second([1, None], 2, 3.0) is None


# ------------------------------------------------- the soak fails a real leak


def test_an_injected_leak_fails_the_soak(tmp_path, capsys):
    out = tmp_path / "soak.json"
    assert cli.main(["--quick", "--only", "conditionals", "--inject-leak",
                     "--json", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    leak = next(line for line in lines if line.startswith("leak "))
    assert "  FAIL  " in leak and "keep growing after warm-up" in leak
    assert any(line.startswith("conditionals ") and "  PASS  " in line for line in lines)
    assert lines[-1].startswith("FAIL: 1 of 2") and lines[-1].endswith("failed: leak")
    result = next(r for r in json.loads(out.read_text())["results"] if r["name"] == "leak")
    judged = result["growth"]["judged"]
    assert {"host", "objects"} <= set(judged)
    objects = judged["objects"]
    assert objects["judged_from"] > 0 and objects["slope_per_unit"] >= 1
    assert objects["projected_over_run"] > objects["trend_bound"]


def test_the_same_cycles_without_the_leak_pass():
    plan = Plan.for_run(quick=True)
    kept, let_go = workloads.leak(plan, keep=True)[0], workloads.leak(plan, keep=False)[0]
    assert not kept.passed
    assert let_go.passed, let_go.failures
    assert let_go.count == kept.count == plan.leak_cycles


def test_without_inject_leak_the_leak_does_not_run(capsys):
    assert cli.main(["--quick", "--only", "conditionals"]) == 0
    assert not any(line.startswith("leak") for line in capsys.readouterr().out.splitlines())


# ------------------------------------------------- quick or full


@pytest.mark.parametrize("quick, full, backend, runs_quick", [
    (False, False, "simulator", True),
    (False, False, "driver", False),
    (False, True, "simulator", False),
    (True, False, "driver", True),
])
def test_quick_counts_unless_full_ones_are_asked_for_or_a_gpu_runs(quick, full, backend,
                                                                  runs_quick):
    assert cli.runs_quick(quick, full, backend) is runs_quick


def test_the_default_run_says_which_counts_it_chose(capsys):
    assert cli.main(["--only", "conditionals"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    expected = "quick" if ng.backend() == "simulator" else "full"
    assert f"soak, {expected} run (the default here" in first


def test_quick_and_full_together_are_refused(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--quick", "--full"])
    assert "not allowed with" in capsys.readouterr().err
