"""Soak: numbagraph under load does not leak, lose values or break.

Run ``python -m numbagraph.soak`` on a GPU for the full run, or
``python -m numbagraph.soak --quick`` anywhere (on Numba's simulator it
takes seconds). Workloads, in the order they run:

* ``cycles``        capture / instantiate / launch / close, over and over
* ``replays``       one 10-node graph replayed with DeviceScalar updates
* ``threads``       8 threads capturing and replaying on their own streams,
                    once per capture mode; then 8 threads sharing one graphed
                    function and one graph, which one of them closes
* ``refusals``      every documented kind of refused operation, in turn
* ``conditionals``  while-loop graphs made, launched, checked and closed

Every result computed on the device is checked exactly against the host's,
and each workload's device and host memory is sampled after its warm-up and
at its end; growth that goes on after the warm-up beyond
:class:`~numbagraph.soak.memory.Limits` fails it (the rule is in
:mod:`numbagraph.soak.memory`). ``--inject-leak`` adds a workload that
leaks, which must fail.
docs/reliability.md states what this proves and the figures of a run.
"""

from __future__ import annotations

from typing import Callable

from . import refusals, threads, workloads
from .core import Plan, Result

__all__ = ["WORKLOADS", "INJECTED", "Plan", "Result", "run"]

WORKLOADS: dict[str, Callable[[Plan], list[Result]]] = {
    "cycles": workloads.cycles,
    "replays": workloads.replays,
    "threads": threads.threads,
    "refusals": refusals.refusals,
    "conditionals": workloads.conditionals,
    "rebinds": workloads.rebinds,
}
"""Each workload by name: ``workload(plan)`` returns one Result, or for
``threads`` one per capture mode and one for the ``shared`` case."""


INJECTED: dict[str, Callable[[Plan], list[Result]]] = {"leak": workloads.leak}
"""Workloads that run only when asked for, to test the soak itself:
``leak`` (``--inject-leak``) keeps device memory every cycle, and must fail."""


def run(names: list[str], plan: Plan,
        done: Callable[[Result], None] = lambda result: None) -> list[Result]:
    """Run the named workloads in order; ``done(result)`` as each result is
    known. A workload that raises fails with the error, and the rest run."""
    results = []
    for name in names:
        try:
            outcome = (WORKLOADS.get(name) or INJECTED[name])(plan)
        except Exception as exc:  # noqa: BLE001  one broken workload must not hide the others
            outcome = [Result(name, 0, "", failures=[f"raised {type(exc).__name__}: {exc}"])]
        for result in outcome:
            done(result)
            results.append(result)
    return results
