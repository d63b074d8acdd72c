"""``python -m graphstore.cli``: the ``graphstore`` command."""

import sys

from graphstore.cli.app import main

sys.exit(main())
