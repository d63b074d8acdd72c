"""Imported once by the fork server in its tests: records which process imported it."""

import os

IMPORTED_BY = os.getpid()
