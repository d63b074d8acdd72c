"""Preloaded by a fork server in its tests: graphstore's compile counter watches from the server's start."""

from graphstore import jitcache

jitcache.compile_counts()  # registers the counter: a project compile in the server would be counted
