"""Module paths of earlier releases still import, as the very module that now holds the code, with a warning."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

from graphstore.moved import MOVED


def test_old_module_paths_are_the_new_modules_and_warn() -> None:
    # one fresh process: the old paths must not have been imported (and warned) before
    code = ("import importlib, json, sys, warnings\n"
            "from graphstore.moved import MOVED\n"
            "out = {}\n"
            "for old, new in MOVED.items():\n"
            "    with warnings.catch_warnings(record=True) as seen:\n"
            "        warnings.simplefilter('always')\n"
            "        module = importlib.import_module(old)\n"
            "    out[old] = [module is importlib.import_module(new),\n"
            "                [str(w.message) for w in seen if w.category is DeprecationWarning and old in str(w.message)]]\n"
            "print(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(found) == set(MOVED)
    for old, (same, warned) in found.items():
        assert same, f"{old} is not the module {MOVED[old]}"
        assert any(f"moved to {MOVED[old]}" in w for w in warned), (old, warned)


def test_every_new_path_exists_and_no_old_file_is_left() -> None:
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        top = importlib.util.find_spec("graphstore").submodule_search_locations[0]
        assert not (__import__("pathlib").Path(top) / (old.split(".")[1] + ".py")).exists(), f"{old} is back"


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
