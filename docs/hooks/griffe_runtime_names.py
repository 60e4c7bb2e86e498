"""A griffe extension for the API reference: ``numbagraph.<name>`` is what
Python finds there.

Where numbagraph/__init__.py defines a function or class with the name of a
submodule (``backend()`` and the package ``numbagraph.backend``), Python's
``numbagraph.<name>`` is the definition, made after the submodule's import;
griffe keeps the submodule. This extension puts the definition back, so that
``::: numbagraph.backend`` documents ``ng.backend()``.
"""

from __future__ import annotations

from typing import Any

import griffe


class RuntimeNames(griffe.Extension):
    def __init__(self) -> None:
        self._defined: dict[str, Any] = {}

    def _keep(self, obj: Any) -> None:
        if obj.parent is not None and obj.parent.path == "numbagraph":
            self._defined[obj.name] = obj

    def on_function_instance(self, *, func: Any, **kwargs: Any) -> None:
        self._keep(func)

    def on_class_instance(self, *, cls: Any, **kwargs: Any) -> None:
        self._keep(cls)

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        if pkg.path != "numbagraph":
            return
        for name, obj in self._defined.items():
            member = pkg.members.get(name)
            if member is not None and member is not obj and member.is_module:
                pkg.set_member(name, obj)

    # Older griffe releases name the same event so.
    on_package_loaded = on_package
