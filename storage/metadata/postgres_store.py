"""PostgreSQL backend of the metadata store: one ordered record log that every broker replays.

As KRaft brokers replay ``__cluster_metadata``, each broker keeps its own image and follows the
log. A change is checked against the writer's image (``control``) and appended at the head that
image has seen; if another broker appended first, the primary key refuses the row, and the
writer catches up, checks again and retries. The append and a ``NOTIFY`` go in one transaction,
so the other brokers hear of it once it is committed and read it within milliseconds. An append
on a condition (``persist(records, condition)``) selects the condition's rows in the same
statement, with the locks it takes: nothing that would falsify it commits in between.

=======================  ==========================================================================
table                    rows
=======================  ==========================================================================
automq_schema            one row: the schema version (a newer one than this code knows is refused)
metadata_log             log_offset (1, 2, ...) -> records (one entry, ``record_codec``), written_at
metadata_snapshots       log_offset -> image (``record_codec.image_records``) as of that entry
=======================  ==========================================================================

Every :data:`SNAPSHOT_INTERVAL` entries the broker that wrote the entry stores a snapshot; once a
newer one exists, the entries up to the older snapshot are dropped, so a broker loads one
snapshot and replays at most two intervals of entries. A broker too far behind (frozen, cut off)
finds its next entry gone and loads the latest snapshot instead.

A lost connection is re-opened at the next operation; until then, changes fail with
:class:`MetadataUnavailableError` and reads go on from the image.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Self

import asyncpg

from storage.metadata import record_codec
from storage.metadata.image import MetadataImage
from storage.metadata.records import Record
from storage.metadata.store import (
    Condition,
    ConditionFailedError,
    MetadataUnavailableError,
    SnapshotNeededError,
    StaleImageError,
)

log = logging.getLogger("automq.metadata.postgres")

SCHEMA_VERSION = 1
SNAPSHOT_INTERVAL = 2000
CHANNEL = "automq_metadata"
CONNECT_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 10.0
# without a notification, look at the log's head this often anyway (a notification is lost
# while the listening connection is down)
POLL_INTERVAL_S = 5.0
CATCH_UP_BATCH = 500
# any constant will do: it serializes brokers creating the tables at the same moment
_SCHEMA_LOCK_KEY = 0x4175746F4D51  # "AutoMQ"

SCHEMA: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS automq_schema (version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS metadata_log (
        log_offset BIGINT PRIMARY KEY,
        records BYTEA NOT NULL,
        written_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS metadata_snapshots (
        log_offset BIGINT PRIMARY KEY,
        image BYTEA NOT NULL)""",
)

# what a broken connection or an unreachable server raises (the cluster's liveness tables too)
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
)


class SchemaVersionError(RuntimeError):
    """The database was set up by a newer version of automq-py."""


class PostgresStore:
    """The metadata record log in a PostgreSQL database."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()  # one statement sequence at a time on the connection
        self._offset = 0  # the last entry the caller's image holds
        self._snapshot_offset = 0  # the newest snapshot this broker knows of
        self._changed = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(cls, url: str) -> Self:
        """Connect to ``url``, create the tables if needed and check the schema version."""
        store = cls(url)
        try:
            conn = await store._connection()
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK_KEY)
                for ddl in SCHEMA:
                    await conn.execute(ddl)
                version = await conn.fetchval("SELECT max(version) FROM automq_schema")
                if version is None:
                    await conn.execute("INSERT INTO automq_schema VALUES ($1)", SCHEMA_VERSION)
                elif version > SCHEMA_VERSION:
                    raise SchemaVersionError(
                        f"metadata.store.url {redacted(url)}: schema version {version} was "
                        f"written by a newer automq-py (this one knows {SCHEMA_VERSION})"
                    )
        except BaseException:
            await store.close()
            raise
        store._listener = asyncio.create_task(store._listen(), name="metadata-listen")
        return store

    # -- the store interface ---------------------------------------------------------------------

    async def load(self) -> MetadataImage:
        async with self._lock:
            conn = await self._connection()
            try:
                # the snapshot and the entries after it as of one moment: a snapshot written
                # meanwhile could otherwise drop entries between the two reads
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    row = await conn.fetchrow(
                        "SELECT log_offset, image FROM metadata_snapshots "
                        "ORDER BY log_offset DESC LIMIT 1"
                    )
                    image = MetadataImage()
                    snapshot_offset = 0
                    if row is not None:
                        snapshot_offset = row["log_offset"]
                        try:
                            snapshot = record_codec.decode(row["image"])
                        except record_codec.UnreadableEntryError as e:
                            raise type(e)(
                                f"metadata snapshot at entry {snapshot_offset}: {e}"
                            ) from e
                        image.apply(snapshot)
                    entries, offset = await self._entries_after(conn, snapshot_offset)
                for entry in entries:
                    image.apply(entry)
            except UNAVAILABLE as e:
                raise self._unavailable(e) from e
            # only now: a load that failed midway leaves the offsets of the image the caller
            # still has
            self._snapshot_offset = snapshot_offset
            self._offset = offset
            return image

    async def persist(self, records: Sequence[Record], condition: Condition | None = None) -> None:
        data = record_codec.encode(records)
        held_sql: str = "SELECT 1"
        held_args: list[object] = []
        if condition is not None:
            held_sql, held_args = condition.select(4)
        async with self._lock:
            conn = await self._connection()
            offset = self._offset + 1
            try:
                # one statement, so one round trip and atomic by itself: the condition's rows
                # (locked until the commit), the entry, and the NOTIFY that goes out with its
                # commit. The head is past this entry when a later one exists: the entry itself
                # may be gone, dropped behind a snapshot, and must not be written again
                row = await conn.fetchrow(
                    f"WITH held AS MATERIALIZED ({held_sql}), "
                    "appended AS (INSERT INTO metadata_log (log_offset, records) "
                    "SELECT $1, $2 WHERE EXISTS (SELECT 1 FROM held) AND NOT EXISTS "
                    "(SELECT 1 FROM metadata_log WHERE log_offset > $1) RETURNING log_offset) "
                    "SELECT (SELECT count(pg_notify($3, log_offset::text)) FROM appended) "
                    "AS appended, EXISTS (SELECT 1 FROM held) AS held",
                    offset,
                    data,
                    CHANNEL,
                    *held_args,
                )
                if not row["held"]:
                    raise ConditionFailedError(f"not persisted: {condition} no longer holds")
                if row["appended"] != 1:
                    raise asyncpg.UniqueViolationError("a later entry exists")
            except asyncpg.UniqueViolationError:
                raise StaleImageError(f"metadata log entry {offset} is taken") from None
            except UNAVAILABLE as e:
                raise self._unavailable(e) from e
            self._offset = offset

    async def catch_up(self) -> list[list[Record]]:
        async with self._lock:
            conn = await self._connection()
            try:
                entries, self._offset = await self._entries_after(conn, self._offset)
            except UNAVAILABLE as e:
                raise self._unavailable(e) from e
            return entries

    async def wait_for_change(self) -> None:
        # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancellation that
        # arrives as the wait ends, and the closing follower would never stop
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(POLL_INTERVAL_S):
                await self._changed.wait()
        self._changed.clear()

    def snapshot_due(self) -> bool:
        return self._offset - self._snapshot_offset >= SNAPSHOT_INTERVAL

    async def write_snapshot(self, image: MetadataImage) -> None:
        data = record_codec.encode(record_codec.image_records(image))
        async with self._lock:
            conn = await self._connection()
            offset = self._offset
            try:
                async with conn.transaction():
                    await conn.execute(
                        "INSERT INTO metadata_snapshots (log_offset, image) VALUES ($1, $2) "
                        "ON CONFLICT (log_offset) DO NOTHING",
                        offset,
                        data,
                    )
                    # keep this snapshot and the one before; entries up to that one are
                    # replayed by nobody any more
                    older = await conn.fetchval(
                        "SELECT max(log_offset) FROM metadata_snapshots WHERE log_offset < $1",
                        offset,
                    )
                    if older is not None:
                        await conn.execute(
                            "DELETE FROM metadata_snapshots WHERE log_offset < $1", older
                        )
                        await conn.execute("DELETE FROM metadata_log WHERE log_offset <= $1", older)
            except UNAVAILABLE as e:
                raise self._unavailable(e) from e
            self._snapshot_offset = offset
        log.info("metadata snapshot at log offset %d (%d bytes)", offset, len(data))

    async def close(self) -> None:
        self._closed = True
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        async with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._conn.close(), 2.0)
                self._conn = None

    # -- internals -------------------------------------------------------------------------------

    async def _connection(self) -> asyncpg.Connection:
        if self._closed:
            raise MetadataUnavailableError("the metadata store is closed")
        if self._conn is None or self._conn.is_closed():
            try:
                self._conn = await connect(self._url)
            except UNAVAILABLE as e:
                raise self._unavailable(e) from e
        return self._conn

    def _unavailable(self, error: BaseException) -> MetadataUnavailableError:
        """Drop the connection (the next operation opens a new one) and say why."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()
        return MetadataUnavailableError(
            f"metadata store {redacted(self._url)} unreachable: "
            f"{type(error).__name__}: {error}".rstrip(": ")
        )

    async def _entries_after(
        self, conn: asyncpg.Connection, offset: int
    ) -> tuple[list[list[Record]], int]:
        """The entries after ``offset`` in order, and the offset of the last. The caller moves
        ``self._offset`` once its image is to hold them: raised out of midway (the store gone,
        an entry unreadable), this leaves it where it was, so the entries read so far are read
        again next time rather than skipped (and a ``persist`` after them refused)."""
        out: list[list[Record]] = []
        while True:
            rows = await conn.fetch(
                "SELECT log_offset, records FROM metadata_log WHERE log_offset > $1 "
                "ORDER BY log_offset LIMIT $2",
                offset,
                CATCH_UP_BATCH,
            )
            if not rows:
                break
            if rows[0]["log_offset"] != offset + 1:
                raise SnapshotNeededError(
                    f"metadata log entry {offset + 1} is gone (next kept: {rows[0]['log_offset']})"
                )
            for row in rows:
                try:
                    out.append(record_codec.decode(row["records"]))
                except record_codec.UnreadableEntryError as e:
                    raise type(e)(f"metadata log entry {row['log_offset']}: {e}") from e
                offset = row["log_offset"]
            if len(rows) < CATCH_UP_BATCH:
                break
        return out, offset

    async def _listen(self) -> None:
        """Hold a LISTEN connection; wake the waiter on each notification and after each
        reconnection (notifications sent while it was down are lost)."""
        delay = 0.1
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect(self._url)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._notified)
                self._changed.set()
                delay = 0.1
                while not lost.is_set():
                    # a dead peer is noticed only when the connection is used
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(POLL_INTERVAL_S):
                            await lost.wait()
                    if not lost.is_set():
                        await conn.execute("SELECT 1", timeout=CONNECT_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # unreachable: retry with backoff
                log.debug("metadata listener: %s: %s", type(e).__name__, e)
            finally:
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        # the payload is the entry's offset: this broker's own entries need no catching up
        try:
            if int(payload) <= self._offset:
                return
        except ValueError:
            pass
        self._changed.set()


async def connect(url: str) -> asyncpg.Connection:
    """A connection to ``url`` with the store's connect and command timeouts."""
    return await asyncpg.connect(url, timeout=CONNECT_TIMEOUT_S, command_timeout=COMMAND_TIMEOUT_S)


def redacted(url: str) -> str:
    """``url`` without its password."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{host}"
