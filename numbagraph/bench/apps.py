"""Suite ``apps``: the examples that time themselves, run as they are.

Each example in ``examples/`` of a source checkout runs in its own Python
process (so it picks its own sizes and backend) and prints its eager and
graph timings; every time it prints (``label: 12.3 ms``, ``(4.5 us per
token)``) and every speed-up (``3.2x``) becomes a row. Its full output goes
into the JSON.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numbagraph

from .core import Context, PeerMissing, Row, SuiteResult

__all__ = ["NAME", "TITLE", "run", "EXAMPLES", "parse_timings"]

NAME = "apps"
TITLE = "Applications: the examples' own eager vs graph timings"
UNIT = ""
EXAMPLES = ("replay_loop.py", "decode_loop.py", "jacobi_converge.py", "rk4_pingpong.py",
            "heat_to_t_end.py")

_LABEL = re.compile(r"^\s*(?P<label>[A-Za-z][^:=]*?)\s*[:=]")
_TIME = re.compile(r"(?P<value>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(?P<unit>ms|us|µs|s)\b"
                   r"(?:\s*(?:/|\bper\s)\s*(?P<per>[A-Za-z]+))?")
_SPEEDUP = re.compile(r"(?P<value>\d+(?:\.\d+)?)\s*[x×]\b")


def examples_dir() -> Path:
    """``examples/`` beside the numbagraph package of a source checkout."""
    return Path(numbagraph.__file__).resolve().parent.parent / "examples"


def parse_timings(text: str) -> list[tuple[str, float, str]]:
    """``(label, value, unit)`` for every timing and speed-up printed.

    >>> parse_timings("  eager :  12.5 ms  ( 1.25 us per kernel)")
    [('eager', 12.5, 'ms'), ('eager per kernel', 1.25, 'us')]
    >>> parse_timings("to solution: host loop 3 ms, graph 1 ms (3.0x faster)")
    [('to solution host loop', 3.0, 'ms'), ('to solution graph', 1.0, 'ms'), \
('to solution speed-up', 3.0, 'x')]
    """
    found = []
    for line in text.splitlines():
        label_match = _LABEL.match(line)
        label = label_match.group("label").strip() if label_match else ""
        if label:
            rest, pos = line[label_match.end():], 0
            for m in _TIME.finditer(rest):
                # Words between two timings name the second ("host 3 ms, graph
                # 1 ms"), unless the second is a parenthesised aside of the first.
                between = rest[pos:m.start()]
                words = between.strip(" \t,;:()")
                pos = m.end()
                named = "(" not in between and re.search("[A-Za-z]", words)
                name = f"{label} {words}" if named else label
                if m.group("per"):
                    name += f" per {m.group('per')}"
                unit = "us" if m.group("unit") == "µs" else m.group("unit")
                found.append((name, float(m.group("value")), unit))
        lowered = line.lower()
        if "speed" in lowered or "faster" in lowered:
            base = label if "speed" in label.lower() else f"{label} speed-up".strip()
            for m in _SPEEDUP.finditer(line):
                # "3.1x over the eager loop, 1.2x over ..." names each ratio.
                after = re.split(r"[,;()]", line[m.end():], maxsplit=1)[0].strip()
                name = f"{base} {after}" if after.startswith(("over", "vs")) else base
                found.append((name, float(m.group("value")), "x"))
    return found


def _run_example(ctx: Context, result: SuiteResult, name: str):
    path = examples_dir() / name
    if not path.is_file():
        raise PeerMissing(f"examples/{name} not found (it runs from a source checkout)")
    env = dict(os.environ)
    root = str(path.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    ctx.progress(f"running examples/{name}")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                              timeout=ctx.config.app_timeout, cwd=root, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"did not finish within {ctx.config.app_timeout:.0f} s") from None
    seconds = time.perf_counter() - t0
    result.notes.append(f"examples/{name} (exit {proc.returncode}, {seconds:.1f} s):\n"
                        + proc.stdout[-3000:])
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
    example = name.removesuffix(".py")
    for label, value, unit in parse_timings(proc.stdout):
        yield Row(example, label, value, unit, [value], "example")


def run(ctx: Context) -> SuiteResult:
    """Run every example present and record the timings it prints."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for name in EXAMPLES:
        ctx.attempt(result, f"examples/{name}",
                    lambda name=name: _run_example(ctx, result, name))
    return result
