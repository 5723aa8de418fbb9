"""A read of several statements sees one committed state, on both databases.

The live metrics stream reads a page key by key and moves its cursor to the page's last step. A batch
committed between two of those statements gave a page with some of a step's values, and the cursor
went past the rest for good: the dashboard's chart lost `eval_loss` at step 60 while `loss` was drawn.
Here the batch is committed by a real second connection exactly between the page's statements.

A job's detail is read the same way: the job, then its attempts, their nodes and step ranges. An
attempt that ends commits its row and its job's together, and a poll between the two reads showed a
job still running whose attempt had succeeded. The operators' gauges (GET /metrics) count jobs, then
running attempts: the same commit between them gave a scrape with a running job and no running attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from flightdeck.contracts import FinishReport
from flightdeck.service.attempt_endings import finish_attempt
from flightdeck.service.core.db import Database
from flightdeck.service.reports.metric_ingest import store_metrics
from flightdeck.service.reports.metric_reads import read_downsampled, read_steps
from tests.metric_store import ATTEMPT, JOB, running_job_database
from tests.service.factories import USER
from tests.service.test_worker_api import claim, submit


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with running_job_database(database_url) as database:
        yield database


def _send(db: Database, step: int, values: dict[str, float]) -> None:
    store_metrics(db, ATTEMPT, JOB, orjson.dumps({"points": [{"step": step, "values": values}]}))


def _once_before_the_first_select(
    db: Database, wanted: Callable[[str, Sequence[Any]], bool], commit: Callable[[], None]
) -> None:
    """Run `commit` (a write on another connection) just before the first SELECT that `wanted` picks
    by its text and parameters, once."""
    fired = False

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        nonlocal fired
        given = list(parameters.values() if isinstance(parameters, dict) else parameters or ())
        if fired or not statement.lstrip().upper().startswith("SELECT") or not wanted(statement, given):
            return
        fired = True  # first: the commit's own statements pass through here too
        commit()

    event.listen(db.engine, "before_cursor_execute", before)


def _commit_before_the_first_read_of(db: Database, key: str, step: int, values: dict[str, float]) -> None:
    """Store a batch from another connection just before the first SELECT about metric `key` (once)."""
    _once_before_the_first_select(db, lambda _, given: key in given, lambda: _send(db, step, values))


def test_a_page_of_steps_never_holds_part_of_a_step_committed_between_its_reads(db: Database) -> None:
    for step in range(60):
        _send(db, step, {"loss": 1.0, "grad_norm": 2.0})
    # The page reads the key names, then grad_norm's series, then loss's. The batch bringing step 60
    # with a new name commits between the names and the series.
    _commit_before_the_first_read_of(db, "grad_norm", 60, {"loss": 0.5, "grad_norm": 1.5, "eval_loss": 0.7})

    points, _ = read_steps(db, ATTEMPT, 59, 1000, None)

    # Either the whole step or none of it; the next page (from the same cursor) has it whole.
    assert points in ([], [{"step": 60, "values": {"eval_loss": 0.7, "grad_norm": 1.5, "loss": 0.5}}])
    later, _ = read_steps(db, ATTEMPT, 59, 1000, None)
    assert later == [{"step": 60, "values": {"eval_loss": 0.7, "grad_norm": 1.5, "loss": 0.5}}]


def test_a_page_read_key_by_key_holds_every_key_of_its_last_step(db: Database) -> None:
    for step in range(10):
        _send(db, step, {"loss": 1.0, "grad_norm": 2.0})
    # Between grad_norm's series and loss's: step 10 of both keys commits.
    _commit_before_the_first_read_of(db, "loss", 10, {"loss": 0.5, "grad_norm": 1.5})

    points, _ = read_steps(db, ATTEMPT, 9, 1000, None)

    assert points in ([], [{"step": 10, "values": {"grad_norm": 1.5, "loss": 0.5}}])


def test_the_downsampled_view_ends_on_a_step_whose_keys_are_all_there(db: Database) -> None:
    """The dashboard's live stream starts after the downsampled view's last step."""
    for step in range(10):
        _send(db, step, {"loss": 1.0, "grad_norm": 2.0})
    # After grad_norm's span and buckets were read: step 10 commits before loss's.
    _commit_before_the_first_read_of(db, "loss", 10, {"loss": 0.5, "grad_norm": 1.5})

    series = read_downsampled(db, ATTEMPT, None, 1000)["series"]

    assert {key: s["steps"][-1] for key, s in series.items()} in (
        {"grad_norm": 9, "loss": 9},
        {"grad_norm": 10, "loss": 10},
    )


def test_a_jobs_detail_shows_the_job_and_its_attempts_as_one_commit_left_them(
    client: TestClient, worker_id: int
) -> None:
    job_id = submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    served: Database = client.app.state.flightdeck.db  # type: ignore[attr-defined]
    # The attempt ends (its row and its job's, one commit) after the detail read the job, before it
    # reads the job's attempts.
    _once_before_the_first_select(
        served,
        lambda statement, _: "FROM attempts" in statement and "attempts.job_id =" in statement,
        lambda: finish_attempt(served, int(attempt["id"]), FinishReport(status="succeeded", exit_code=0)),
    )

    detail = client.get(f"/jobs/{job_id}", headers=USER).json()

    seen = (detail["status"], [a["status"] for a in detail["attempts"]])
    assert seen in (("running", ["running"]), ("succeeded", ["succeeded"])), seen
    again = client.get(f"/jobs/{job_id}", headers=USER).json()
    assert (again["status"], [a["status"] for a in again["attempts"]]) == ("succeeded", ["succeeded"])


def _gauge(scrape: str, name: str) -> float:
    return float(next(line.split()[-1] for line in scrape.splitlines() if line.startswith(f"{name} ")))


def test_a_scrape_counts_jobs_and_attempts_as_one_commit_left_them(
    client: TestClient, worker_id: int
) -> None:
    submit(client)
    attempt = claim(client, worker_id)
    assert attempt is not None
    served: Database = client.app.state.flightdeck.db  # type: ignore[attr-defined]
    # The attempt ends after the scrape counted the jobs by status, before it counts running attempts.
    _once_before_the_first_select(
        served,
        lambda statement, _: "FROM attempts WHERE status = 'running'" in statement,
        lambda: finish_attempt(served, int(attempt["id"]), FinishReport(status="succeeded", exit_code=0)),
    )

    scrape = client.get("/metrics").text

    counts = (
        _gauge(scrape, 'flightdeck_jobs{status="running"}'),
        _gauge(scrape, "flightdeck_running_attempts"),
    )
    assert counts in ((1.0, 1.0), (0.0, 0.0)), counts
