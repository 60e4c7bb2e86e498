"""The C++ floor: ``floor.cu`` compiled with nvcc into a temporary folder
once per run, then run once per suite. It prints its timings as JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from .core import Context, PeerMissing, Row
from .peers import require_driver

__all__ = ["Floor", "floor", "PEER", "PEER_BLOCKING"]

PEER = "C++"
PEER_BLOCKING = "C++, blocking stream"


def _find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", "nvcc").is_file():
            return str(Path(root, "bin", "nvcc"))
    return None


class Floor:
    """A built floor program; ``run(mode, ...)`` returns its result lines."""

    def __init__(self, binary: Path, nvcc_version: str):
        self.binary = binary
        self.nvcc_version = nvcc_version

    def run(self, mode: str, timeout: float = 300.0, **options) -> list[dict]:
        args = [str(self.binary), mode]
        for key, value in options.items():
            if isinstance(value, (tuple, list)):
                value = ",".join(str(v) for v in value)
            args += ["--" + key.replace("_", "-"), str(value)]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        try:
            out = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise RuntimeError(
                f"the C++ floor printed no JSON (exit {proc.returncode}): "
                f"{(proc.stdout + proc.stderr)[-400:]}"
            ) from None
        if "error" in out:
            raise RuntimeError(f"the C++ floor failed: {out['error']}")
        return out["results"]

    def rows(self, mode: str, case_of, unit: str, clock: str, peer: str = PEER,
             **options) -> list[Row]:
        """Run ``mode`` and turn each result line into a Row; ``case_of(line)``
        names its case."""
        return [
            Row.of(case_of(line), peer, line["trials"], unit, clock,
                   param=line["param"] or None)
            for line in self.run(mode, **options)
        ]


def _build(ctx: Context) -> Floor:
    require_driver("the C++ floor")
    nvcc = _find_nvcc()
    if nvcc is None:
        raise PeerMissing("nvcc not found (PATH, CUDA_HOME, /usr/local/cuda): no C++ floor")
    tmp = tempfile.TemporaryDirectory(prefix="numbagraph-bench-")
    ctx.on_close(tmp.cleanup)
    src = Path(tmp.name, "floor.cu")
    src.write_text(resources.files(__package__).joinpath("floor.cu").read_text())
    binary = Path(tmp.name, "floor")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    version = version.strip().splitlines()[-1] if version.strip() else "unknown"
    ctx.progress(f"compiling the C++ floor with {nvcc}")
    errors = ""
    # -arch=native builds for the GPU present; older nvcc lacks it, and then
    # the default architecture's PTX is JIT-compiled by the driver.
    for arch in (["-arch=native"], []):
        proc = subprocess.run(
            [nvcc, "-O2", "-std=c++17", *arch, "-o", str(binary), str(src)],
            capture_output=True, text=True, timeout=300,
        )
        if proc.returncode == 0:
            return Floor(binary, version)
        errors = proc.stderr[-600:]
    raise PeerMissing(f"nvcc could not build the C++ floor: {errors}")


def floor(ctx: Context) -> Floor:
    """The C++ floor program, built on first use."""
    return ctx.shared("floor", lambda: _build(ctx))
