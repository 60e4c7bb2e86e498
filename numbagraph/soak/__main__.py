"""``python -m numbagraph.soak``: run the workloads, print one line each,
write JSON if asked, and exit 1 if any failed.

Example::

    python -m numbagraph.soak                         # full on a GPU, quick on the simulator
    python -m numbagraph.soak --quick                 # seconds, on the simulator too
    python -m numbagraph.soak --full --json soak.json # the full counts, wherever it runs
    python -m numbagraph.soak --only cycles,replays --json soak.json
    python -m numbagraph.soak --quick --inject-leak   # tests the soak: its leak must FAIL
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

import numbagraph as ng  # noqa: I001  (picks the backend before numba.cuda loads)

from numba import cuda

from . import INJECTED, WORKLOADS, run
from .core import Plan, Result, describe_bytes
from .memory import MIB, WARMUP_FRACTION, summary

__all__ = ["main", "result_line", "runs_quick", "HEADER"]


def runs_quick(quick: bool, full: bool, backend: str) -> bool:
    """Whether the soak runs its quick counts: as asked (``--quick``,
    ``--full``), else on the simulator, whose full counts take hours."""
    if quick or full:
        return quick
    return backend == "simulator"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m numbagraph.soak",
        description="Soak numbagraph: capture cycles, long replay loops, threads in "
        "every capture mode, refused operations and conditional graphs, each "
        "checked exactly and watched for memory growth.",
    )
    counts = parser.add_mutually_exclusive_group()
    counts.add_argument("--quick", action="store_true",
                        help="small counts and one-thread launches: seconds on the "
                        "simulator (for CI); the default on the simulator")
    counts.add_argument("--full", action="store_true",
                        help="the full counts, meant for a GPU; the default on a GPU "
                        "(on the simulator they take hours)")
    parser.add_argument("--only", action="append", metavar="NAMES",
                        help=f"comma-separated workloads to run (default: all): "
                        f"{', '.join(WORKLOADS)}")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the results, the plan and the backend as JSON")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--inject-leak", action="store_true",
                        help="for testing the soak: also run 'leak', which keeps a device "
                        "array every cycle; it must FAIL (exit status 1)")
    args = parser.parse_args(argv)
    names = []
    for item in args.only or [",".join(WORKLOADS)]:
        names += [n.strip() for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload {', '.join(unknown)}; "
                     f"choose from {', '.join(WORKLOADS)}")
    if args.inject_leak:
        names += list(INJECTED)
    args.names = list(dict.fromkeys(names))
    return args


def _device_name() -> str:
    device = cuda.get_current_device()
    name = getattr(device, "name", None) or type(device).__name__
    return name.decode() if isinstance(name, bytes) else str(name)


def _per_unit(amount: int | None, result: Result) -> str:
    growth = result.growth
    per = growth.per_unit(amount) if growth else None
    if per is None:
        return describe_bytes(amount)
    unit = result.unit.rstrip("s") or "unit"
    return f"{describe_bytes(amount)} ({per:.1f} B/{unit})"


def _short(failure: str, limit: int = 240) -> str:
    """A failure as the report prints it; the JSON keeps it whole."""
    return failure if len(failure) <= limit else failure[:limit - 3] + "..."


HEADER = (f"{'workload':<20} {'count':>8} {'unit':<9} {'seconds':>7}  "
          f"{'device growth':<26} {'host growth':<28} {'objects':>7}  result")


def result_line(result: Result) -> str:
    """One line of the report, under :data:`HEADER`: name, count, seconds,
    growth (and growth per unit of work), the verdict and why."""
    growth = result.growth
    device = _per_unit(growth.device, result) if growth else "n/a"
    host = _per_unit(growth.host, result) if growth else "n/a"
    objects = f"{growth.objects:+d}" if growth else "n/a"
    verdict = "PASS" if result.passed else "FAIL"
    why = "; ".join(_short(f) for f in result.failures) if result.failures else result.note
    if result.trends:
        why += ("; " if why else "") + summary(list(result.trends.values()))
    return (f"{result.name:<20} {result.count:>8} {result.unit:<9} {result.seconds:>7.1f}  "
            f"{device:<26} {host:<28} {objects:>7}  {verdict}  {why}").rstrip()


def main(argv: list[str] | None = None) -> int:
    """Run the soak; exit status 1 if any workload failed."""
    args = _parse(argv)
    if args.list:
        for name, workload in WORKLOADS.items():
            print(f"{name:14} {(workload.__doc__ or '').strip().splitlines()[0]}")
        for name in INJECTED:
            print(f"{name:14} (only with --inject-leak) a leak, to test the soak: must fail")
        return 0
    # Numba warns once per call site about one-block grids; they are small on purpose.
    warnings.filterwarnings("ignore", message=".*Grid size .* under-utilization")
    plan = Plan.for_run(runs_quick(args.quick, args.full, ng.backend()))
    run_name = "quick" if plan.quick else "full"
    chosen = "" if args.quick or args.full else " (the default here; --quick or --full to choose)"
    limits = plan.limits
    print(f"numbagraph {ng.__version__} soak, {run_name} run{chosen}, backend {ng.backend()} "
          f"({_device_name()}); judged after the first {WARMUP_FRACTION:.0%} of each run, "
          f"growth allowed (trend over the run / rise): device "
          f"{limits.device_trend / MIB:.0f} / {limits.device / MIB:.0f} MiB, host "
          f"{limits.host_trend / MIB:.0f} / {limits.host / MIB:.0f} MiB, Python objects "
          f"{limits.objects_trend} / {limits.objects}", flush=True)
    if not plan.quick and ng.backend() == "simulator":
        print("note: the full counts are meant for a GPU; on the simulator, which runs "
              "every GPU thread as a Python thread, they take hours: leave out --full",
              flush=True)
    print(HEADER, flush=True)
    start = time.perf_counter()
    results = run(args.names, plan, done=lambda r: print(result_line(r), flush=True))
    seconds = time.perf_counter() - start
    failed = [r.name for r in results if not r.passed]
    print(f"{'FAIL' if failed else 'PASS'}: {len(results) - len(failed)} of {len(results)} "
          f"workloads passed in {seconds:.1f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "backend": ng.backend(), "device": _device_name(), "run": run_name,
            "numbagraph": ng.__version__, "seconds": round(seconds, 3),
            "passed": not failed, "plan": dataclasses.asdict(plan),
            "results": [r.as_dict() for r in results],
        }, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
