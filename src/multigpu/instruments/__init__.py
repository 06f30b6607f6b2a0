"""What attaches to a Context through ``hooks.Hook`` without the Context importing it.

The worker sides of ``multigpu verify`` (``verify_record``) and ``multigpu bench scaling``
(``bench_record``), ``--profile``'s window (``profile_record``), the hang tools (``hang/``) and the
experiment trackers (``tracking/``). ``init()`` chooses them from the launcher's variables
(``multigpu.session.initialize``); the command sides live in ``multigpu.diagnostics``, above the
launcher, and read what these write. Nothing is imported here.
"""
