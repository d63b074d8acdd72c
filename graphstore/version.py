"""The graphstore release, recorded in every manifest a run writes."""

from __future__ import annotations

VERSION = "0.1.0"
__version__ = VERSION
