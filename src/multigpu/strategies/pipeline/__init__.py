"""The ``pipeline`` strategy: the model split by depth into stages across processes.

- ``strategy.py``: ``PipelineStrategy`` (setup, clipping, checkpoints, the bubble);
- ``plan.py``: where the model splits and what a schedule costs (pure functions of counts);
- ``trace.py``: tracing the model once (``torch.export``), with a refusal a user can act on;
- ``model.py``: ``PipelinedModel``, what setup hands back (this process's stages and schedule);
  imported only when a pipeline is set up (``torch.distributed.pipelining`` pulls in dynamo);
- ``shared_tensors.py``: a tensor several stages use kept as one (tied weights, a block run twice);
- ``optimizer_state.py``: the optimizer's state saved by parameter name, as every strategy saves it.
"""

from __future__ import annotations

from multigpu.strategies.pipeline.strategy import PipelineStrategy

__all__ = ["PipelineStrategy"]
