"""Imports only go down: training → sampling → graphstore; nothing imports tools/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["graphstore", "sampling", "training"]  # each may import only itself and those before it


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _violations(package: str, root: Path = ROOT) -> list[str]:
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    forbidden = (set(LAYERS) | {"tools", "tests"}) - allowed
    out = []
    for path in sorted((root / package).rglob("*.py")):
        for name in sorted(_imports(path) & forbidden):
            out.append(f"{path.relative_to(root)} imports {name}")
    return out


@pytest.mark.parametrize("package", LAYERS)
def test_imports_only_go_down(package):
    assert (ROOT / package / "__init__.py").exists()
    assert _violations(package) == []


def test_the_checker_catches_upward_imports(tmp_path):
    (tmp_path / "sampling").mkdir()
    (tmp_path / "sampling" / "probe.py").write_text("import graphstore\nfrom training.loop import fit\nimport tools\n")
    assert _violations("sampling", tmp_path) == ["sampling/probe.py imports tools", "sampling/probe.py imports training"]
