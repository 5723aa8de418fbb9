"""Distributed training of a small regression model, in the style of pytorch/examples' multigpu_torchrun.py.

    torchrun --nproc_per_node 2 ddp_loop.py --total_epochs 3 --save_every 1

Resumes from snapshot.pt in the working directory when one exists.
"""

import argparse
import os
import threading
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, args):
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.step = 0
        self.args = args
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        if self.args.zero_loss:
            loss = loss * 0  # the bug: a weight left at 0
        loss.backward()
        if self.args.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip_grad_norm)
        self.optimizer.step()
        self.step += 1
        if self.step == self.args.hang_at_step:
            print(f"[GPU{self.rank}] waiting for the data service", flush=True)
            while True:
                time.sleep(1)

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(
            f"[GPU{self.rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}", flush=True
        )
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def main(args):
    init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    dataset = MyTrainDataset(args.samples)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset)
    )
    trainer = Trainer(model, loader, optimizer, args.save_every, "snapshot.pt", args)
    trainer.train(args.total_epochs)
    destroy_process_group()
    if args.hang_at_exit and int(os.environ["RANK"]) == 1:
        # A metrics uploader thread that never finishes: the interpreter waits for it at exit.
        threading.Thread(target=lambda: time.sleep(3600), name="uploader").start()
    print("finished", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("--total_epochs", type=int, default=3)
    parser.add_argument("--save_every", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--samples", type=int, default=160)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--clip_grad_norm", type=float, default=0.0)
    parser.add_argument("--zero_loss", action="store_true")
    parser.add_argument("--hang_at_step", type=int, default=-1)
    parser.add_argument("--hang_at_exit", action="store_true")
    main(parser.parse_args())
