"""Worker identities: the enrolment token registers a worker, and the answer holds that worker's own
token; every later worker call authenticates as that one worker.

Only the SHA-256 digest of a worker's token is stored (workers.token_hash). The service process keeps
digest -> worker id in memory, read from the table at the first lookup and kept current by registration
and revocation, which only this process writes.
"""

from __future__ import annotations

import secrets
import threading

from sqlmodel import col, select

from service.core.auth import digest
from service.core.db import Database
from service.models import Worker


class WorkerIdentities:
    def __init__(self, db: Database):
        self.db = db
        self._by_digest: dict[str, int] | None = None
        self._lock = threading.Lock()

    def _table(self) -> dict[str, int]:
        with self._lock:
            if self._by_digest is None:
                with self.db.read() as session:
                    rows = session.exec(
                        select(Worker.token_hash, Worker.id).where(col(Worker.token_hash).is_not(None))
                    ).all()
                self._by_digest = {
                    token_hash: worker_id
                    for token_hash, worker_id in rows
                    if token_hash is not None and worker_id is not None
                }
            return self._by_digest

    def worker_of(self, token: str) -> int | None:
        """The worker this token identifies, or None."""
        return self._table().get(digest(token))

    def issued(self, worker_id: int, token_hash: str | None, previous: str | None) -> None:
        """Record a worker's new digest (None: revoked), dropping its previous one."""
        table = self._table()
        with self._lock:
            if previous is not None:
                table.pop(previous, None)
            if token_hash is not None:
                table[token_hash] = worker_id


def new_worker_token() -> tuple[str, str]:
    """(token, its digest): the token is shown once, in the registration answer."""
    token = "fdw_" + secrets.token_urlsafe(32)
    return token, digest(token)
