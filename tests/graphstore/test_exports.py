"""A package's public names are the objects of the modules that define them, imported on first use."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from graphstore.exports import exports


def test_documented_package_names() -> None:
    import graphstore
    import graphstore.cli
    import graphstore.dataset
    import graphstore.outputs
    import graphstore.storage

    assert graphstore.storage.open_location is importlib.import_module("graphstore.storage.local").open_location
    assert graphstore.dataset.open_dataset is graphstore.open_dataset
    assert graphstore.outputs.OutputWriter is graphstore.OutputWriter
    assert graphstore.cli.main is importlib.import_module("graphstore.cli.app").main


def test_a_name_is_imported_on_first_use_and_kept() -> None:
    namespace = {"__name__": "pkg"}
    getattr_ = exports(namespace, {"join": "os.path"})
    assert "join" not in namespace
    assert getattr_("join") is importlib.import_module("os.path").join and "join" in namespace
    with pytest.raises(AttributeError, match="'pkg' has no attribute 'split'"):
        getattr_("split")


def test_importing_graphstore_loads_no_torch() -> None:
    code = "import sys, graphstore; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"
