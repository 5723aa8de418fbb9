"""Many rows in one statement (service/core/sql.py), on both databases: each row lands on its own
stored row, RETURNING maps rows back, and a guard column can be both matched and set."""

from __future__ import annotations

import orjson
import pytest
from sqlalchemy import text

from flightdeck.service.core.db import Database
from flightdeck.service.core.sql import (
    execute_many_rows,
    json_value,
    many_rows_insert,
    many_rows_update,
    many_rows_update_order,
)
from flightdeck.service.core.tables import events, jobs
from tests.service.test_claims import _jobs

EVENT_COLUMNS = ("job_id", "attempt_id", "kind", "severity", "message", "data", "time")


def test_an_insert_of_many_rows_returns_what_each_row_stored(database: Database) -> None:
    [job] = _jobs(database, 1)
    stmt = many_rows_insert(database.dialect, events, EVENT_COLUMNS).returning(events.c.message, events.c.id)
    rows = [
        (job, None, "status", "info", f"row {i}", orjson.dumps({"i": i}).decode(), float(i)) for i in range(5)
    ]
    with database.writing() as conn:
        written = execute_many_rows(conn, stmt, EVENT_COLUMNS, rows)
    assert written.rowcount == 5 and sorted(m for m, _ in written.rows) == [f"row {i}" for i in range(5)]
    with database.reading() as conn:
        stored = conn.execute(text("SELECT id, message, data, time FROM events WHERE kind = 'status'")).all()
    by_id = {row[0]: row[1:] for row in stored}
    for message, event_id in written.rows:
        i = int(message.split()[1])
        stored_message, data, time = by_id[event_id]
        assert (stored_message, time) == (message, float(i))
        assert json_value(data) == {"i": i}  # decoded by psycopg, text from SQLite


def test_an_update_of_many_rows_changes_only_the_rows_that_match(database: Database) -> None:
    """Each row sets its own values on the job whose id and status it names; a row whose job holds
    another status changes nothing, and rowcount says how many changed."""
    first, second, other = _jobs(database, 3)
    columns = ("status", "worker_name", "last_step")
    stmt = many_rows_update(database.dialect, jobs, columns, ("id", "status"))
    order = many_rows_update_order(columns, ("id", "status"))
    assert order == ("status", "worker_name", "last_step", "match_id", "match_status")
    rows = [
        ("running", "w-1", None, first, "queued"),
        ("running", "w-2", 7, second, "queued"),
        ("running", "w-3", 9, other, "cancelled"),  # the job is queued: no match
    ]
    with database.writing() as conn:
        assert execute_many_rows(conn, stmt, order, rows).rowcount == 2
    with database.reading() as conn:
        stored = conn.execute(text("SELECT id, status, worker_name, last_step FROM jobs ORDER BY id")).all()
    assert [tuple(row) for row in stored] == [
        (first, "running", "w-1", None),
        (second, "running", "w-2", 7),
        (other, "queued", None, None),
    ]


def test_parameters_out_of_the_statements_order_are_refused_on_sqlite(database: Database) -> None:
    """SQLite's parameters are positional: values given in another order than the statement's would be
    stored in the wrong columns, so the order is checked."""
    if database.dialect != "sqlite":
        pytest.skip("SQLite only: PostgreSQL's arrays are passed by name")
    [job] = _jobs(database, 1)
    stmt = many_rows_insert(database.dialect, events, EVENT_COLUMNS)
    shuffled = ("attempt_id", "job_id", *EVENT_COLUMNS[2:])
    with pytest.raises(ValueError, match="not in the order"), database.writing() as conn:
        execute_many_rows(conn, stmt, shuffled, [(None, job, "status", "info", "m", "{}", 0.0)])
