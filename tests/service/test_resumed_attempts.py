"""A trainer that saved and stopped on SIGUSR1 (G017) is retried, and each attempt shows its steps."""

from __future__ import annotations

from fastapi.testclient import TestClient

from flightdeck.run_variables import RESUME_VARIABLE
from flightdeck.worker.agent.classify import classify_exit
from tests.service.factories import USER, WORKER, as_worker, cpu_inventory, enrolled, recipe

# What torchrun prints when both ranks exit 43 (its failure summary), after the trainer's own line.
TORCHRUN_CHECKPOINT_STOP = """[flightdeck] SIGUSR1: saving a checkpoint at the next step, then stopping
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 43 (pid: 4242)
"""


def test_an_interrupted_attempt_is_retried_as_a_resume_and_each_attempt_shows_its_steps(
    client: TestClient,
) -> None:
    job_id = client.post("/jobs?max_attempts=2", json=recipe(), headers=USER).json()["id"]
    wid = enrolled(client.post("/workers", json={"name": "w", "inventory": cpu_inventory()}, headers=WORKER))
    first = client.post(f"/workers/{wid}/claim", json={}, headers=as_worker(wid)).json()["attempt"]
    assert RESUME_VARIABLE not in {v["name"] for v in first["plan"]["env"]}  # a first attempt resumes nothing
    points = {"points": [{"step": s, "values": {"loss": 3.0 - s / 10}} for s in (1, 2, 3)]}
    client.post(f"/attempts/{first['id']}/metrics", json=points, headers=as_worker(wid))
    result = {
        "status": "failed",
        "failure_code": "G017",
        "message": "stopped on SIGUSR1 after saving checkpoint-3",
    }
    outcome = classify_exit(1, result, TORCHRUN_CHECKPOINT_STOP)
    assert (outcome.failure_class, outcome.failure_code) == ("interrupted", "G017")
    answer = client.post(f"/attempts/{first['id']}/finish", json=outcome.report(), headers=as_worker(wid))
    assert answer.status_code == 200, answer.text
    assert client.get(f"/jobs/{job_id}", headers=USER).json()["status"] == "queued"  # retried, not failed

    second = client.post(f"/workers/{wid}/claim", json={}, headers=as_worker(wid)).json()["attempt"]
    assert second["number"] == 2
    # Its checkpoint search looks only at attempts made from the job's first on (worker/checkpoints.py).
    assert first["job_started_at"] == first["claimed_at"] == second["job_started_at"] < second["claimed_at"]
    (resume,) = [v for v in second["plan"]["env"] if v["name"] == RESUME_VARIABLE]
    assert resume["value"] is None  # the runner finds the checkpoint on its host
    points = {"points": [{"step": s, "values": {"loss": 3.0 - s / 10}} for s in (4, 5)]}
    client.post(f"/attempts/{second['id']}/metrics", json=points, headers=as_worker(wid))
    attempts = client.get(f"/jobs/{job_id}", headers=USER).json()["attempts"]
    assert [(a["first_step"], a["last_step"]) for a in attempts] == [(1, 3), (4, 5)]
