"""docs/python-api.md runs as written: its bash and python blocks in order, in an empty directory."""

from __future__ import annotations

import os
import re

import pytest

from tests.test_readme import ROOT, RUN_LANGUAGES, _bin_dir, _run, fenced_blocks

DOC = ROOT / "docs" / "python-api.md"
FILE_BLOCK = re.compile(r"#\s*([\w.-]+\.py)\s*\n")


def blocks() -> list[tuple[str, str]]:
    return [(lang, code) for lang, code in fenced_blocks(DOC.read_text().splitlines()) if lang in RUN_LANGUAGES]


def test_the_page_has_a_script_of_about_forty_lines_and_runs_it():
    found = blocks()
    scripts = {m.group(1): code for lang, code in found if lang == "python" and (m := FILE_BLOCK.match(code))}
    assert "train.py" in scripts and len(scripts["train.py"].splitlines()) <= 45
    commands = "".join(code for lang, code in found if lang == "bash")
    for command in ("graphstore-run --nproc 2 train.py", "--model mymodels:build"):
        assert command in commands, f"docs/python-api.md no longer runs {command!r}"
    assert "torchrun --standalone --nproc-per-node 2 train.py" in DOC.read_text()


@pytest.mark.slow
@pytest.mark.distributed
def test_every_block_runs(tmp_path):
    bin_dir = _bin_dir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    for number, (language, code) in enumerate(blocks(), 1):
        file_name = FILE_BLOCK.match(code) if language == "python" else None
        if file_name:
            (tmp_path / file_name.group(1)).write_text(code)
            continue
        cmd = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [str(bin_dir / "python"), "-c", code]
        rc, out, err = _run(cmd, tmp_path, env)
        assert rc == 0, (f"docs/python-api.md block {number} ({language}) exited {rc}:\n{code}\n"
                         f"--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}")
        if "graphstore-run" in code:
            accuracy = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", out)]
            assert len(accuracy) == 3 and accuracy[-1] > 0.5, out
