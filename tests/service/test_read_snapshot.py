"""A read of several statements sees one committed state, on both databases.

The live metrics stream reads a page key by key and moves its cursor to the page's last step. A batch
committed between two of those statements gave a page with some of a step's values, and the cursor
went past the rest for good: the dashboard's chart lost `eval_loss` at step 60 while `loss` was drawn.
Here the batch is committed by a real second connection exactly between the page's statements.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from sqlalchemy import event

from flightdeck.service.core.db import Database
from flightdeck.service.reports.metric_ingest import store_metrics
from flightdeck.service.reports.metric_reads import read_downsampled, read_steps
from tests.metric_store import ATTEMPT, JOB, running_job_database


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    with running_job_database(database_url) as database:
        yield database


def _send(db: Database, step: int, values: dict[str, float]) -> None:
    store_metrics(db, ATTEMPT, JOB, orjson.dumps({"points": [{"step": step, "values": values}]}))


def _commit_before_the_first_read_of(db: Database, key: str, step: int, values: dict[str, float]) -> None:
    """Store a batch from another connection just before the first SELECT about metric `key` (once)."""
    fired = False

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        nonlocal fired
        given = parameters.values() if isinstance(parameters, dict) else parameters or ()
        if fired or not statement.lstrip().upper().startswith("SELECT") or key not in given:
            return
        fired = True  # first: the batch's own statements pass through here too
        _send(db, step, values)

    event.listen(db.engine, "before_cursor_execute", before)


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
