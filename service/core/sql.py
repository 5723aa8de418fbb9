"""The few SQL constructs whose spelling differs between SQLite and PostgreSQL, each defined once."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from itertools import chain
from typing import Any, NamedTuple

import orjson
from sqlalchemy import Connection, Table, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.sqlite.dml import OnConflictDoUpdate
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement
from sqlalchemy.types import Boolean, NullType


def upsert(dialect: str, table: Table) -> Any:
    """INSERT with ON CONFLICT (`.on_conflict_do_nothing()` / `.on_conflict_do_update()`) for the dialect.

    Both dialects spell the clause the same way in SQL; SQLAlchemy keeps it in per-dialect insert
    constructs, so the statement is built by the one that will run it.
    """
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


class greatest(FunctionElement[Any]):
    """The larger of two values: `greatest(a, b)` on PostgreSQL, two-argument `max(a, b)` on SQLite."""

    type = NullType()
    inherit_cache = True
    name = "greatest"

    def __init__(self, a: ColumnElement[Any], b: ColumnElement[Any]):
        super().__init__(a, b)


@compiles(greatest)
def _greatest_default(element: greatest, compiler: Any, **kw: Any) -> str:
    return f"greatest({compiler.process(element.clauses, **kw)})"


@compiles(greatest, "sqlite")
def _greatest_sqlite(element: greatest, compiler: Any, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


class not_among(FunctionElement[bool]):
    """`column` is none of the integer ids in `ids`, a JSON array parameter: one statement text whatever
    the count (an expanding IN list is a new statement per length). SQLite reads the array with
    json_each, PostgreSQL with json_array_elements_text."""

    type = Boolean()
    inherit_cache = True
    name = "not_among"

    def __init__(self, column: ColumnElement[Any], ids: ColumnElement[Any]):
        super().__init__(column, ids)


@compiles(not_among)
def _not_among_default(element: not_among, compiler: Any, **kw: Any) -> str:
    column, ids = (compiler.process(clause, **kw) for clause in element.clauses)
    return (
        f"{column} NOT IN (SELECT CAST(value AS INTEGER) FROM json_array_elements_text(CAST({ids} AS JSON)))"
    )


@compiles(not_among, "sqlite")
def _not_among_sqlite(element: not_among, compiler: Any, **kw: Any) -> str:
    column, ids = (compiler.process(clause, **kw) for clause in element.clauses)
    return f"{column} NOT IN (SELECT value FROM json_each({ids}))"


def many_rows_insert(dialect: str, table: Table, columns: Sequence[str]) -> Any:
    """An INSERT of many rows in one statement, to which the caller adds its ON CONFLICT or RETURNING
    clause.

    Run it with `execute_many_rows`, `columns` in the table's order (SQLite's parameters are positional,
    in that order; another order is refused). SQLite: `VALUES (?, ...)`, executed once per row by the
    driver (sqlite3 loops in C). PostgreSQL: `INSERT ... SELECT unnest(:a), unnest(:b), ...` with one
    array per column, so a thousand rows are one statement and one round trip (row by row through
    SQLAlchemy they cost 40 ms a batch, most of it building parameters).
    """
    if dialect == "postgresql":
        arrays = [
            func.unnest(bindparam(name, type_=postgresql.ARRAY(table.c[name].type))) for name in columns
        ]
        return postgresql.insert(table).from_select(list(columns), select(*arrays))
    return sqlite.insert(table).values({name: bindparam(name) for name in columns})


def many_rows_update(dialect: str, table: Table, columns: Sequence[str], match: Sequence[str]) -> Any:
    """An UPDATE of many rows in one statement: each row sets `columns` on the table's row whose `match`
    columns hold the row's values for them (named `match_<column>`, so a column can be both matched and
    set). Run it with `execute_many_rows`, each row's values in `many_rows_update_order` order; its
    rowcount is the number of stored rows changed.

    SQLite: one row's UPDATE, which the driver executes once per row. PostgreSQL: `UPDATE ... FROM
    (SELECT unnest(:a) AS a, ...) AS given WHERE <match>`, one statement for every row: a batch of 50
    claims changes its jobs in one statement instead of 50 sent in a pipeline (bench/README.md).
    """
    names = many_rows_update_order(columns, match)
    if dialect == "postgresql":
        types = {name: table.c[name.removeprefix("match_")].type for name in names}
        arrays = [
            func.unnest(bindparam(name, type_=postgresql.ARRAY(types[name]))).label(name) for name in names
        ]
        given = select(*arrays).subquery("given")
        return (
            update(table)
            .where(*[table.c[name] == given.c[f"match_{name}"] for name in match])
            .ordered_values(*[(table.c[name], given.c[name]) for name in columns])
        )
    return (
        update(table)
        .where(*[table.c[name] == bindparam(f"match_{name}") for name in match])
        # In `columns` order, not the table's: SQLite's parameters are positional.
        .ordered_values(*[(table.c[name], bindparam(name)) for name in columns])
    )


def many_rows_update_order(columns: Sequence[str], match: Sequence[str]) -> tuple[str, ...]:
    """The parameters of a `many_rows_update`, in the order of each row's values: the columns it sets,
    then the ones it matches (SQLite's positional order: SET before WHERE)."""
    return (*columns, *(f"match_{name}" for name in match))


def execute_many_rows(
    conn: Connection, stmt: Any, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> Ran:
    """Run a `many_rows_insert` or `many_rows_update` statement for `rows` (tuples in `columns` order):
    the rows its RETURNING clause gave (none without one) and the number of rows it wrote."""
    if not rows:
        return Ran([], 0)
    returning = bool(getattr(stmt, "_returning", None))
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        if conn.dialect.name == "postgresql":
            arrays = {name: [row[i] for row in rows] for i, name in enumerate(columns)}
            cursor.execute(_binary_arrays(stmt, conn.dialect), arrays)
            found = [tuple(row) for row in cursor.fetchall()] if returning else []
            return Ran(found, int(cursor.rowcount))
        one_row = _driver_sql(stmt, conn.dialect, tuple(columns))
        if returning:
            # sqlite3's executemany returns no rows; in-process, a row at a time costs no round trip.
            found, written = [], 0
            for row in rows:
                cursor.execute(one_row, row)
                found += [tuple(returned) for returned in cursor.fetchall()]
                written += cursor.rowcount
            return Ran(found, written)
        # The driver takes plain tuples: SQLAlchemy's per-row parameter handling was most of a batch's cost.
        # An INSERT's full chunks go as one multi-row statement each (about 20% cheaper than a row at a
        # time), the rest through executemany; rowcount counts the rows each wrote. An upsert stays row
        # by row: as multi-row statements the rollups' cost 4-7% more a batch (bench/README.md).
        written, whole = 0, 0
        if stmt.is_insert and not isinstance(getattr(stmt, "_post_values_clause", None), OnConflictDoUpdate):
            chunk_sql = _chunk_sql(one_row, len(columns), SQLITE_CHUNK_ROWS)
            whole = len(rows) - len(rows) % SQLITE_CHUNK_ROWS
            for start in range(0, whole, SQLITE_CHUNK_ROWS):
                chunk = rows[start : start + SQLITE_CHUNK_ROWS]
                cursor.execute(chunk_sql, list(chain.from_iterable(chunk)))
                written += cursor.rowcount
        if whole < len(rows):
            cursor.executemany(one_row, rows[whole:])
            written += cursor.rowcount
        return Ran([], written)
    finally:
        cursor.close()


def _binary_arrays(stmt: Any, dialect: Any) -> str:
    """The statement's SQL with each array sent in binary (`%(name)b`): psycopg writes a text array
    element by element with a quoting check each, 1.9 ms for a 1,000-row batch's six arrays against
    0.8 ms in binary (the whole insert: 6.2 -> 4.9 ms)."""
    sql, _, _ = _compiled(stmt, dialect)
    return re.sub(r"%\((\w+)\)s", r"%(\1)b", sql)


def copy_new_rows(
    conn: Connection, table: Table, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> bool:
    """PostgreSQL: COPY `rows` into `table` when none of their keys is stored yet; False, having written
    nothing, when one is (the caller then inserts with ON CONFLICT, which keeps the stored rows).

    For metric points, nearly always new: COPY wrote a 1,000-point batch in 2.9 ms against 6.2 ms for
    the `unnest` INSERT (both with the (attempt, key, step) key checked). A savepoint holds the COPY,
    so a duplicate undoes only it.
    """
    from psycopg.errors import UniqueViolation  # PostgreSQL's driver; SQLite never comes here

    types = _column_types(conn, table.name)
    sql = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
    try:
        with conn.begin_nested():
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                with cursor.copy(sql) as copy:
                    copy.set_types([types[name] for name in columns])
                    for row in rows:
                        copy.write_row(row)
            finally:
                cursor.close()
    except UniqueViolation:
        return False
    return True


_TYPES: dict[str, dict[str, str]] = {}


def _column_types(conn: Connection, table: str) -> dict[str, str]:
    """A table's columns' PostgreSQL type names (int4, varchar, float8...), which binary COPY needs:
    read once from the database itself, so they follow the migrations."""
    found = _TYPES.get(table)
    if found is None:
        query = (
            "SELECT column_name, udt_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %(t)s"
        )
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(query, {"t": table})
            found = _TYPES[table] = {name: udt for name, udt in cursor.fetchall()}
        finally:
            cursor.close()
    return found


# Rows per multi-row statement on SQLite. Measured on 1,000-point metric batches, each size against
# 250 in the same process (bench/README.md): 125 and 50 rows cost 5% less a batch, 20 rows 6% less,
# 10 rows the same, 1,000 rows 5% more.
SQLITE_CHUNK_ROWS = 50


def _driver_sql(stmt: Any, dialect: Any, columns: tuple[str, ...]) -> str:
    """The statement's SQL for one row, its parameters checked to be in `columns` order."""
    one_row, positions, _ = _compiled(stmt, dialect)
    if list(positions) != list(columns):
        raise ValueError(f"parameters {positions} are not in the order {columns}")
    return one_row


@functools.lru_cache(maxsize=64)
def _chunk_sql(one_row: str, columns: int, rows: int) -> str:
    # many_rows_insert wrote the one VALUES group itself, so it is this exact text, once.
    group = "(" + ", ".join("?" * columns) + ")"
    if one_row.count(f"VALUES {group}") != 1:
        raise ValueError(f"unexpected VALUES clause in {one_row[:200]}")
    return one_row.replace(f"VALUES {group}", "VALUES " + ", ".join([group] * rows))


_COMPILED: dict[tuple[int, str], tuple[Any, str, tuple[str, ...], dict[str, Any]]] = {}


def _compiled(stmt: Any, dialect: Any) -> tuple[str, tuple[str, ...], dict[str, Any]]:
    """A statement's SQL for `dialect`, its positional parameter names (qmark) and its own literals,
    compiled once per statement object (the hot paths build theirs once)."""
    key = (id(stmt), dialect.name)
    found = _COMPILED.get(key)
    if found is None or found[0] is not stmt:
        # render_postcompile: IN (...) lists are written out, as SQLAlchemy would at execution.
        compiled = stmt.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
        found = _COMPILED[key] = (
            stmt,
            str(compiled),
            tuple(compiled.positiontup or ()),
            dict(compiled.params),
        )
    return found[1], found[2], found[3]


class Ran(NamedTuple):
    """What a statement run by `run_compiled` returned: its rows (RETURNING or SELECT) and rowcount."""

    rows: list[tuple[Any, ...]]
    rowcount: int

    def first(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


def run_compiled(conn: Connection, stmt: Any, params: dict[str, Any]) -> Ran:
    """Run a Core statement on the driver's cursor, compiled once per statement.

    For the claim's reads, which run thousands of times a second under load: SQLAlchemy's
    per-execution work (about 80 us a statement) was most of a claim's cost. The statement is still
    built and compiled by SQLAlchemy for the connection's dialect; only the execution is the driver's.
    Parameters are not converted: JSON values must be passed as JSON text, and JSON results come back
    as the driver returns them (see `json_value`). Many rows are written with `execute_many_rows`.
    """
    sql, positions, defaults = _compiled(stmt, conn.dialect)
    values = {**defaults, **params}  # the statement's own literals, then the call's values
    # qmark (sqlite3) takes a tuple in the compiled order; pyformat (psycopg) takes the names.
    bound = tuple(values[name] for name in positions) if positions else values
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql, bound)
        rows = [tuple(row) for row in cursor.fetchall()] if cursor.description else []
        return Ran(rows, cursor.rowcount)
    finally:
        cursor.close()


def json_value(raw: Any) -> Any:
    """A JSON column's value read through `run_compiled`: text on SQLite, decoded already by psycopg."""
    return orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
