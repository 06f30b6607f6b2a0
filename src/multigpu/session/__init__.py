"""The worker's session: ``init()`` (``initialize``), the ``Context`` it returns (``context``, one
class in one file), the step control behind
``ctx.backward`` (``training``), auto's memory check (``rank_memory``) and the metrics that
ask the live Context (``metrics``). The public names are ``multigpu``'s own; nothing is
imported here.
"""
