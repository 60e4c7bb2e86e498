import os
import subprocess
import sys

import pytest


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True
    )


@pytest.mark.parametrize("choice", ["cuda", "simulator", "auto"])
def test_import_never_crashes_whatever_the_backend(choice):
    done = _python("import numbagraph as ng; print(ng.backend())", NUMBAGRAPH_BACKEND=choice)
    assert done.returncode == 0, done.stderr
    expected = {"cuda": "cuda", "simulator": "simulator"}.get(choice)
    if expected:
        assert done.stdout.strip() == expected


def test_unknown_backend_is_named_in_the_error():
    done = _python("import numbagraph", NUMBAGRAPH_BACKEND="opencl")
    assert done.returncode != 0
    assert "NUMBAGRAPH_BACKEND='opencl'" in done.stderr
    assert "auto, cuda, simulator" in done.stderr


def test_numba_choice_stands_when_numba_cuda_came_first():
    done = _python(
        "from numba import cuda; import numbagraph as ng; print(ng.backend())",
        NUMBA_ENABLE_CUDASIM="1",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "simulator"


def test_auto_selects_the_driver_exactly_when_a_device_answers():
    done = _python(
        "import numbagraph as ng\n"
        "from numbagraph.backend import _cuda_device_present\n"
        "print(ng.backend(), _cuda_device_present())"
    )
    assert done.returncode == 0, done.stderr
    backend, present = done.stdout.split()
    assert backend == ("cuda" if present == "True" else "simulator")
