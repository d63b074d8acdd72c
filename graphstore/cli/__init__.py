"""The ``graphstore`` command (``app``) and the argparse pieces both CLIs share: sizes and numbers checked
where they enter (``args``), object-storage options (``storage_options``), the Dask cluster
(``dask_options``). ``graphstore.cli.main`` is the command's entry point, loaded on first use."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "main":
        from graphstore.cli.app import main

        return main
    raise AttributeError(f"module 'graphstore.cli' has no attribute {name!r}")
