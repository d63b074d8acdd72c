"""Every command of the README's tour runs, and every relative link in README.md and docs/ reaches its target."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TOUR_HEADING = "## A five-minute tour"
RUN_LANGUAGES = ("bash", "python")  # the tour's blocks in these languages run; `sh` blocks are shown only
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```(\S*)")


def fenced_blocks(lines: list[str]) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block in ``lines``, in order."""
    blocks, language, code = [], None, []
    for line in lines:
        match = FENCE.match(line)
        if match and language is None:
            language, code = match.group(1), []
        elif match:
            blocks.append((language, "\n".join(code) + "\n"))
            language = None
        elif language is not None:
            code.append(line)
    return blocks


def tour_blocks(text: str) -> list[tuple[str, str]]:
    """The runnable blocks of the README section headed ``TOUR_HEADING`` (up to the next ``## `` heading)."""
    lines = text.splitlines()
    start = lines.index(TOUR_HEADING)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return [(lang, code) for lang, code in fenced_blocks(lines[start + 1:end]) if lang in RUN_LANGUAGES]


def _bin_dir() -> Path:
    venv = ROOT / ".venv" / "bin"
    return venv if (venv / "graphstore").exists() else Path(sys.executable).parent


def test_the_tour_has_its_steps():
    blocks = tour_blocks(README.read_text())
    text = "".join(code for _, code in blocks)
    for command in ("graphstore ingest", "graphstore info", "graphstore-train", "torchrun", "open_dataset"):
        assert command in text, f"the README's tour no longer runs {command!r}"


@pytest.mark.slow
@pytest.mark.distributed
def test_every_tour_command_runs(tmp_path):
    bin_dir = _bin_dir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for number, (language, code) in enumerate(tour_blocks(README.read_text()), 1):
        if language == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", code]
        else:
            cmd = [str(bin_dir / "python"), "-c", code]
        rc, out, err = _run(cmd, tmp_path, env)
        assert rc == 0, (f"README tour block {number} ({language}) exited {rc}:\n{code}\n"
                         f"--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}")
    # what the tour says its commands leave behind
    for picture in ("curves.png", "partitions.png"):
        assert (tmp_path / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", picture
    assert list((tmp_path / "runs").glob("events.out.tfevents.*")), "no TensorBoard event file in runs/"
    assert len(json.loads((tmp_path / "metrics.json").read_text())["epochs"]) == 2
    assert any((tmp_path / "checkpoints").iterdir()), "no checkpoint written"


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> tuple[int, str, str]:
    """Run ``cmd`` in a session of its own; on timeout the whole group (torchrun's ranks too) is killed."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -1, out, f"timed out after {timeout} s\n{err}"
    return proc.returncode, out, err


def test_the_setup_block_names_scripts_that_exist():
    """The README's first block is what CI runs (tools/test.sh runs tools/bootstrap.sh first); its scripts exist."""
    language, code = fenced_blocks(README.read_text().splitlines())[0]
    assert language == "bash"
    assert "bash tools/bootstrap.sh && .venv/bin/python tools/demo.py" in code and "bash tools/test.sh" in code
    for script in ("tools/bootstrap.sh", "tools/demo.py", "tools/test.sh"):
        assert (ROOT / script).is_file(), f"the README's first block runs {script}, which is missing"


# -- links ---------------------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file (outside code blocks), with GitHub's -1, -2 for repeats."""
    found, seen, in_code = set(), {}, False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if match and not in_code:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """``(line number, target)`` of every markdown link outside code blocks and code spans; a link may wrap
    across the lines of its paragraph (the number is then the paragraph's first line)."""
    found, in_code, paragraph, first = [], False, [], 0

    def flush() -> None:
        text = re.sub(r"`[^`]*`", "", " ".join(paragraph))
        found.extend((first, target) for target in LINK.findall(text))
        paragraph.clear()

    for number, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            flush()
            in_code = not in_code
        elif in_code:
            continue
        elif not line.strip() or line.startswith(("#", "|")):
            flush()
            if line.startswith(("#", "|")):
                first, paragraph[:] = number, [line]
                flush()
        else:
            if not paragraph:
                first = number
            paragraph.append(line)
    flush()
    return found


def _pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_the_docs_pages_exist():
    names = {p.name for p in _pages()}
    assert {"ingest.md", "datasets.md", "sampling.md", "training.md", "object-storage.md", "design.md",
            "cli.md"} <= names


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``page`` whose file, or heading anchor, is missing, or that leaves ``root``."""
    broken, root, page = [], root.resolve(), page.resolve()
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not dest.is_relative_to(root):
            broken.append(f"{where} leaves the repository (it must stand alone)")
        elif not dest.exists():
            broken.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading with that anchor in {dest.relative_to(root)}")
    return broken


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_their_targets(page):
    broken = broken_links(page)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_checker_catches_each_kind(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Two words (`code`)\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md#two-words-code) [ok](#top) `[code](nowhere.md)` [a link\nthat wraps](#nowhere)\n\n"
                    "[gone](docs/b.md) [anchor](docs/a.md#not-a-heading) [out](../elsewhere.md) [web](https://x.org)\n"
                    "# Top\n")
    assert broken_links(page, tmp_path) == [
        "README.md:1: #nowhere: no heading with that anchor in README.md",
        "README.md:4: docs/b.md: no such file",
        "README.md:4: docs/a.md#not-a-heading: no heading with that anchor in docs/a.md",
        "README.md:4: ../elsewhere.md leaves the repository (it must stand alone)"]


def test_slugs_follow_github():
    assert slug("On a Dask cluster (`--engine dask`)") == "on-a-dask-cluster---engine-dask"
    assert slug("Compiled once per installation (`graphstore warmup`)") == \
        "compiled-once-per-installation-graphstore-warmup"
    assert slug("Global node IDs: a range partition book") == "global-node-ids-a-range-partition-book"
