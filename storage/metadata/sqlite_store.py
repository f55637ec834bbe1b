"""SQLite backend of the metadata store (embedded, one node).

WAL journal mode with ``synchronous=FULL``: a transaction that returned from COMMIT survives a
power loss. The blocking sqlite3 calls run in a worker thread (``asyncio.to_thread``); one
transaction runs at a time.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any, Self

from storage.metadata import sql
from storage.metadata.image import MetadataImage
from storage.metadata.records import Record


class SQLiteStore:
    """A metadata store in one SQLite database file (or in memory, for tests)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        # The connection crosses worker threads; never let two of them use it at once.
        self._lock = threading.Lock()

    @classmethod
    async def open(cls, path: str) -> Self:
        """Open (creating if needed) the database at ``path``, or ``:memory:``."""
        return cls(await asyncio.to_thread(_connect, path))

    async def load(self) -> MetadataImage:
        return await asyncio.to_thread(self._load)

    async def persist(self, records: Sequence[Record]) -> None:
        await asyncio.to_thread(self._persist, list(records))

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


def _connect(path: str) -> sqlite3.Connection:
    if path != ":memory:":
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
    # isolation_level=None: transactions are begun and ended explicitly in _persist.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("BEGIN IMMEDIATE")
        for ddl in sql.SCHEMA:
            conn.execute(ddl)
        conn.execute("COMMIT")
    except BaseException:
        conn.close()
        raise
    return conn
