"""The launcher: plans a launch and runs it on top of torch.distributed.run (the command line
that calls it is ``multigpu.cli``).

Only errors, log, env, host, gpus and torch.distributed.run are imported from here (an
import-linter contract keeps it so); nothing in the library imports launch/.

Environment variables read: see ``multigpu.launch.run``.
"""
