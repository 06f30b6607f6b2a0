"""What the launcher and the workers both import: no training code, no CUDA, no strategies.

The names a user may set (``variables``, ``settings``), the typed command-line pieces
(``choices``, ``arguments``, ``run_target``), the files and locks written safely (``atomic_file``,
``lock_probe``), the network facts (``host``, ``store_listen``, ``store_reach``), how a worker
reports its end to the launcher (``worker_error``, ``worker_exit``, ``quick_exit``), and the
torch-free halves of what the workers build on (``mesh_spec`` beside ``mesh``, ``tracker_names``
for ``multigpu.instruments.tracking``, ``profile_window``). Nothing is imported here, so that
importing one of them costs only that one.
"""
