"""Running one peer of a suite in a Python process of its own.

The C++ floor always runs alone in its process; a suite that measures
something one framework's presence can move (the GPU time of graph replays)
gives each Python peer the same: a fresh interpreter that loads only that
peer, warms up, measures, and prints its rows as JSON.

A suite module opts in with ``measure_peer(ctx, result, peer)``, which adds
the peer's rows to ``result``, and ``run_isolated(ctx, result, module, peer)``
runs it in a child. Progress lines of the child show in the parent's output
as they come.

Example::

    for peer in PEERS:
        run_isolated(ctx, result, __name__, peer)
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .core import Config, Context, Row, SuiteResult

__all__ = ["run_isolated"]

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _config_json(config: Config) -> str:
    return json.dumps(dataclasses.asdict(config))


def _config_from(text: str) -> Config:
    fields = json.loads(text)
    return Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def run_isolated(ctx: Context, result: SuiteResult, module: str, peer: str) -> None:
    """Run ``module.measure_peer(ctx, result, peer)`` in a new Python process
    and add what it measured (rows, skips, failures) to ``result``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p
    )
    command = [sys.executable, "-m", __name__, module, peer, _config_json(ctx.config)]
    ctx.progress(f"{peer}: in its own process")
    payload = None
    with tempfile.TemporaryFile("w+") as stderr:
        try:
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr,
                                     text=True, env=env)
        except OSError as exc:
            ctx.fail(result, peer, exc)
            return
        for line in child.stdout:
            message = json.loads(line) if line.startswith("{") else {"progress": line.rstrip()}
            if "progress" in message:
                ctx.progress(message["progress"])
            else:
                payload = message
        child.wait()
        stderr.seek(0)
        errors = stderr.read()
    if payload is None:
        ctx.fail(result, peer, RuntimeError(
            f"its process exited with status {child.returncode} and no result: "
            f"{errors[-600:]}"))
        return
    for row in payload["rows"]:
        result.rows.append(Row(**row))
    for skipped_peer, why in payload["skipped"]:
        result.add_skip(skipped_peer, why)  # the child printed it already
    result.failures += payload["failures"]


def _child(module: str, peer: str, config_text: str) -> None:
    from .peers import warm_up

    def say(message: dict) -> None:
        print(json.dumps(message), flush=True)

    ctx = Context(_config_from(config_text), say=lambda text: say({"progress": text}))
    suite = importlib.import_module(module)
    result = SuiteResult(suite.NAME, suite.TITLE, suite.UNIT)
    try:
        ctx.begin_suite(f"{suite.NAME}, {peer}")
        warm_up(ctx)
        suite.measure_peer(ctx, result, peer)
    finally:
        ctx.close()
    say({"rows": [dataclasses.asdict(r) for r in result.rows],
         "skipped": result.skipped, "failures": result.failures})


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", message=".*Grid size .* under-utilization")
    _child(*sys.argv[1:4])
