"""pip's settings on this machine as uv's arguments, so that ``uv pip install`` installs what pip would.

Usage (tools/bootstrap.sh)::

    python tools/pip_as_uv.py [--pip .venv/bin/pip]

Reads ``pip config list`` (the ``[global]`` and ``[install]`` sections of pip's files, and the ``PIP_*``
environment) and prints one uv argument per line: indexes, find-links, constraints, trusted hosts, and
``--index-strategy unsafe-best-match`` (pip takes the best version over all its indexes; uv by default only
the first index that has a package); and environment settings as ``ENV NAME=VALUE`` lines (the certificate
bundle, the HTTP timeout). A setting it has no translation for makes it print the setting's name to stderr and
exit 1: the caller then installs with pip, never with an index or a constraint silently dropped.
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import subprocess
import sys

# pip's key -> uv's flag, each of the value's whitespace-separated items given once
_LISTS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
          "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}
_ENV = {"cert": "SSL_CERT_FILE", "timeout": "UV_HTTP_TIMEOUT", "default-timeout": "UV_HTTP_TIMEOUT",
        "retries": "UV_HTTP_RETRIES"}
_FLAGS = {"no-index": "--no-index"}
_IGNORED = {"disable-pip-version-check", "no-cache-dir", "progress-bar", "no-color", "quiet", "verbose",
            "root-user-action", "no-input"}  # what pip prints or caches, not what it installs
_SECTIONS = {"global": 0, "install": 1, ":env:": 2}  # what `pip install` reads, weakest first
_LINE = re.compile(r"^(?P<section>[^.]*)\.(?P<key>[^=]+)=(?P<value>.*)$")


def settings(lines: list[str]) -> list[tuple[str, str, str]]:
    """``(section, key, value)`` per line of ``pip config list``: ``global.key='value'`` (a file's
    ``[global]`` section), ``install.key=...``, ``:env:.key=...`` (a ``PIP_*`` variable)."""
    out = []
    for line in lines:
        match = _LINE.match(line.strip())
        if match is None:
            continue
        value = match["value"]
        try:
            value = str(ast.literal_eval(value))  # pip writes each value as a Python repr
        except (ValueError, SyntaxError):
            pass
        out.append((match["section"], match["key"].strip(), value))
    return out


def translate(listed: list[tuple[str, str, str]]) -> tuple[list[str], dict[str, str], list[str]]:
    """uv's arguments, its environment, and the keys with no translation. As ``pip install`` reads them, a
    ``PIP_*`` variable overrides the ``[install]`` section, which overrides ``[global]``; other commands'
    sections do not apply."""
    chosen: dict[str, tuple[int, str]] = {}
    for section, key, value in listed:
        rank = _SECTIONS.get(section)
        if rank is not None and rank >= chosen.get(key, (-1, ""))[0]:
            chosen[key] = (rank, value)
    args, env, unknown = ["--index-strategy", "unsafe-best-match"], {}, []
    for key, (_, value) in chosen.items():
        if key in _LISTS:
            for item in value.split():
                args += [_LISTS[key], item]
        elif key in _ENV:
            env[_ENV[key]] = value
        elif key in _FLAGS:
            if value.lower() in ("1", "true", "yes", "on"):
                args.append(_FLAGS[key])
        elif key not in _IGNORED:
            unknown.append(key)
    return args, env, unknown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pip", default=f"{sys.executable} -m pip", help="the pip to ask (default: this Python's)")
    args = parser.parse_args(argv)
    listed = subprocess.run([*shlex.split(args.pip), "config", "list"], capture_output=True, text=True)
    if listed.returncode != 0:
        print(f"pip_as_uv: `{args.pip} config list` failed: {listed.stderr.strip()}", file=sys.stderr)
        return 1
    uv_args, env, unknown = translate(settings(listed.stdout.splitlines()))
    if unknown:
        print(f"pip_as_uv: no uv translation for pip's setting(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 1
    for arg in uv_args:
        print(arg)
    for name, value in env.items():
        print(f"ENV {name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
