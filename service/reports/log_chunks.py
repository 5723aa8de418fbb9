"""output.log in chunks: stored by byte offset (a re-sent chunk is the same row), read by cursor."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select

from flightdeck.contracts import (
    MAX_LOG_CHUNK_BYTES,
)
from flightdeck.service.core.db import Database
from flightdeck.service.core.sql import upsert
from flightdeck.service.core.tables import log_chunks
from flightdeck.service.reports.bad_report import BadReport


def store_log_chunk(
    db: Database,
    attempt_id: int,
    job_id: int,
    offset: int,
    text: str,
    length: int | None = None,
    node_rank: int = 0,
) -> None:
    """Keep file bytes [offset, offset + length); a resend from the same offset only ever extends it.

    `length` is the chunk's size in the agent's file; it differs from the UTF-8 text's size when
    the agent replaced undecodable bytes, and offsets must follow the file.
    """
    data = text.encode("utf-8", "replace")
    length = len(data) if length is None else length
    if len(data) > MAX_LOG_CHUNK_BYTES:
        raise BadReport(f"text: at most {MAX_LOG_CHUNK_BYTES} bytes per chunk; send smaller chunks")
    # Each file byte becomes at most 3 text bytes (an undecodable one becomes U+FFFD): a length outside
    # that range would move every later offset (a cursor of 2**63 once made the log unreadable).
    if not (len(data) + 2) // 3 <= length <= len(data):
        raise BadReport(
            f"length: {length} cannot be the file size of a {len(data)}-byte text; send the chunk's "
            "byte count in output.log"
        )
    stmt = upsert(db.dialect, log_chunks).values(
        attempt_id=attempt_id,
        node_rank=node_rank,
        offset=offset,
        job_id=job_id,
        length=length,
        data=data,
        time=time.time(),
    )
    with db.writing() as conn:
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["attempt_id", "node_rank", "offset"],
                set_={"data": stmt.excluded.data, "length": stmt.excluded.length},
                where=stmt.excluded.length > log_chunks.c.length,
            )
        )


def read_log(
    db: Database, attempt_id: int, offset: int, max_bytes: int, node_rank: int = 0
) -> dict[str, Any]:
    """Text from byte `offset` on (at most about `max_bytes`), and where the next read starts."""
    parts: list[bytes] = []
    position = offset
    c = log_chunks.c
    with db.reading() as conn:
        rows = conn.execute(
            select(c.offset, c.length, c.data)
            .where(c.attempt_id == attempt_id, c.node_rank == node_rank, c.offset + c.length > offset)
            .order_by(c.offset)
        )
        for chunk_offset, length, data in rows:
            if chunk_offset > position:
                break  # a gap: that part has not arrived yet
            parts.append(bytes(data) if chunk_offset == position else bytes(data)[position - chunk_offset :])
            position = chunk_offset + length
            if position - offset >= max_bytes:
                break
    return {"offset": offset, "next_offset": position, "text": b"".join(parts).decode("utf-8", "replace")}


def log_tail(db: Database, attempt_id: int, max_bytes: int) -> str:
    c = log_chunks.c
    with db.reading() as conn:
        end = conn.execute(
            select(func.max(c.offset + c.length)).where(c.attempt_id == attempt_id)
        ).scalar_one_or_none()
    end = int(end or 0)
    return str(read_log(db, attempt_id, max(0, end - max_bytes), max_bytes)["text"])
