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
from numbagraph.soak.memory import Growth, Limits, MIB, judge_growth
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
