"""What numbagraph changes in numba is exactly its table, made once."""

import sys
import types

import pytest

import numbagraph as ng  # noqa: F401  (installs the changes)
from numbagraph import _patches
from numbagraph.backend.interface import Patch
from tests.test_architecture import PACKAGE


def _target(owner, name):
    return vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)


def _defined_in_numbagraph(value) -> bool:
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    # Only plain functions are looked into: numba's modules also hold objects
    # whose attribute lookups have side effects (ctypes' library loaders).
    return (isinstance(value, types.FunctionType)
            and value.__code__.co_filename.startswith(str(PACKAGE)))


def _changes_found_in_numba():
    """(owner, name) of every attribute of numba's modules and their classes
    that holds a function numbagraph wrote."""
    found = set()
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] != "numba" or not isinstance(module, types.ModuleType):
            continue
        for owner in [module, *(v for v in vars(module).values() if isinstance(v, type)
                                and v.__module__ == module_name)]:
            for name, value in list(vars(owner).items()):
                if _defined_in_numbagraph(value):
                    found.add((owner, name))
    return found


def test_every_change_of_the_table_is_in_place():
    missing = [row.target for row, in_place in _patches.installed() if not in_place]
    assert not missing, f"not installed: {missing}"


def test_numba_holds_exactly_the_changes_of_the_table():
    table = {(row.owner, row.name) for row in _patches.table()}
    found = _changes_found_in_numba()
    assert found - table == set(), "changed in numba but not in the table"
    assert table - found == set(), "in the table but not changed in numba"


def test_installing_again_changes_nothing():
    before = [(row.owner, row.name, _target(row.owner, row.name)) for row in _patches.table()]
    _patches.install()
    assert all(_target(owner, name) is value for owner, name, value in before)


def test_every_change_says_why_and_which_numba_it_was_checked_against():
    for row in _patches.table():
        assert row.why and row.checked, row.target
        assert row.target.startswith("numba."), row.target


def test_every_launch_passes_through_the_launch_check():
    rows = [row for row in _patches.table() if "launch check" in row.why]
    assert len(rows) == 1


def test_a_target_numba_lacks_is_named(monkeypatch):
    class Lacking:
        pass

    row = Patch(Lacking, "gone", lambda original: original, "a test row")
    monkeypatch.setattr(_patches, "table", lambda: (row,))
    with pytest.raises(ImportError, match="Lacking.gone"):
        _patches.install()
