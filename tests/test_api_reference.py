"""The API reference (docs/reference) documents every public name."""

import pathlib
import re
import sys

import pytest

import numbagraph as ng

REFERENCE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "reference"
DIRECTIVE = re.compile(r"^::: *([\w.]+) *$", re.M)


def _directives() -> list[str]:
    return [name for page in sorted(REFERENCE.glob("*.md"))
            for name in DIRECTIVE.findall(page.read_text())]


def _documents(identifier: str, name: str) -> bool:
    """Whether ``::: identifier`` renders ``ng.<name>``.

    ``numbagraph.<name>`` does, unless a submodule of that name shadows it:
    the reference's griffe then renders the submodule, except for what
    numbagraph/__init__.py defines itself (docs/hooks/griffe_runtime_names.py).
    ``numbagraph.<module>.<name>`` does when that module exports it.
    """
    obj = getattr(ng, name)
    module_name, _, attr = identifier.rpartition(".")
    if attr != name:
        return False
    if module_name == "numbagraph":
        submodule = sys.modules.get(f"numbagraph.{name}")
        return (submodule is None or submodule is obj
                or getattr(obj, "__module__", None) == "numbagraph")
    module = sys.modules.get(module_name)
    return (module is not None and name in getattr(module, "__all__", ())
            and getattr(module, name) is obj)


def _identifier(name: str) -> str:
    """The directive that renders ``ng.<name>``."""
    if _documents(f"numbagraph.{name}", name):
        return f"numbagraph.{name}"
    return f"{getattr(ng, name).__module__}.{name}"


@pytest.mark.parametrize("name", ng.__all__)
def test_public_name_is_in_the_api_reference(name):
    documented = [d for d in _directives() if _documents(d, name)]
    assert documented, (
        f"ng.{name} is public (numbagraph.__all__) but no page of docs/reference "
        f"renders it: add `::: {_identifier(name)}` to the page it belongs on"
    )


def test_reference_renders_only_public_names():
    public = set(ng.__all__)
    strays = [d for d in _directives() if d.rpartition(".")[2] not in public]
    assert not strays, f"docs/reference renders names outside numbagraph.__all__: {strays}"


def test_errors_page_trees_name_every_error_and_warning():
    page = (REFERENCE / "errors.md").read_text()
    tree = "".join(re.findall(r"```text\n(.*?)```", page, re.S))
    missing = [name for name in ng.errors.__all__ if not re.search(rf"\b{name}\b", tree)]
    assert not missing, f"the trees of docs/reference/errors.md lack {missing}"
