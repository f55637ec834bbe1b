"""SQLite backend of the metadata store (embedded, one node).

WAL journal mode with ``synchronous=FULL``: a transaction that returned from COMMIT survives a
power loss. The blocking sqlite3 calls run in a worker thread (``asyncio.to_thread``); one
transaction runs at a time.

A database file serves one process: its image is that process's alone, so a second broker on
the same file would check its changes against stale state and overwrite the first's. The file
is locked (``flock``) while the store is open, and a second opener is refused.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any, Self

from storage.metadata import sql
from storage.metadata.image import MetadataImage
from storage.metadata.records import Record
from storage.metadata.store import Condition


class StoreInUseError(RuntimeError):
    """Another process has the database file open as its metadata store."""


class SQLiteStore:
    """A metadata store in one SQLite database file (or in memory, for tests)."""

    def __init__(self, conn: sqlite3.Connection, lock_fd: int | None = None) -> None:
        self._conn = conn
        self._lock_fd = lock_fd  # held open: the file's flock lasts as long as the store
        # The connection crosses worker threads; never let two of them use it at once.
        self._lock = threading.Lock()

    @classmethod
    async def open(cls, path: str) -> Self:
        """Open (creating if needed) the database at ``path``, or ``:memory:``."""
        return cls(*await asyncio.to_thread(_connect, path))

    async def load(self) -> MetadataImage:
        return await asyncio.to_thread(self._load)

    async def persist(self, records: Sequence[Record], condition: Condition | None = None) -> None:
        if condition is not None:
            raise ValueError("a condition on other rows needs the shared (PostgreSQL) store")
        await asyncio.to_thread(self._persist, list(records))

    async def catch_up(self) -> list[list[Record]]:
        return []  # this process is the only writer

    async def wait_for_change(self) -> None:
        await asyncio.Event().wait()  # nobody else writes: never

    def snapshot_due(self) -> bool:
        return False  # the tables are the state: nothing to replay

    async def write_snapshot(self, image: MetadataImage) -> None:
        return None

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    def _load(self) -> MetadataImage:
        with self._lock:
            rows = {
                name: self._conn.execute(query).fetchall()
                for name, query in sql.LOAD_QUERIES.items()
            }
        return sql.image_from_rows(rows)

    def _persist(self, records: list[Record]) -> None:
        with self._lock:
            cursor = self._conn.cursor()
            # IMMEDIATE takes the write lock now rather than at the first write.
            cursor.execute("BEGIN IMMEDIATE")
            try:
                for record in records:
                    for statement, params in sql.statements(record):
                        self._execute(cursor, statement, params)
                cursor.execute("COMMIT")
            except BaseException:
                cursor.execute("ROLLBACK")
                raise

    def _execute(self, cursor: sqlite3.Cursor, statement: str, params: tuple[Any, ...]) -> None:
        """Run one statement of a transaction (the seam where tests inject faults)."""
        cursor.execute(statement, params)

    def _close(self) -> None:
        with self._lock:
            self._conn.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


def _lock_file(path: str) -> int:
    """Open ``path`` (creating it) and take it for this process alone; the descriptor holds
    the lock until closed."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUseError(
            f"metadata database {path} is in use by another process: is another broker "
            f"running on the same metadata.store.url? (SQLite metadata serves one broker)"
        ) from None
    return fd


def _connect(path: str) -> tuple[sqlite3.Connection, int | None]:
    lock_fd = None
    if path != ":memory:":
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        lock_fd = _lock_file(path)
    try:
        # isolation_level=None: transactions are begun and ended explicitly in _persist.
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except BaseException:
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("BEGIN IMMEDIATE")
        for ddl in sql.SCHEMA:
            conn.execute(ddl)
        conn.execute("COMMIT")
    except BaseException:
        conn.close()
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    return conn, lock_fd
