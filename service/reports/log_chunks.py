"""output.log in chunks: stored by byte offset (a re-sent chunk is the same row), read by cursor."""

from __future__ import annotations

import time
from typing import Any

from service.contracts import (
    MAX_LOG_CHUNK_BYTES,
)
from service.core.db import Database
from service.reports.bad_report import BadReport


def store_log_chunk(
    db: Database, attempt_id: int, job_id: int, offset: int, text: str, length: int | None = None
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
    with db.raw_write() as conn:
        conn.execute(
            'INSERT INTO log_chunks (attempt_id, "offset", job_id, length, data, time) VALUES (?, ?, ?, ?, ?, ?) '
            'ON CONFLICT (attempt_id, "offset") DO UPDATE SET data = excluded.data, length = excluded.length '
            "WHERE excluded.length > log_chunks.length",
            (attempt_id, offset, job_id, length, data, time.time()),
        )


def read_log(db: Database, attempt_id: int, offset: int, max_bytes: int) -> dict[str, Any]:
    """Text from byte `offset` on (at most about `max_bytes`), and where the next read starts."""
    parts: list[bytes] = []
    position = offset
    with db.raw_read() as conn:
        rows = conn.execute(
            'SELECT "offset", length, data FROM log_chunks WHERE attempt_id = ? AND "offset" + length > ? '
            'ORDER BY "offset"',
            (attempt_id, offset),
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
    with db.raw_read() as conn:
        row = conn.execute(
            'SELECT max("offset" + length) FROM log_chunks WHERE attempt_id = ?', (attempt_id,)
        ).fetchone()
    end = int(row[0] or 0)
    return str(read_log(db, attempt_id, max(0, end - max_bytes), max_bytes)["text"])
