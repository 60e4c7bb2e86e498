import ast
import os
import pathlib
import subprocess
import sys

import pytest

from numbagraph.backend import active, interface

BACKEND_DIR = pathlib.Path(interface.__file__).parent
BACKENDS = {
    "cuda": ("driver", "driver_conditional", "driver_ops", "driver_memory", "driver_launch",
             "driver_host", "driver_divert"),
    "simulator": ("simulator", "simulator_conditional", "simulator_ops", "simulator_memory"),
}
# Each backend's reading of a captured graph's nodes.
BACKENDS["cuda"] += ("driver_nodes",)
BACKENDS["simulator"] += ("simulator_nodes",)
# Each backend's several streams in one capture, and child graphs.
BACKENDS["cuda"] += ("driver_streams",)
BACKENDS["simulator"] += ("simulator_streams",)
# Each backend's collectives.
BACKENDS["cuda"] += ("driver_dist",)
BACKENDS["simulator"] += ("simulator_dist",)
# Each backend's device-updatable kernel nodes.
BACKENDS["cuda"] += ("driver_devnodes",)
BACKENDS["simulator"] += ("simulator_devnodes",)


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


def _top_level(module: str) -> dict[str, ast.AST]:
    """The names a backend module defines or imports at top level."""
    names: dict[str, ast.AST] = {}
    for node in ast.parse((BACKEND_DIR / f"{module}.py").read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update((t.id, node) for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update((a.asname or a.name, node) for a in node.names)
    return names


def _parameters(function: ast.FunctionDef) -> list[str]:
    return [a.arg for a in function.args.args + function.args.kwonlyargs if a.arg != "self"]


def _protocol_parameters(obj) -> list[str]:
    import inspect

    return [p for p in inspect.signature(obj).parameters if p != "self"]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_each_backend_implements_every_member_of_the_interface(backend):
    defined: dict[str, ast.AST] = {}
    for module in BACKENDS[backend]:
        defined.update(_top_level(module))
    missing = [m for m in interface.MEMBERS if m not in defined]
    assert not missing, f"the {backend} backend lacks {missing}"
    for member in interface.MEMBERS:
        node, spec = defined[member], getattr(interface.Backend, member, None)
        if isinstance(node, ast.FunctionDef) and callable(spec):
            assert _parameters(node) == _protocol_parameters(spec), member


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("cls", ["Recording", "Executable", "ConditionalNode"])
def test_each_backend_class_has_the_methods_of_the_interface(backend, cls):
    classes = {}
    for module in BACKENDS[backend]:
        classes.update({k: v for k, v in _top_level(module).items()
                        if isinstance(v, ast.ClassDef)})
    methods = {n.name: n for n in classes[cls].body if isinstance(n, ast.FunctionDef)}
    spec = getattr(interface, cls)
    for name, function in vars(spec).items():
        if callable(function) and not name.startswith("_"):
            assert name in methods, f"{backend} {cls} lacks {name}"
            assert _parameters(methods[name]) == _protocol_parameters(function), name


def test_the_backend_in_use_holds_exactly_the_interface():
    held = {name for name in vars(active) if not name.startswith("_")}
    assert held == set(interface.MEMBERS)


def test_a_backend_lacking_a_member_fails_at_import_with_its_name():
    import types

    partial = types.ModuleType("partial")
    partial.NAME = "partial"
    with pytest.raises(ImportError, match="stream_handle"):
        interface.bind("partial", partial)


def test_simulator_asked_for_after_numba_chose_the_driver_says_what_to_do():
    done = _python("from numba import cuda; import numbagraph", NUMBAGRAPH_BACKEND="simulator",
                   NUMBA_ENABLE_CUDASIM="0")
    assert done.returncode != 0
    assert "import numbagraph before numba.cuda" in done.stderr


def test_numba_first_on_a_machine_without_a_device_says_what_to_do():
    probe = _python("from numbagraph.backend import _cuda_device_present as p; print(p())",
                    NUMBAGRAPH_BACKEND="simulator")
    if probe.stdout.strip() == "True":
        pytest.skip("a CUDA device answers here: numba's driver choice works")
    done = _python("from numba import cuda; import numbagraph", NUMBAGRAPH_BACKEND="auto")
    assert done.returncode != 0
    assert "no CUDA device answers" in done.stderr
    assert "NUMBA_ENABLE_CUDASIM=1" in done.stderr
