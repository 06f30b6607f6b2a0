"""SyncBatchNorm on every device: torch's on GPUs, ours (gloo all-reduce) on CPUs.

torch's ``nn.SyncBatchNorm`` refuses CPU tensors, and DDP refuses to wrap it on CPU ("only work
with GPU modules"), so on CPU processes the same statistics are computed with a differentiable
all-reduce: the batch mean over every rank first, then the variance around it (two passes, as
exact as BatchNorm on the whole batch). In eval mode nothing is synchronised: the running
statistics are used, as in BatchNorm.

The differentiable all-reduce is ours (``SumAcrossRanks``, on the public ``dist.all_reduce``):
``torch.distributed.nn.functional.all_reduce`` warns (FutureWarning) on every call since torch
2.6 and points to a private module.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Function


class SumAcrossRanks(Function):
    """Sum a tensor over every rank of the default group, differentiably.

    The gradient of a sum every rank computes is the sum of every rank's gradient: the backward
    is the same all-reduce.
    """

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        summed = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(summed)
        return summed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return SumAcrossRanks.apply(grad)


class CPUSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics cover the global batch of every rank (any device).

    Deliberately not a subclass of ``nn.SyncBatchNorm``: DDP rejects that class on CPU.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        synced = (
            self.training
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
        )
        if not synced:
            return super().forward(input)
        dims = [0, *range(2, input.dim())]
        shape = [1, -1] + [1] * (input.dim() - 2)
        local_count = torch.tensor(
            [input.numel() / input.size(1)], dtype=input.dtype, device=input.device
        )
        first = SumAcrossRanks.apply(torch.cat([input.sum(dims), local_count]))
        count = first[-1]
        mean = first[:-1] / count
        centred = input - mean.reshape(shape)
        var = SumAcrossRanks.apply(centred.pow(2).sum(dims)) / count
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), count.detach())
        out = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out

    def _update_running_stats(
        self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor
    ) -> None:
        running_mean, running_var = self.running_mean, self.running_var
        tracked = self.num_batches_tracked
        if running_mean is None or running_var is None or tracked is None:
            return
        tracked.add_(1)
        # momentum=None: a cumulative moving average, as BatchNorm does.
        factor = 1.0 / float(tracked) if self.momentum is None else self.momentum
        unbiased = var * count / (count - 1).clamp(min=1)
        running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        running_var.mul_(1 - factor).add_(unbiased, alpha=factor)


def convert_sync_batchnorm(module: nn.Module, device: torch.device) -> nn.Module:
    """Replace every BatchNorm layer of ``module`` by one synchronised over the process group.

    On CUDA this is ``nn.SyncBatchNorm.convert_sync_batchnorm``; elsewhere ``CPUSyncBatchNorm``
    with the same parameters and buffers (the layer objects are replaced, the values kept).

    Example:
        >>> net = convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(3)), torch.device("cpu"))
        >>> type(net[0]).__name__
        'CPUSyncBatchNorm'
    """
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return _convert_cpu(module)


def _convert_cpu(module: nn.Module) -> nn.Module:
    converted = module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, CPUSyncBatchNorm
    ):
        converted = CPUSyncBatchNorm(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
        )
        if module.affine:
            with torch.no_grad():
                converted.weight = module.weight
                converted.bias = module.bias
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
    for name, child in module.named_children():
        converted.add_module(name, _convert_cpu(child))
    return converted
