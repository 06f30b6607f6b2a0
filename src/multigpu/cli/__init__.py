"""The ``multigpu`` command line: every subcommand's parser and the entry point (``cli.main``).

It sits on top of everything (launcher, diagnostics, checkpoint tools) and nothing imports it
(an import-linter contract keeps it so).
"""
