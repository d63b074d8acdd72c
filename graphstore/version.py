"""The graphstore release, recorded in every manifest a run writes."""

from __future__ import annotations

__version__ = "0.1.0"
