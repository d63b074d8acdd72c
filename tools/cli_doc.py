"""Write docs/cli.md from the argparse parsers of ``graphstore`` (its subcommands included), ``graphstore-train``
and ``graphstore-run``.

Usage::

    .venv/bin/python tools/cli_doc.py --write docs/cli.md   # regenerate
    .venv/bin/python tools/cli_doc.py --check docs/cli.md   # exit 1, with one line, when the file is stale
    .venv/bin/python tools/cli_doc.py                       # print the markdown

Subcommands that other packages register through the ``graphstore.commands`` entry points (``warmup``)
are added the way ``graphstore`` itself adds them, so a new flag or command shows up here without an edit.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

WIDTH = 100  # usage lines are wrapped at this width whatever the terminal
REGENERATE = ".venv/bin/python tools/cli_doc.py --write docs/cli.md"


def graphstore_parser() -> argparse.ArgumentParser:
    """The ``graphstore`` parser with every subcommand, the entry-point ones included."""
    from graphstore.cli import app

    parser = app._parser()
    builtin = set(_subparsers(parser).choices)
    app._plugin_commands(parser, [], builtin)  # no command named: every installed entry point is loaded
    return parser


def train_parser() -> argparse.ArgumentParser:
    """The ``graphstore-train`` parser."""
    from training import launch

    return launch._parser()


def run_parser() -> argparse.ArgumentParser:
    """The ``graphstore-run`` parser."""
    from training import run

    return run._parser()


def parsers() -> list[argparse.ArgumentParser]:
    """The top-level parsers, in the order the page lists them."""
    return [graphstore_parser(), train_parser(), run_parser()]


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def walk(parser: argparse.ArgumentParser, depth: int = 2) -> Iterator[tuple[argparse.ArgumentParser, int, str]]:
    """``(parser, heading depth, one-line help)`` for a parser and each of its subcommands, depth first."""
    yield parser, depth, ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                for child, d, text in walk(sub, depth + 1):
                    yield child, d, text or helps.get(name, "")


def _cell(text: str) -> str:
    """Text on one line, safe in a table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _prose(text: str) -> str:
    """Help text as markdown: ``<name>`` and ``*.parquet`` stay literal."""
    return _cell(text).replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _code(text: str) -> str:
    return f"`{_cell(text)}`" if text != "" else ""


def _value(action: argparse.Action) -> str:
    if action.nargs == 0 or not action.option_strings:
        return ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return _code("|".join(str(c) for c in action.choices))
    if action.metavar is not None:
        return _code(action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar))
    return _code(action.dest.upper())


def _default(action: argparse.Action) -> str:
    if not action.option_strings:
        return "required" if action.nargs not in ("?", "*") else ""
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return ""
    if action.nargs == 0:
        return "off"
    if action.default is None or action.default is argparse.SUPPRESS or action.default == []:
        return ""
    return _code(str(action.default))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.help is None or action.help is argparse.SUPPRESS:
        return ""
    return _prose(argparse.HelpFormatter(parser.prog)._expand_help(action))


def _usage(parser: argparse.ArgumentParser) -> str:
    previous = parser.formatter_class
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=WIDTH)
    try:
        return parser.format_usage().strip()
    finally:
        parser.formatter_class = previous


def _section(parser: argparse.ArgumentParser, depth: int, summary: str) -> list[str]:
    lines = [f"{'#' * depth} {parser.prog}", ""]
    for text in (summary, parser.description, parser.epilog):
        if text:
            lines += [_prose(text), ""]
    lines += ["```text", _usage(parser), "```", ""]
    rows = [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]
    lines += ["| argument | value | default | what it does |", "|---|---|---|---|"]
    for action in rows:
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        lines.append(f"| {names} | {_value(action)} | {_default(action)} | {_help(parser, action)} |")
    lines.append("")
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        names = ", ".join(f"[`{n}`](#{_anchor(f'{parser.prog} {n}')})" for n in subs[0].choices)
        lines += [f"Commands: {names}.", ""]
    return lines


def _anchor(heading: str) -> str:
    return "-".join(heading.lower().split())


def render() -> str:
    """The whole page."""
    lines = ["# Command-line reference", "",
             "Generated from the parsers by `tools/cli_doc.py`; do not edit it by hand. After a change to a flag, "
             f"run `{REGENERATE}` (`tests/tools/test_cli_doc.py` fails while this page is stale).", ""]
    for top in parsers():
        for parser, depth, summary in walk(top):
            lines += _section(parser, depth, summary)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description="Write or check docs/cli.md, generated from the CLI parsers.")
    mode = cli.add_mutually_exclusive_group()
    mode.add_argument("--write", metavar="PATH", help="write the page to PATH")
    mode.add_argument("--check", metavar="PATH", help="exit 1 when PATH differs from what would be written")
    args = cli.parse_args(argv)
    text = render()
    if args.write:
        Path(args.write).write_text(text)
        return 0
    if args.check:
        path = Path(args.check)
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale: regenerate it with `.venv/bin/python tools/cli_doc.py --write {path}`",
                  file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
