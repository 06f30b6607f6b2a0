"""``multigpu bench``: collective bandwidth (``bench comm``) and scaling (``bench scaling``).

Like ``multigpu verify``, it starts real workers through the launcher (``python -m multigpu
run``) and reads what they wrote; the workers are ``multigpu.diagnostics.bench.comm_worker``
(collectives) and the user's script recorded by ``multigpu.instruments.bench_record`` (training
steps). The entry point is ``multigpu.cli.bench.bench_main``; this package imports nothing
itself, so a worker loading one of its modules does not load the others.
"""
