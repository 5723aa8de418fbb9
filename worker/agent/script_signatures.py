"""Failures users' own scripts end with, recognised in their log (after classify.SIGNATURES).

Each names the catalog code, what happened and what to change in the script. Order matters: a CUDA
error raised in a DataLoader worker is E001 even though its text also says CUDA is missing (E007).
"""

from __future__ import annotations

E007_FIX = (
    "this worker has no GPU: run the job on a GPU worker (resources.accelerator 'gpu'), or let the script "
    "choose its device, e.g. device = 'cuda' if torch.cuda.is_available() else 'cpu', backend 'gloo' without "
    "GPUs ($FLIGHTDECK_BACKEND says which), and no torch.cuda.set_device or .cuda() on a CPU worker"
)

# (log pattern, failure class (None: exit:<n>), code, what happened, fix): classify.py compiles them.
SCRIPT_SIGNATURES: tuple[tuple[str, str | None, str, str, str], ...] = (
    (
        r"The batch received was empty|Example keys: \[\]|num_samples should be a positive integer value, "
        r"but got num_samples=0",
        None,
        "D004",
        "the training data reached the loop empty (a dataset held in memory and pickled to each rank or "
        "DataLoader worker arrives without its rows, or no row kept the columns the model takes)",
        "build the dataset from files inside each process (load by path, e.g. datasets.load_dataset or "
        "reading the file in __getitem__'s dataset) instead of passing an in-memory object; with the HF "
        "Trainer keep the columns the collator needs (remove_unused_columns=False)",
    ),
    (
        r"in DataLoader worker process \d+[\s\S]{0,4000}?(CUDA|cuda|_cuda_)",
        None,
        "E001",
        "CUDA was used inside a DataLoader worker process (the collate function or dataset moves tensors "
        "to the GPU)",
        "keep collate and __getitem__ on the CPU and move the batch to the device in the training loop, "
        "or set num_workers=0",
    ),
    (
        r"Torch not compiled with CUDA enabled|_cuda_setDevice|Found no NVIDIA driver|"
        r"ProcessGroupNCCL is only supported with GPUs|NCCL is not available|"
        r"Distributed package doesn't have NCCL built in|No CUDA GPUs are available",
        None,
        "E007",
        "the script requires CUDA (a .cuda() call, torch.cuda.set_device or the NCCL backend) on a worker "
        "without GPUs",
        E007_FIX,
    ),
)
