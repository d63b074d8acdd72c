"""Where names live: module paths of releases before the storage/dataset/outputs/cli sub-packages keep
working, with a ``DeprecationWarning`` naming the new path (the old name is the same module object as the
new one, so a monkeypatch or a pickle that names either reaches the same code); and the names a package
exports from its modules on first use (:func:`exports`)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

MOVED = {
    "graphstore.allocator": "graphstore.heap",  # the launch policy (jemalloc preload) is training.allocator
    "graphstore.arrays": "graphstore.storage.arrays",
    "graphstore.cache": "graphstore.storage.cache",
    "graphstore.cachefiles": "graphstore.storage.cachefiles",
    "graphstore.integrity": "graphstore.storage.integrity",
    "graphstore.iostats": "graphstore.storage.iostats",
    "graphstore.lazy": "graphstore.storage.lazy",
    "graphstore.location": "graphstore.storage.location",
    "graphstore.mapped": "graphstore.storage.mapped",
    "graphstore.remote": "graphstore.storage.remote",
    "graphstore.retry": "graphstore.storage.retry",
    "graphstore.zarrrows": "graphstore.storage.zarrrows",
    "graphstore.dataset_stores": "graphstore.dataset.whole",
    "graphstore.stores": "graphstore.dataset.stores",
    "graphstore.manifest": "graphstore.dataset.manifest",
    "graphstore.layout": "graphstore.dataset.layout",
    "graphstore.linksplit": "graphstore.dataset.linksplit",
    "graphstore.rowgather": "graphstore.dataset.rowgather",
    "graphstore.types": "graphstore.dataset.types",
    "graphstore.cli_args": "graphstore.cli.args",
    "graphstore.cli_dask": "graphstore.cli.dask_options",
    "graphstore.cli_storage": "graphstore.cli.storage_options",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and loads it as the module that now holds its code."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path will be removed)",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The new module ran when it was imported."""


def install() -> None:
    """Once per process: old module paths resolve through :class:`_Alias`."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())


def exports(namespace: dict[str, Any], table: dict[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562): ``name`` is imported from the module ``table[name]``
    when first asked for and kept in ``namespace``, so importing the package loads none of them."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(table[name]), name)
        return value

    return __getattr__
