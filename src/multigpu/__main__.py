"""``python -m multigpu``: the ``multigpu`` command line (see ``multigpu.cli.main``)."""

from __future__ import annotations

import sys

from multigpu.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
