"""The import graph: imports only go down (training → sampling → graphstore; nothing imports tools/); no cycles."""

from __future__ import annotations

import ast
import re
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["graphstore", "sampling", "training"]  # each may import only itself and those before it
# Imports under ``if TYPE_CHECKING:`` count like any other, except these (importer, imported) pairs,
# each a type-only back edge of a runtime edge that has to exist. Keep this list short.
TYPE_ONLY: dict[tuple[str, str], str] = {}


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


def _modules(root: Path, packages: list[str]) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``packages`` (a package is its ``__init__``)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Ids of the nodes inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) blocks."""
    inside = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None) if isinstance(node, ast.If) else None
        if getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
            inside.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return inside


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    """The project modules one import statement loads (``from a import b``: ``a.b`` if it is a module)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1] if node.level else []
        source = ".".join(base + ([node.module] if node.module else []))
        names = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


def _graph(root: Path = ROOT, packages: list[str] = LAYERS) -> dict[str, dict[str, tuple[int, bool]]]:
    """Module → {imported module: (line, whether every such import is under TYPE_CHECKING)}.

    Module-level and function-level (deferred) imports both count: a deferred import is still an edge.
    """
    modules = _modules(root, packages)
    graph: dict[str, dict[str, tuple[int, bool]]] = {m: {} for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        type_only = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, module, path.name == "__init__.py", modules):
                    line, was_type_only = graph[module].get(target, (node.lineno, True))
                    graph[module][target] = (line, was_type_only and id(node) in type_only)
    return graph


def _runtime_edges(graph: dict[str, dict[str, tuple[int, bool]]]) -> dict[str, list[str]]:
    return {m: sorted(t for t, (_, type_only) in edges.items() if not (type_only and (m, t) in TYPE_ONLY))
            for m, edges in graph.items()}


def _path(edges: dict[str, list[str]], start: str) -> list[str] | None:
    """The shortest import chain from ``start`` back to itself, or ``None``."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in edges[node]:
            if nxt == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(previous[chain[-1]])
                return [start, *reversed(chain[:-1]), start]
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return None


def _cycles(graph: dict[str, dict[str, tuple[int, bool]]]) -> list[str]:
    """Every import cycle, one line each: ``a:12 -> b:7 -> a`` (the line of each import); none when acyclic."""
    edges, seen, out = _runtime_edges(graph), set(), []
    for module in sorted(edges):
        chain = None if module in seen else _path(edges, module)
        if chain:
            seen.update(chain)
            out.append(" -> ".join(f"{a}:{graph[a][b][0]}" for a, b in zip(chain, chain[1:])) + f" -> {chain[-1]}")
    return out


@pytest.mark.parametrize("package", LAYERS)
def test_imports_only_go_down(package):
    assert (ROOT / package / "__init__.py").exists()
    assert _violations(package) == []


def test_the_checker_catches_upward_imports(tmp_path):
    (tmp_path / "sampling").mkdir()
    (tmp_path / "sampling" / "probe.py").write_text("import graphstore\nfrom training.loop import fit\nimport tools\n")
    assert _violations("sampling", tmp_path) == ["sampling/probe.py imports tools",
                                                 "sampling/probe.py imports training"]


def test_no_import_cycles():
    graph = _graph()
    assert len(graph) > 50 and "graphstore.storage.local" in graph["graphstore.dataset.opened"]  # the walk saw the project
    cycles = _cycles(graph)
    assert not cycles, "import cycles (module:line of the import -> ...):\n" + "\n".join(cycles)


def test_type_only_exceptions_are_needed():
    """Each allowed pair is a TYPE_CHECKING import closing a runtime cycle; a stale entry fails."""
    graph = _graph()
    for (importer, imported), reason in TYPE_ONLY.items():
        assert graph[importer].get(imported, (0, False))[1], f"{importer} no longer imports {imported} for types only"
        assert _path(_runtime_edges(graph) | {importer: [imported]}, importer), f"{reason}: no cycle left; drop it"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checker_catches_a_deferred_cycle(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "a.py": "from pkg.b import g\n",
                               "b.py": "def g():\n    from pkg import a\n    return a\n", "c.py": "import pkg.a\n"})
    assert _cycles(_graph(root, ["pkg"])) == ["pkg.a:1 -> pkg.b:2 -> pkg.a"]


def test_the_checker_catches_relative_and_type_checking_cycles(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "sub/__init__.py": "from .x import X\n",
                               "sub/x.py": "import typing\nif typing.TYPE_CHECKING:\n    from ..y import Y\n",
                               "y.py": "from pkg.sub import X\n"})
    assert _cycles(_graph(root, ["pkg"])) == ["pkg.sub:1 -> pkg.sub.x:3 -> pkg.y:1 -> pkg.sub"]


def test_the_checker_passes_an_acyclic_package(tmp_path):
    root = _package(tmp_path, {"__init__.py": "from pkg.a import f\n", "a.py": "from . import b\n",
                               "b.py": "import os\n"})
    graph = _graph(root, ["pkg"])
    assert graph["pkg"] == {"pkg.a": (1, False)} and graph["pkg.a"] == {"pkg.b": (1, False)}
    assert _cycles(graph) == []


def test_the_launcher_checks_a_job_without_importing_torch(tmp_path):
    """``graphstore-train``'s launcher only checks the job and watches its ranks: parsing the flags and every
    check before ranks start (the dataset's manifest, outputs, the rank count) stay clear of torch and PyG
    (seconds of imports every job would otherwise wait for before its ranks start, on a host without a GPU
    driver; the ranks import them themselves)."""
    import subprocess
    import sys

    import graphstore

    graphstore.ingest("synthetic:nodes=200,avg_degree=3,features=4,classes=2", tmp_path / "ds", num_parts=2)
    code = ("import sys, graphstore, training.launch as launch\n"
            f"config = launch.config_from_args(launch._parser().parse_args([{str(tmp_path / 'ds')!r}]))\n"
            "print(launch._check_job(config, None, False, 0))\n"
            "print(sorted(m for m in sys.modules if m == 'training.loop.trainer' or m.split('.')[0] in ('torch', 'torch_geometric')))\n"
            f"graphstore.open_dataset({str(tmp_path / 'ds')!r}).partition(0)\n"
            "print('torch_geometric' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["2", "[]", "True"], out.stdout  # serving a partition does import them


# a package's root holds its public entry points only; the rest sits in sub-packages named by role
ROOT_MODULES = {"graphstore": {"__init__", "errors", "exports", "forking", "heap", "jitcache", "version"},
                "sampling": {"__init__"},
                "training": {"__init__", "config", "launch", "run", "serve"}}


@pytest.mark.parametrize("package", LAYERS)
def test_a_package_root_holds_only_its_entry_points(package):
    at_root = {path.stem for path in (ROOT / package).glob("*.py")}
    assert at_root <= ROOT_MODULES[package], f"{package}/: move {sorted(at_root - ROOT_MODULES[package])} into a sub-package"
    assert not [p for p in (ROOT / package).iterdir() if p.is_dir() and p.name != "__pycache__"
                and not (p / "__init__.py").exists()], "every folder is a package"


def test_no_module_name_appears_twice_across_the_layers():
    seen: dict[str, list[str]] = {}
    for package in LAYERS:
        for path in (ROOT / package).rglob("*.py"):
            if path.stem not in ("__init__", "__main__"):
                seen.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_module_imports_another_modules_private_name():
    """A name another module needs is public where it is defined: ``from m import _x`` is refused."""
    found = []
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom):
                    found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}"
                              for a in node.names if a.name.startswith("_")]
    assert found == []



def _kernels(root: Path) -> list[tuple[str, ast.FunctionDef]]:
    """Every numba kernel (a function decorated with ``njit`` or a kernel decorator built on it) under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef) and any(
                    re.search(r"\b(njit|borrowing)\b", ast.unparse(d)) for d in node.decorator_list):
                found.append((f"{path.relative_to(root.parent)}:{node.lineno}", node))
    return found


def _wide_public_kernels(root: Path) -> list[str]:
    return [f"{where} {fn.name}: {len(fn.args.args) + len(fn.args.kwonlyargs)} parameters"
            for where, fn in _kernels(root)
            if not fn.name.startswith("_") and len(fn.args.args) + len(fn.args.kwonlyargs) > 12]


def test_no_public_kernel_takes_more_than_12_parameters():
    """Data crossing into the kernels has names (the records of ``sampling.kernels.structs``), not a long
    positional list; a private function may take a record's fields as arguments, where numba prunes on them."""
    assert sum(len(_kernels(ROOT / package)) for package in LAYERS) > 50, "the kernels were not found"
    assert [w for package in LAYERS for w in _wide_public_kernels(ROOT / package)] == []


def test_the_kernel_width_check_finds_a_wide_public_kernel(tmp_path):
    (tmp_path / "pkg").mkdir()
    params = ", ".join(f"a{i}" for i in range(13))
    (tmp_path / "pkg" / "k.py").write_text(f"@borrowing\ndef wide({params}):\n    pass\n\n\n"
                                           f"@njit(cache=True)\ndef _private({params}):\n    pass\n\n\n"
                                           f"@njit\ndef narrow({params[:-5]}):\n    pass\n")
    assert [fn.name for _, fn in _kernels(tmp_path / "pkg")] == ["wide", "_private", "narrow"]
    assert _wide_public_kernels(tmp_path / "pkg") == ["pkg/k.py:2 wide: 13 parameters"]
