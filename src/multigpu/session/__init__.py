"""The worker's session: ``init()`` (``initialize``), the ``Context`` it returns (``context``,
with ``context_comm``, ``context_checkpoints``, ``context_metering``), the step control behind
``ctx.backward`` (``training``), auto's memory check (``rank_memory``) and the metrics that
ask the live Context (``metrics``). The public names are ``multigpu``'s own; nothing is
imported here.
"""
