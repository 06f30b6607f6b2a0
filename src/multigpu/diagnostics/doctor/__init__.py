"""``multigpu doctor``: real checks of this machine (and of every node of a launched job).

Each check looks at something that breaks distributed training and yields rows of OK / WARN /
FAIL / SKIP (``checks``), every non-OK row with a one-line fix; then a short all-reduce
(``collective``) proves the process group works and measures its bus bandwidth. Run under
``multigpu run`` on several nodes, every rank gathers every rank's versions and facts and rank 0
compares them (``collective.run_ranks``). The checks are in ``system`` (versions, threads,
/dev/shm), ``cuda`` (and the GPUs) and ``network`` (interfaces, the launch environment, the
rendezvous port); ``checks`` also prints them; the command line is ``multigpu.cli.doctor``.

This package imports nothing itself, so a worker loading one module does not load the others.
"""
