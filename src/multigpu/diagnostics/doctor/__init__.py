"""``multigpu doctor``: real checks of this machine (and of every node of a launched job).

Each check looks at something that breaks distributed training and yields rows of OK / WARN /
FAIL / SKIP, every non-OK row with a one-line fix; then a short all-reduce proves the process
group works and measures its bus bandwidth. Run under ``multigpu run`` on several nodes, every
rank gathers every rank's versions and facts and rank 0 compares them.

Modules, one concept each:

- ``checks``: the ``Check`` row, statuses, summary counts and the exit code;
- ``render``: the rich table and the JSON document;
- ``system``: Python/torch/multigpu versions, torch's build and backends, cores and threads,
  ``/dev/shm``;
- ``cuda``: CUDA runtime, NVIDIA driver and NCCL (CUDA facts come from a child process);
- ``gpu_checks``: GPUs (free memory, utilisation, processes) and the links between them;
- ``network``: interfaces, MTUs, ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``;
- ``rendezvous``: the launch environment detected, hostname, ``MASTER_ADDR``, the port;
- ``probe``: the all-reduce (``multigpu bench comm``'s machinery, or across launched ranks);
- ``ranks``: the multi-rank mode and the cross-node comparison;
- the command line, ``doctor_main(argv)``, is ``multigpu.cli.doctor``.

This package imports nothing itself, so a worker loading one module does not load the others.

Environment variables read: none here (see the modules).
"""
