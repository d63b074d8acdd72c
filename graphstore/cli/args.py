"""Argparse types for the numeric and size flags of both CLIs: finite, in range, refused where they enter."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]`` (either end open when ``None``)."""
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not an integer{_range(low, high)}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: give an integer{_range(low, high)}")
        return value

    return parse


def number(low: float | None = None, high: float | None = None, *, above: bool = False,
           below: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[low, high]`` (``above``/``below``: excluding that end)."""
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a number{_range(low, high, above, below)}") from None
        bad_low = low is not None and (value <= low if above else value < low)
        bad_high = high is not None and (value >= high if below else value > high)
        if not math.isfinite(value) or bad_low or bad_high:
            raise argparse.ArgumentTypeError(
                f"{raw} is out of range: give a finite number{_range(low, high, above, below)}")
        return value

    return parse


def size(raw: str) -> str:
    """An argparse type: a positive byte size (``5000000000``, ``50GB``, ``4GiB``), kept as written."""
    from graphstore.storage.cache import parse_size
    from graphstore.errors import ConfigError

    try:
        value = parse_size(raw, "size")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a size; write bytes as 5000000000, 5GB or 4GiB") from None
    if value is None or value <= 0:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a positive size; give e.g. 50GB, or leave the flag out")
    return raw


def feature_cache(raw: str) -> str:
    """An argparse type: ``--feature-cache``'s value, a positive size, 0 (disk reads, no RAM cache) or off."""
    return raw if raw in ("0", "off") else size(raw)


def _range(low: float | None, high: float | None, above: bool = False, below: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if above else '['}{low:g}, {high:g}{')' if below else ']'}"
    if low is not None:
        return f" {'>' if above else '>='} {low:g}"
    return f" {'<' if below else '<='} {high:g}" if high is not None else ""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the flag (no usage dump; ``--help`` has it)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
