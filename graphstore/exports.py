"""A package's public names, imported from their modules on first use (PEP 562), so importing the package
loads none of them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def exports(namespace: dict[str, Any], table: dict[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562): ``name`` is imported from the module ``table[name]``
    when first asked for and kept in ``namespace``, so importing the package loads none of them.

    Examples
    --------
    In a package's ``__init__.py``::

        _LAZY = {"open_dataset": "graphstore.dataset.opened"}
        __getattr__ = exports(globals(), _LAZY)
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(table[name]), name)
        return value

    return __getattr__
