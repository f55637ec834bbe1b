"""Who is alive, by PostgreSQL: brokers' heartbeats and the controller's lease.

Neither goes through the metadata log: a heartbeat every two seconds per broker would fill it
with entries nobody needs to replay. Both use PostgreSQL's clock, never a broker's, so brokers
whose clocks disagree still agree on who holds the lease.

=====================  ==========================================================================
table                  rows
=====================  ==========================================================================
broker_heartbeats      node_id -> incarnation, beats (counts up at every heartbeat), seen_at
controller_lease       one row: holder node id, lease epoch (bumped at each new holder or after an
                       expiry), expires_at
=====================  ==========================================================================

**Heartbeats.** The controller never compares ``seen_at`` with its own clock: it remembers when it
last saw each broker's ``beats`` change, by its monotonic clock, and fences a broker whose count
stood still for ``broker.session.timeout.ms``. A new controller takes up each broker's silence
from ``now() - seen_at`` (PostgreSQL's clock on both sides) while some broker's heartbeats are
recent; a controller that could not read the table starts everyone's session afresh, so brokers
are not fenced for an outage of the database itself. A fence is committed on the condition that
the broker's row is still as the controller last read it (:meth:`HeartbeatMonitor.unchanged`),
with the row locked until the commit: a heartbeat racing the fence either lands first and the
fence is dropped, or waits for it, and the broker's catch-up after that heartbeat sees it.

**The lease.** A broker holds the controller role while its lease row says so and has not expired
by PostgreSQL's clock; it renews every heartbeat interval. It acts only while its own monotonic
clock, counted from the start of its last successful renewal, is inside the lease less a margin:
a frozen or cut-off controller stops acting before anyone else can take over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from storage.metadata.postgres_store import UNAVAILABLE, connect, redacted
from storage.metadata.store import MetadataUnavailableError

log = logging.getLogger("automq.controller.liveness")

SCHEMA: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS broker_heartbeats (
        node_id INTEGER PRIMARY KEY,
        incarnation BIGINT NOT NULL,
        beats BIGINT NOT NULL,
        seen_at TIMESTAMPTZ NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS controller_lease (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder INTEGER NOT NULL,
        epoch BIGINT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL)""",
)
_SCHEMA_LOCK_KEY = 0x4175746F4D52

Clock = Callable[[], float]


class _Connection:
    """One connection to ``url``, opened on first use and again after it broke."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: asyncpg.Connection | None = None
        self._ready = False

    async def get(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            try:
                self._conn = await connect(self._url)
                if not self._ready:
                    async with self._conn.transaction():
                        await self._conn.execute(
                            "SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK_KEY
                        )
                        for ddl in SCHEMA:
                            await self._conn.execute(ddl)
                    self._ready = True
            except UNAVAILABLE as e:
                raise self.unavailable(e) from e
        return self._conn

    def unavailable(self, error: BaseException) -> MetadataUnavailableError:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()
        return MetadataUnavailableError(
            f"metadata store {redacted(self._url)} unreachable: {type(error).__name__}: {error}"
        )

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None


class HeartbeatSender:
    """A broker's side: one row, counted up at each heartbeat."""

    def __init__(self, url: str, node_id: int) -> None:
        self._conn = _Connection(url)
        self.node_id = node_id

    async def beat(self, incarnation: int) -> None:
        """Record one heartbeat of this incarnation; raises MetadataUnavailableError."""
        conn = await self._conn.get()
        try:
            await conn.execute(
                "INSERT INTO broker_heartbeats (node_id, incarnation, beats, seen_at) "
                "VALUES ($1, $2, 1, now()) ON CONFLICT (node_id) DO UPDATE SET "
                "incarnation = EXCLUDED.incarnation, beats = broker_heartbeats.beats + 1, "
                "seen_at = now()",
                self.node_id,
                incarnation,
            )
        except UNAVAILABLE as e:
            raise self._conn.unavailable(e) from e

    async def close(self) -> None:
        await self._conn.close()


@dataclass(slots=True)
class _Seen:
    incarnation: int
    beats: int
    at: float  # the monotonic time the count was last seen to move


@dataclass(frozen=True, slots=True)
class RowUnchanged:
    """A :class:`~storage.metadata.store.Condition`: ``node_id``'s heartbeat row still holds
    ``(incarnation, beats)``, locked (``FOR SHARE``) so that no heartbeat commits before the
    change persisted on it does; or, with ``beats`` None, there is still no row (a broker that
    never beat; no row to lock, so its very first heartbeat is not held back)."""

    node_id: int
    incarnation: int | None
    beats: int | None

    def select(self, first_param: int) -> tuple[str, list[object]]:
        node = f"${first_param}"
        if self.beats is None:
            absent = f"NOT EXISTS (SELECT 1 FROM broker_heartbeats WHERE node_id = {node})"
            return f"SELECT 1 WHERE {absent}", [self.node_id]
        return (
            f"SELECT 1 FROM broker_heartbeats WHERE node_id = {node} "
            f"AND incarnation = ${first_param + 1} AND beats = ${first_param + 2} FOR SHARE",
            [self.node_id, self.incarnation, self.beats],
        )

    def __str__(self) -> str:
        if self.beats is None:
            return f"broker {self.node_id} has no heartbeat row"
        return f"broker {self.node_id}'s heartbeats stand at {self.beats} ({self.incarnation})"


class HeartbeatMonitor:
    """The controller's side: how long each broker's heartbeats have stood still."""

    def __init__(self, url: str, clock: Clock = time.monotonic, recent_s: float = 4.0) -> None:
        self._conn = _Connection(url)
        self._clock = clock
        self._seen: dict[int, _Seen] = {}
        self._fresh = True  # the next poll starts every session afresh
        # ... or, for a new controller, from what the table says (see poll)
        self._carry_silence = False
        self._recent_s = recent_s
        # when this process last failed to reach the database (None: not since it started):
        # silence older than that may be the outage's, never carried over
        self._unreachable_at: float | None = None

    async def poll(self) -> None:
        """Read every broker's count; a failed read makes the next one start sessions anew."""
        try:
            conn = await self._conn.get()
            rows = await conn.fetch(
                "SELECT node_id, incarnation, beats, "
                "EXTRACT(EPOCH FROM now() - seen_at)::float8 AS silent FROM broker_heartbeats"
            )
        except MetadataUnavailableError:
            self.database_unreachable()
            raise
        except UNAVAILABLE as e:
            self.database_unreachable()
            raise self._conn.unavailable(e) from e
        now = self._clock()
        # A new controller takes over how long each broker has been silent from the table
        # (PostgreSQL's clock on both sides), so a broker that died with the old controller is
        # fenced a session after its last heartbeat, not a session after the takeover; but only
        # while some broker's heartbeats are recent: after an outage of the database itself
        # every session starts afresh, as nobody could beat meanwhile. Nor is silence carried
        # from before this process last failed to reach the database: some brokers may have
        # beaten since the outage ended and others not yet (their next beat is due), and all
        # were silent through it.
        carry = self._carry_silence and any(r["silent"] <= self._recent_s for r in rows)
        carry_max = float("inf") if self._unreachable_at is None else now - self._unreachable_at
        for row in rows:
            node, incarnation, beats = row["node_id"], row["incarnation"], row["beats"]
            seen = self._seen.get(node)
            if (
                self._fresh
                or seen is None
                or seen.incarnation != incarnation
                or seen.beats != beats
            ):
                silent = 0.0
                if carry and self._fresh:
                    silent = min(max(0.0, float(row["silent"])), carry_max)
                self._seen[node] = _Seen(incarnation, beats, now - silent)
        self._fresh = False
        self._carry_silence = False

    def silent_for(self, node_id: int) -> float | None:
        """Seconds since ``node_id``'s heartbeats last moved (None: never seen)."""
        seen = self._seen.get(node_id)
        return None if seen is None else self._clock() - seen.at

    def incarnation(self, node_id: int) -> int | None:
        seen = self._seen.get(node_id)
        return None if seen is None else seen.incarnation

    def unchanged(self, node_id: int) -> RowUnchanged:
        """The condition that ``node_id``'s heartbeat row is as the last poll read it."""
        seen = self._seen.get(node_id)
        if seen is None:
            return RowUnchanged(node_id, None, None)
        return RowUnchanged(node_id, seen.incarnation, seen.beats)

    def database_unreachable(self) -> None:
        """This process could not reach the database (a failed poll, or the lease's renewal):
        the next poll starts every session afresh, and no later one carries silence over from
        before now."""
        self._unreachable_at = self._clock()
        self._fresh, self._carry_silence = True, False

    def restart_sessions(self) -> None:
        """Take every broker's session up at the next poll from the table (a new controller
        does; see :meth:`poll`)."""
        self._fresh = True
        self._carry_silence = True

    async def close(self) -> None:
        await self._conn.close()


class ControllerLease:
    """The controller role, held through a lease row; see the module docstring."""

    def __init__(
        self,
        url: str,
        node_id: int,
        lease_ms: int,
        margin_ms: int,
        clock: Clock = time.monotonic,
    ) -> None:
        if margin_ms >= lease_ms:
            raise ValueError("the lease must be longer than its safety margin")
        self._conn = _Connection(url)
        self.node_id = node_id
        self._lease_s = lease_ms / 1000
        self._margin_s = margin_ms / 1000
        self._clock = clock
        self._valid_until = float("-inf")  # by the monotonic clock
        self.epoch = -1

    def holds(self) -> bool:
        """Whether this broker may act as controller now."""
        return self._clock() < self._valid_until

    async def acquire_or_renew(self) -> bool:
        """Take the lease if it is free or expired, or renew ours; True if we hold it now."""
        start = self._clock()
        try:
            conn = await self._conn.get()
            epoch = await conn.fetchval(
                "INSERT INTO controller_lease AS l (id, holder, epoch, expires_at) "
                "VALUES (1, $1, 1, now() + $2 * interval '1 millisecond') "
                "ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder, "
                "epoch = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at >= now() "
                "THEN l.epoch ELSE l.epoch + 1 END, expires_at = EXCLUDED.expires_at "
                "WHERE l.holder = EXCLUDED.holder OR l.expires_at < now() "
                "RETURNING epoch",
                self.node_id,
                self._lease_s * 1000,
            )
        except MetadataUnavailableError:
            raise
        except UNAVAILABLE as e:
            raise self._conn.unavailable(e) from e
        if epoch is None:
            self._valid_until = float("-inf")
            return False
        if epoch != self.epoch:
            log.info("broker %d holds the controller lease, epoch %d", self.node_id, epoch)
        self.epoch = int(epoch)
        self._valid_until = start + self._lease_s - self._margin_s
        return True

    async def holder(self) -> tuple[int, int] | None:
        """The current holder and epoch if its lease has not expired."""
        conn = await self._conn.get()
        try:
            row = await conn.fetchrow(
                "SELECT holder, epoch FROM controller_lease WHERE expires_at >= now()"
            )
        except UNAVAILABLE as e:
            raise self._conn.unavailable(e) from e
        return None if row is None else (row["holder"], row["epoch"])

    async def release(self) -> None:
        """Give the lease up now (a controlled shutdown), so another broker takes over at once."""
        self._valid_until = float("-inf")
        try:
            conn = await self._conn.get()
            await conn.execute(
                "UPDATE controller_lease SET expires_at = now() - interval '1 millisecond' "
                "WHERE holder = $1 AND epoch = $2",
                self.node_id,
                self.epoch,
            )
        except MetadataUnavailableError as e:
            log.warning("releasing the controller lease: %s", e)
        except UNAVAILABLE as e:
            log.warning("releasing the controller lease: %s", self._conn.unavailable(e))

    async def close(self) -> None:
        await self._conn.close()
