import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import multigpu

with multigpu.init(seed=0) as ctx:  # reads torchrun / SLURM / MPI variables, or runs alone
    data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = ctx.setup(model, optimizer)  # to this rank's device, wrapped in DDP
    loader = ctx.loader(data, batch_size=256)  # GLOBAL batch; sharded; batches on ctx.device
    for epoch in range(3):  # each pass is a new epoch, reshuffled: no set_epoch
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            ctx.backward(loss)
            optimizer.step()
        ctx.print(f"epoch {epoch} loss {ctx.all_reduce(loss.item()):.4f}")  # rank 0 prints
    if ctx.is_main:
        torch.save(ctx.unwrap(model).state_dict(), "model.pt")  # no "module." prefix
