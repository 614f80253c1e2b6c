"""Wakes the watchers of a job when its record changes."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class JobEvents:
    def __init__(self) -> None:
        self._watchers: defaultdict[str, set[asyncio.Event]] = defaultdict(set)

    def publish(self, job_id: str) -> None:
        for event in self._watchers.get(job_id, ()):
            event.set()

    def watched(self, job_id: str) -> bool:
        """Whether someone watches the job now (a client following it)."""
        return bool(self._watchers.get(job_id))

    @contextmanager
    def subscribe(self, job_id: str) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self._watchers[job_id].add(event)
        try:
            yield event
        finally:
            self._watchers[job_id].discard(event)
            if not self._watchers[job_id]:
                del self._watchers[job_id]
