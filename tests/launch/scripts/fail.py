"""A torchrun script whose rank 1 fails: the launcher must exit with 1 and torch's summary."""

import os
import sys

if os.environ["RANK"] == "1":
    sys.exit("rank 1 fails on purpose")
