"""Diagnostics run from the command line: ``multigpu verify`` (world-size invariance),
``multigpu doctor`` (``diagnostics.doctor``) and ``multigpu bench`` (``diagnostics.bench``).

Nothing in the library imports this package: it starts workers as subprocesses
(``python -m multigpu run``) and reads what they recorded, so it never imports the training side.
"""
