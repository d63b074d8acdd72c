"""Ingest: read a graph, partition it, and write it as a graphstore dataset."""

from __future__ import annotations

from graphstore.ingest.pipeline import IngestSummary, ingest
from graphstore.ingest.source import ArrayRows, EdgeTable, GraphSource, NodeTable, RowSource

__all__ = ["ArrayRows", "EdgeTable", "GraphSource", "IngestSummary", "NodeTable", "RowSource", "ingest"]
