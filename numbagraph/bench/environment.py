"""What the numbers were measured on: GPU, driver, packages, Python."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any

from numba import cuda

import numbagraph as ng

__all__ = ["collect", "describe"]

PACKAGES = ("numbagraph", "numba", "numba-cuda", "cuda-core", "cuda-bindings", "numpy",
            "torch", "cupy-cuda13x", "cupy-cuda12x", "cupy", "matplotlib")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _run(args: list[str]) -> str | None:
    if shutil.which(args[0]) is None:
        return None
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def _gpu() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        dev = cuda.get_current_device()
        name = getattr(dev, "name", None) or type(dev).__name__
        info["name"] = name.decode() if isinstance(name, bytes) else str(name)
        cc = getattr(dev, "compute_capability", None)
        info["compute_capability"] = ".".join(str(c) for c in cc) if cc else None
    except Exception as exc:  # no device: the record says so instead of failing
        info["name"] = f"unknown ({exc})"
    try:
        from numba.cuda.cudadrv.driver import driver

        major, minor = driver.get_version()
        info["cuda_driver_api"] = f"{major}.{minor}"
    except Exception:
        info["cuda_driver_api"] = None
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                "--format=csv,noheader"])
    if smi:
        fields = [f.strip() for f in smi.splitlines()[0].split(",")]
        info.update(zip(("smi_name", "driver_version", "memory", "max_sm_clock"), fields))
    return info


def collect() -> dict[str, Any]:
    """A JSON-ready description of this machine and its packages."""
    nvcc = _run(["nvcc", "--version"])
    return {
        "numbagraph_backend": ng.backend(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "gpu": _gpu(),
        "nvcc": nvcc.splitlines()[-1] if nvcc else None,
        "packages": {p: v for p in PACKAGES if (v := _version(p)) is not None},
    }


def describe(env: dict[str, Any]) -> str:
    """One paragraph for the top of the report."""
    gpu = env["gpu"]
    parts = [f"GPU {gpu.get('name')}"]
    if gpu.get("compute_capability"):
        parts[-1] += f" (sm {gpu['compute_capability']})"
    if gpu.get("driver_version"):
        parts.append(f"driver {gpu['driver_version']}")
    if gpu.get("cuda_driver_api"):
        parts.append(f"CUDA {gpu['cuda_driver_api']}")
    parts.append(f"backend {env['numbagraph_backend']}")
    parts.append(f"Python {env['python']}")
    parts += [f"{k} {v}" for k, v in env["packages"].items()]
    if env.get("nvcc"):
        parts.append(env["nvcc"])
    return "; ".join(parts)
