"""Users' scripts' failures classified from their logs: the logs are what torch itself prints, made by
running each mistake for real in a subprocess (CPU-only torch, as on a CPU worker)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flightdeck.inventory import GpuInfo, WorkerInventory
from flightdeck.recipe import parse_recipe
from flightdeck.worker.agent.classify import classify_exit
from flightdeck.worker.host_preflight.cuda_on_cpu import cuda_on_cpu_findings

MISTAKES = {
    # R1's E001 in a script: the collate function moves the batch to the GPU inside a loader worker.
    "E001": "import torch\n"
    "loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4, num_workers=1,\n"
    "    collate_fn=lambda b: torch.tensor(b).cuda())\n"
    "next(iter(loader))\n",
    "E007-set-device": "import torch\ntorch.cuda.set_device(0)\n",
    "E007-cuda": "import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n",
    "E007-nccl": "import torch.distributed as dist\ndist.init_process_group('nccl')\n",
    # R3's empty dataset: the sampler of a dataset that arrived with no rows.
    "D004": "import torch\nlist(torch.utils.data.DataLoader([], shuffle=True))\n",
}


def _logs(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561"}
    env.update(RANK="0", WORLD_SIZE="1")
    started = {}
    for name, code in MISTAKES.items():
        script = tmp_path / f"{name}.py"
        script.write_text(code)
        started[name] = subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return {name: proc.communicate(timeout=120)[0] for name, proc in started.items()}


@pytest.mark.slow  # five real torch processes
def test_cuda_and_empty_data_mistakes_in_scripts_get_their_codes(tmp_path: Path) -> None:
    logs = _logs(tmp_path)
    for name, log in logs.items():
        outcome = classify_exit(1, None, log)
        assert (outcome.status, outcome.failure_class) == ("failed", "exit:1"), (name, log)
        assert outcome.failure_code == name.split("-")[0], (name, outcome.message, log)
    e007 = classify_exit(1, None, logs["E007-set-device"])
    assert "no GPU" in (e007.fix or "") and "gloo" in (e007.fix or "")
    assert "num_workers=0" in (classify_exit(1, None, logs["E001"]).fix or "")


@pytest.mark.slow  # imports transformers in a subprocess for one real error
def test_the_hf_trainers_empty_batch_error_is_d004() -> None:
    from transformers import Trainer

    # The message as transformers raises it (its f-string's fixed head, read from the installed source).
    source = inspect.getsource(Trainer._prepare_inputs)
    head = source.split('"The batch received was empty')[1].split('"')[0]
    log = (
        f"ValueError: The batch received was empty{head}training dataset contains keys expected by the model"
    )
    assert classify_exit(1, None, log).failure_code == "D004"


def test_a_script_hard_coding_cuda_gets_an_e007_warning_on_a_cpu_worker_only(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "import torch\n# model.cuda() is what we did before\n"
        "torch.cuda.set_device(local_rank)\nx = x.cuda(non_blocking=True)\n"
    )
    (tmp_path / "portable.py").write_text(
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        'init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")\n'
    )
    cpu = WorkerInventory(cpu_slots=2, cores=4, workspace=str(tmp_path))
    gpu = WorkerInventory(
        gpus=[GpuInfo(index=0, name="NVIDIA H100", memory_mb=81559)], workspace=str(tmp_path)
    )
    gpu_recipe = parse_recipe({"name": "s", "entrypoint": {"script": "train.py"}})
    (finding,) = cuda_on_cpu_findings(gpu_recipe, cpu, tmp_path)
    assert (finding.code, finding.severity, finding.path) == ("E007", "warn", "entrypoint.script")
    assert "line 3" in finding.message and "line 4" in finding.message and "line 2" not in finding.message
    assert cuda_on_cpu_findings(gpu_recipe, gpu, tmp_path) == []
    portable = parse_recipe({"name": "s", "entrypoint": {"script": "portable.py"}})
    assert cuda_on_cpu_findings(portable, cpu, tmp_path) == []
