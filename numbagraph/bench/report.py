"""Turning results into a table, Markdown, JSON and PNG plots."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .core import SuiteResult

__all__ = ["pivot", "text_report", "markdown_report", "write_json", "write_plots",
           "format_value", "recorded_gpu_run"]


def format_value(value: float, unit: str = "") -> str:
    """A number with the digits a benchmark table needs."""
    if value != value:  # NaN
        text = "nan"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    elif abs(value) >= 1:
        text = f"{value:.2f}"
    elif abs(value) >= 0.01 or value == 0:
        text = f"{value:.3f}"
    else:
        text = f"{value:.2e}"
    return f"{text} {unit}".rstrip()


def pivot(result: SuiteResult) -> tuple[list[str], list[list[str]]]:
    """Header and cells: one line per case, one column per peer; or, for a
    suite of mixed units, one line per number."""
    if not result.unit:
        return ["case", "measurement", "value"], [
            [row.case, row.peer, format_value(row.value, row.unit)] for row in result.rows
        ]
    cases, peers = [], []
    for row in result.rows:
        if row.case not in cases:
            cases.append(row.case)
        if row.peer not in peers:
            peers.append(row.peer)
    cells = []
    for case in cases:
        line = [case]
        for peer in peers:
            row = result.find(case, peer)
            if row is None:
                line.append("")
            else:
                line.append(format_value(row.value))
        cells.append(line)
    return ["case", *peers], cells


def _heading(result: SuiteResult) -> str:
    better = "higher" if result.higher_is_better else "lower"
    unit = f"{result.unit}, {better} is better" if result.unit else "as printed"
    return f"{result.name}: {result.title} ({unit}; {result.seconds:.1f} s)"


def _text_table(header: list[str], cells: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]
    numeric = [all(not r[i] or r[i][0] in "0123456789-n" for r in cells)
               for i in range(len(header))]

    def fmt(r):
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(r, widths, numeric))
    return [fmt(header), "  ".join("-" * w for w in widths), *map(fmt, cells)]


def _verdict_line(t: dict[str, Any]) -> str:
    if "ratio" not in t:
        return f"  n/a   {t['target']}: {t['why']}"
    sign = ">=" if t["at_least"] else "<="
    why = f"; {t['why']}" if t.get("why") else ""
    return (f"  {t['verdict']:<5} {t['target']}: {format_value(t['value'])} vs "
            f"{format_value(t['ref'])} {t['unit']} = {t['ratio']:.3f}x "
            f"(needs {sign} {t['limit']:.3g}{why})")


def _target_lines(targets: list[dict[str, Any]], unjudged: str | None) -> list[str]:
    """A line per verdict of PASS or MISS; the n/a targets counted, in one
    line for a run whose numbers judge nothing (``unjudged`` says why), or a
    line per reason (a reason of one target names it)."""
    lines = [_verdict_line(t) for t in targets if t["verdict"] != "n/a"]
    unknown = [t for t in targets if t["verdict"] == "n/a"]
    if unjudged and unknown:
        return lines + [f"  n/a   {_targets(len(unknown))} not judged: {unjudged} "
                        "(each target in results.md)"]
    by_reason: dict[str, list[dict[str, Any]]] = {}
    for t in unknown:
        by_reason.setdefault(t["why"], []).append(t)
    for why, group in by_reason.items():
        if len(group) == 1:
            lines.append(_verdict_line(group[0]))
        else:
            lines.append(f"  n/a   {_targets(len(group))}: {why} (named in results.md)")
    return lines


def _targets(count: int) -> str:
    return f"{count} target" + ("" if count == 1 else "s")


def text_report(results: list[SuiteResult], targets: list[dict[str, Any]],
                env_line: str, unjudged: str | None = None) -> str:
    """The table printed at the end of a run. With ``unjudged`` (why the run's
    numbers judge no target, as on the simulator) the targets are one line."""
    lines = [env_line, ""]
    for result in results:
        lines.append("== " + _heading(result))
        if result.error:
            lines.append(f"  suite failed: {result.error}")
        if result.rows:
            header, cells = pivot(result)
            lines += ["  " + line for line in _text_table(header, cells)]
        for peer, why in result.skipped:
            lines.append(f"  skipped {peer}: {why}")
        lines.append("")
    if targets:
        lines.append("== targets")
        lines += _target_lines(targets, unjudged)
    return "\n".join(lines)


def markdown_report(results: list[SuiteResult], targets: list[dict[str, Any]],
                    env_line: str, plots: dict[str, str], headline: str | None = None) -> str:
    """The same report as Markdown, with the plots linked in; ``headline``
    (the run's headline figures, as Markdown) first."""
    lines = [f"Measured on: {env_line}", ""]
    if headline:
        lines += ["### Headline figures", "", headline, ""]
    for result in results:
        lines += [f"### {_heading(result)}", ""]
        if result.error:
            lines += [f"Suite failed: `{result.error}`", ""]
        if result.rows:
            header, cells = pivot(result)
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
            lines += ["| " + " | ".join(c) + " |" for c in cells]
            lines.append("")
        lines += [f"- skipped {peer}: {why}" for peer, why in result.skipped]
        lines += [f"- {note}" for note in result.notes if "\n" not in note]
        if result.name in plots:
            lines += ["", f"![{result.title}]({plots[result.name]})"]
        lines.append("")
    if targets:
        lines += ["### Targets", "", "| verdict | target | numbagraph | reference | ratio |",
                  "|---|---|---:|---:|---:|"]
        for t in targets:
            if "ratio" not in t:
                lines.append(f"| n/a | {t['target']} | | | {t['why']} |")
            else:
                lines.append(f"| {t['verdict']} | {t['target']} | {format_value(t['value'])} "
                             f"| {format_value(t['ref'])} {t['unit']} | {t['ratio']:.3f}x |")
    return "\n".join(lines) + "\n"


def write_json(path: Path, results: list[SuiteResult], targets: list[dict[str, Any]],
               env: dict[str, Any], config: Any) -> None:
    doc = {
        "environment": env,
        "config": dataclasses.asdict(config),
        "suites": {r.name: dataclasses.asdict(r) for r in results},
        "targets": targets,
    }
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def recorded_gpu_run(path: Path) -> str | None:
    """The GPU that the results in ``path`` (a results.json) were measured on,
    or None when they came from the simulator, or there are none to read."""
    try:
        doc = json.loads(path.read_text())
        env, config = doc.get("environment") or {}, doc.get("config") or {}
    except (OSError, ValueError, AttributeError):
        return None
    backend = env.get("numbagraph_backend")
    if backend == "simulator" or (backend is None and config.get("simulated", True)):
        return None
    gpu = env.get("gpu") if isinstance(env.get("gpu"), dict) else {}
    return gpu.get("name") or "a GPU"


def write_plots(out: Path, results: list[SuiteResult]) -> tuple[dict[str, str], str | None]:
    """One PNG per suite with numbers; returns ({suite: file name}, why none)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FormatStrFormatter
    except ImportError as exc:
        return {}, f"matplotlib not installed ({exc}): no plots"
    written = {}
    for result in results:
        rows = [r for r in result.rows if r.unit == result.unit and result.unit]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(8, 4.8))
        peers = list(dict.fromkeys(r.peer for r in rows))
        if all(r.param for r in rows):
            for peer in peers:
                mine = sorted((r for r in rows if r.peer == peer), key=lambda r: r.param)
                xs = [r.param for r in mine]
                ys = [r.value for r in mine]
                err = [[r.value - min(r.trials) for r in mine],
                       [max(r.trials) - r.value for r in mine]]
                ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=peer)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
            ax.set_xlabel(max(rows, key=lambda r: r.param).case.split()[-1])
        else:
            cases = list(dict.fromkeys(r.case for r in rows))
            width = 0.8 / len(peers)
            for i, peer in enumerate(peers):
                xs, ys, err = [], [], [[], []]
                for j, case in enumerate(cases):
                    r = result.find(case, peer)
                    if r is not None:
                        xs.append(j + (i - (len(peers) - 1) / 2) * width)
                        ys.append(r.value)
                        err[0].append(r.value - min(r.trials))
                        err[1].append(max(r.trials) - r.value)
                ax.bar(xs, ys, width, yerr=err, capsize=2, label=peer)
            ax.set_xticks(range(len(cases)), cases)
            values = [r.value for r in rows if r.value > 0]
            # Bars a hundredfold apart flatten on a linear axis.
            if values and max(values) > 100 * min(values):
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            if len(cases) > 4:
                plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize="small")
        better = "higher" if result.higher_is_better else "lower"
        ax.set_ylabel(f"{result.unit} ({better} is better)")
        ax.set_title(result.title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        name = f"{result.name}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written[result.name] = name
    return written, None
