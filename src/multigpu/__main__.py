"""``python -m multigpu``: the ``multigpu`` command line (see ``multigpu.launch.cli``).

Environment variables read: see ``multigpu.launch.cli``.
"""

from __future__ import annotations

import sys

from multigpu.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
