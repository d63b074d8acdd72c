"""docs/cli.md is what tools/cli_doc.py writes from the parsers now, and it names every option of every command."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"


def _load_tool():
    spec = importlib.util.spec_from_file_location("cli_doc", ROOT / "tools" / "cli_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool():
    return _load_tool()


@pytest.fixture(scope="module")
def rendered(tool):
    return tool.render()


def test_page_is_current(rendered):
    assert PAGE.is_file(), "docs/cli.md is missing: run .venv/bin/python tools/cli_doc.py --write docs/cli.md"
    assert PAGE.read_text() == rendered, (
        "docs/cli.md is stale: run .venv/bin/python tools/cli_doc.py --write docs/cli.md")


def test_every_command_and_option_is_on_the_page(tool, rendered):
    seen = []
    for top in tool.parsers():
        for parser, _, _ in tool.walk(top):
            assert f"# {parser.prog}\n" in rendered, f"no section for {parser.prog}"
            for action in parser._actions:
                for option in action.option_strings:
                    seen.append(option)
                    assert f"`{option}`" in rendered, f"{parser.prog} {option} is not in docs/cli.md"
    assert {"--parts", "--engine", "--force", "--nproc", "--resume"} <= set(seen)  # ingest, warmup, train parsed
    progs = [parser.prog for top in tool.parsers() for parser, _, _ in tool.walk(top)]
    assert {"graphstore", "graphstore ingest", "graphstore info", "graphstore verify", "graphstore warmup",
            "graphstore-train"} <= set(progs)


def test_check_names_a_stale_page_in_one_line(tool, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tool, "render", lambda: "# Command-line reference\n")
    stale = tmp_path / "cli.md"
    stale.write_text("# an old page\n")
    assert tool.main(["--check", str(stale)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stale" in err and "--write" in err
    assert tool.main(["--write", str(stale)]) == 0
    assert tool.main(["--check", str(stale)]) == 0
    assert tool.main(["--check", str(tmp_path / "missing.md")]) == 1
