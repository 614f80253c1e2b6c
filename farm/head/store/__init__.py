"""The head's state in SQLite (WAL), so that an accepted job survives the head: one Store over one connection,
made of parts by what each keeps — nodes (nodes.py), jobs with their shards and logs (jobs.py), the rows a job
skipped because they do not read (skipped.py), an ended job run again for its missing rows (retries.py), join tokens
(tokens.py), the tuner's winners the farm shares (winners.py), and the reads calibration and the dashboard make of
finished shards (calibration.py).

All calls happen on the head's event-loop thread; each is a short transaction.
"""

from __future__ import annotations

from farm.head.store.calibration import CalibrationRecords, NodeWork
from farm.head.store.jobs import Job
from farm.head.store.nodes import NodeRecords
from farm.head.store.retries import RetryRecords
from farm.head.store.skipped import SkippedRecords
from farm.head.store.tokens import TokenRecords
from farm.head.store.winners import WinnerRecords

__all__ = ["Job", "NodeWork", "Store"]


class Store(TokenRecords, NodeRecords, SkippedRecords, RetryRecords, CalibrationRecords, WinnerRecords):
    pass
