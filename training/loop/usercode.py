"""Your own model and loss in ``graphstore-train`` (``--model MODULE:FACTORY``, ``--loss MODULE:FN``):
imported with the current directory first on the path, checked at the door, built in every rank."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

import torch

from graphstore.errors import InvalidInputError


def load(spec: str, flag: str) -> Callable[..., Any]:
    """The callable ``NAME`` of ``MODULE`` in ``spec`` (``MODULE:NAME``); one line naming it when it
    cannot be imported or is not callable."""
    module_name, name = spec.split(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # your module beside you, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise InvalidInputError(f"{flag} {spec}: cannot import {module_name!r} ({type(exc).__name__}: "
                                f"{_first_line(exc)}); run from the folder that holds it, or put it on PYTHONPATH") from exc
    found = getattr(module, name, None)
    if not callable(found):
        what = "is not callable" if found is not None else "is not defined there"
        raise InvalidInputError(f"{flag} {spec}: {name!r} {what} in {module.__file__}; give a function")
    return found


def build_model(spec: str, in_channels: int, out_channels: int, config: Any) -> torch.nn.Module:
    """``FACTORY(in_channels, out_channels, config)`` of ``spec``; one line naming it when it fails or
    returns something that is not a ``torch.nn.Module``."""
    factory = load(spec, "--model")
    try:
        model = factory(in_channels, out_channels, config)
    except Exception as exc:
        raise InvalidInputError(f"--model {spec}: {spec.split(':')[1]}({in_channels}, {out_channels}, config) "
                                f"raised {type(exc).__name__}: {_first_line(exc)}") from exc
    if not isinstance(model, torch.nn.Module):
        raise InvalidInputError(f"--model {spec}: returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]
