"""DDP over 2 gloo ranks, set up and torn down again and again, each time as a script's main() ends:
the group destroyed (as trainer.end() or a loop's last line does), then the DDP model dropped, so the
model's Reducer holds the group's last reference and its destructor runs right after a collective.

Usage: python -m torch.distributed.run --nproc_per_node 2 ddp_cycles.py CYCLES DONE_DIR
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

rank = int(os.environ["RANK"])
store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 2, rank == 0)


def main(cycle: int) -> None:
    dist.init_process_group("gloo", store=dist.PrefixStore(f"cycle{cycle}", store), rank=rank, world_size=2)
    model = DistributedDataParallel(torch.nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    gathered = [torch.zeros(1) for _ in range(2)]
    dist.all_gather(gathered, torch.ones(1))
    dist.barrier()
    dist.destroy_process_group()


for cycle in range(int(sys.argv[1])):
    main(cycle)
with open(f"{sys.argv[2]}/cycles-rank{rank}.txt", "w") as done:
    done.write(sys.argv[1])
