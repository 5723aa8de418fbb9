"""Wakes long-polling claims the moment a job becomes claimable."""

from __future__ import annotations

import asyncio


class QueueWakeup:
    """An asyncio event that threads may fire; each firing wakes every current waiter once."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event = asyncio.Event()
        # Set when the server begins to stop: long-polls answer at once and streams end, so none is
        # still open (and cancelled with a traceback, the client seeing a 500) when the grace runs out.
        self.stopping = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def current(self) -> asyncio.Event:
        """Take this before looking at the queue, so a job queued in between is never missed."""
        return self._event

    def notify(self) -> None:
        """Thread-safe: called from the request threads that queue jobs."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._fire)

    def stop(self) -> None:
        """Thread-safe: the server is shutting down; wake every waiter for good."""
        self.stopping = True
        self.notify()

    def _fire(self) -> None:
        fired, self._event = self._event, asyncio.Event()
        fired.set()
