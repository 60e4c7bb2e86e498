"""``python -m numbagraph.bench`` / ``numbagraph-bench``: run the suites,
print a table with the targets' verdicts, write JSON, Markdown and PNG plots,
and render again the figures that quote the ``results.json`` written (the
blocks :mod:`numbagraph.bench.figures` finds in ``OUT/README.md`` and in
the working folder's README.md).

Example::

    python -m numbagraph.bench --out bench-results            # everything
    python -m numbagraph.bench --quick --suites replay loop   # a fast look
    python -m numbagraph.bench --out docs/benchmarks          # the committed report
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numbagraph as ng

from . import SUITES
from .core import Config, Context, SuiteResult
from .environment import collect, describe
from .figures import files_quoting, headline, quoting_files, rewrite_quotes
from .peers import warm_up
from .report import markdown_report, recorded_gpu_run, text_report, write_json, write_plots
from .targets import evaluate

__all__ = ["main"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="numbagraph-bench",
        description="Benchmark numbagraph against eager Numba, the raw driver, "
        "PyTorch, CuPy and CUDA C++. Peers that are not installed are skipped "
        "with the reason.",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="folder for results.json, results.md and the plots "
                        "(default: ./bench-results)")
    parser.add_argument("--suites", nargs="+", metavar="SUITE",
                        help=f"suites to run (default: all): {', '.join(SUITES)}")
    parser.add_argument("--quick", action="store_true",
                        help="fewer repeats and trials: a look in about a minute")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile numbagraph's replay-loop step and capture "
                        "(writes profile.txt)")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    parser.add_argument("--force", action="store_true",
                        help="on the simulator, overwrite results in --out that came "
                        "from a GPU run")
    args = parser.parse_args(argv)
    names = []
    for item in args.suites or list(SUITES):
        names += [n for n in item.split(",") if n]
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        parser.error(f"unknown suite {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    args.suites = list(dict.fromkeys(names))
    if not args.list and not args.force:
        _refuse_to_replace_gpu_results(parser, args)
    return args


def _refuse_to_replace_gpu_results(parser: argparse.ArgumentParser,
                                   args: argparse.Namespace) -> None:
    """A simulator run must not overwrite a GPU run's figures: they are the
    committed benchmark report, and the simulator's measure Python."""
    gpu = recorded_gpu_run(args.out / "results.json")
    if ng.backend() != "simulator" or gpu is None:
        return
    written = ["results.json", "results.md", "profile.txt",
               *(f"{name}.png" for name in args.suites)]
    found = [name for name in written if (args.out / name).exists()]
    try:
        quoting = files_quoting(args.out / "results.json", quoting_files(args.out))
    except ValueError:
        quoting = []
    quoted = (f", and the figures {' and '.join(map(str, quoting))} quote from them"
              if quoting else "")
    parser.error(
        f"{args.out} holds results of a GPU run ({gpu}): {', '.join(found)}{quoted}. "
        "This run is on Numba's CUDA simulator and would overwrite them with timings "
        "of Python. Write elsewhere with --out DIR, or pass --force to overwrite them."
    )


def _run_suite(ctx: Context, name: str) -> SuiteResult:
    module = SUITES[name]
    start = time.perf_counter()
    try:
        result = module.run(ctx)
    except Exception as exc:  # one broken suite must not lose the others' numbers
        import traceback

        result = SuiteResult(name, module.TITLE, module.UNIT,
                             error=f"{type(exc).__name__}: {exc}",
                             failures=[traceback.format_exc()])
        ctx.progress(f"suite failed: {result.error}")
    result.seconds = time.perf_counter() - start
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; exit status 1 if a suite or a present peer failed."""
    args = _parse(argv)
    if args.list:
        for name, module in SUITES.items():
            print(f"{name:10} {module.TITLE}")
        return 0
    # Numba warns once per call site about tiny grids; the tiny kernel's grid
    # is small on purpose. Ignoring costs the same per launch as the default.
    warnings.filterwarnings("ignore", message=".*Grid size .* under-utilization")
    config = Config.for_run(args.quick)
    ctx = Context(config)
    env = collect()
    env_line = describe(env)
    ctx.progress(env_line)
    if config.simulated:
        ctx.progress("on Numba's CUDA simulator: tiny sizes, timings measure Python, "
                     "not a GPU")
    results = []
    figures_failed: str | None = None
    try:
        warm_up(ctx)
        for i, name in enumerate(args.suites, 1):
            ctx.begin_suite(f"{i}/{len(args.suites)} {name}")
            results.append(_run_suite(ctx, name))
        ctx.begin_suite("report")
        unjudged = "simulator timings measure Python" if config.simulated else None
        targets = evaluate({r.name: r for r in results}, unjudged=unjudged)
        out = args.out
        out.mkdir(parents=True, exist_ok=True)
        plots, why_no_plots = write_plots(out, results)
        if why_no_plots:
            ctx.progress(why_no_plots)
        write_json(out / "results.json", results, targets, env, config)
        # The figures are rendered from the file as written, as a reader of
        # it renders them again.
        doc = json.loads((out / "results.json").read_text())
        (out / "results.md").write_text(
            markdown_report(results, targets, env_line, plots, headline(doc)))
        print(text_report(results, targets, env_line, unjudged), flush=True)
        try:
            quoting = rewrite_quotes(out / "results.json", quoting_files(out))
        except ValueError as exc:
            quoting, figures_failed = [], f"figures not rendered again: {exc}"
            ctx.progress(figures_failed)
        if args.profile:
            ctx.begin_suite("profile")
            from .profiling import profile_hot_paths

            text = profile_hot_paths(ctx)
            (out / "profile.txt").write_text(text)
            print("\n" + text)
        ctx.progress(f"wrote {out}/results.json, results.md"
                     + "".join(f", {p}" for p in plots.values())
                     + "".join(f"; the figures in {p}" for p in quoting))
    finally:
        ctx.close()
    failed = [r.name for r in results
              if r.error or any(why.startswith("failed") for _, why in r.skipped)]
    if failed:
        print(f"failures in: {', '.join(failed)} (tracebacks in results.json)",
              file=sys.stderr)
        return 1
    if figures_failed:
        print(figures_failed, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
