"""One rank of the ``dist`` suite, in a process of its own.

``python -m numbagraph.bench._dist_worker PEER CONFIG ROWS_FILE``, started
by :func:`~numbagraph.bench.collectives.run_ranks` once per GPU with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` set as torchrun sets them. Every rank measures ``PEER``
(numbagraph's collectives or PyTorch's) in step with the others; rank 0
prints its progress as JSON lines and writes its rows, skips and failures
to ``ROWS_FILE``. The exit status is 0 once the rank's work is done,
whatever it measured; a rank that raises exits with another.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numbagraph as ng

from . import collectives, isolation
from .core import Context, SuiteResult
from .peers import warm_up

__all__ = ["main"]


def main(peer: str, config_text: str, rows_file: str) -> None:
    if peer not in (collectives.PEER, collectives.TORCH):
        raise SystemExit(f"unknown peer {peer!r}: {collectives.PEER!r} or "
                         f"{collectives.TORCH!r}")
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))

    def say(text: str) -> None:
        if rank == 0:
            print(json.dumps({"progress": f"rank 0/{size}: {text}"}), flush=True)

    ctx = Context(isolation._config_from(config_text), say=say)
    result = SuiteResult(collectives.NAME, collectives.TITLE, collectives.UNIT)
    try:
        with ctx.recording_errors(result, peer):
            if peer == collectives.PEER:
                try:
                    comm = ng.dist.init()   # before any CUDA work: it selects the device
                except ng.DistError as exc:
                    ctx.skip(result, peer, str(exc))
                else:
                    try:
                        warm_up(ctx)
                        collectives.measure_numbagraph(ctx, result, comm)
                    finally:
                        comm.close()
            else:
                collectives.measure_torch(ctx, result, rank, size, local)
    finally:
        ctx.close()
    if rank == 0:
        Path(rows_file).write_text(json.dumps(collectives._payload(result)))


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", message=".*Grid size .* under-utilization")
    main(*sys.argv[1:4])
