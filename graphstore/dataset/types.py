"""The names of node and edge types, as PyG spells them (``None`` for a homogeneous graph)."""

from __future__ import annotations

NodeType = str | None
EdgeType = tuple[str, str, str] | None
