"""The durable store behind the metadata image: the small interface every backend offers.

A backend loads the committed state as a :class:`MetadataImage` and persists a record list in
one transaction: all of it or none of it. ``open_store`` picks the backend from a URL.

A store several brokers share (PostgreSQL) is an ordered log of record lists: ``persist``
appends only at the head the caller's image has seen, and refuses with
:class:`StaleImageError` when another broker appended first; ``catch_up`` hands over what the
others appended, and ``wait_for_change`` returns when there may be some. A store one broker
owns (SQLite) never refuses, never has anything to catch up on, and never wakes its waiter.

A shared store also persists on a :class:`Condition` about other rows of its database, checked
in the same statement and held (locked) until the commit: the controller fences a broker only
while that broker's heartbeat count is still the one it judged silent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from storage.errors import StorageError
from storage.metadata.image import MetadataImage
from storage.metadata.records import Record


class StaleImageError(Exception):
    """Another broker committed since this image was read: catch up, check again, retry."""


class SnapshotNeededError(Exception):
    """The log entries this image needs next were dropped after a snapshot: load it anew."""


class MetadataUnavailableError(StorageError):
    """The metadata store cannot be reached now; reads from the image still work."""


class MetadataFailedError(StorageError):
    """The image stopped following the store at an entry this version cannot read: no change
    can be checked against it any more."""


class ConditionFailedError(Exception):
    """The change was not persisted: its condition did not hold."""


class Condition(Protocol):
    """A condition a change is persisted on, in a store shared through PostgreSQL."""

    def select(self, first_param: int) -> tuple[str, list[object]]:
        """A ``SELECT`` that returns a row while the condition holds, taking the row locks
        that keep it holding until the transaction commits; its parameters are numbered from
        ``$first_param`` and given in the list."""
        ...


class MetadataStore(Protocol):
    async def load(self) -> MetadataImage:
        """The state of the last committed transaction."""
        ...

    async def persist(self, records: Sequence[Record], condition: Condition | None = None) -> None:
        """Write ``records`` in one durable transaction, or raise and write nothing.

        Raises :class:`StaleImageError` when the store moved past the caller's image (the
        records were checked against stale state), :class:`ConditionFailedError` when
        ``condition`` did not hold, and :class:`MetadataUnavailableError` when the store
        cannot be reached (the outcome of the transaction may then be unknown: a later
        ``catch_up`` shows it). A store of one broker takes no condition (ValueError).
        """
        ...

    async def catch_up(self) -> list[list[Record]]:
        """What other writers committed since the last load, persist or catch-up, in order;
        raises :class:`SnapshotNeededError` when that history is no longer kept."""
        ...

    async def wait_for_change(self) -> None:
        """Return when another writer may have committed (never, for a store of one)."""
        ...

    def snapshot_due(self) -> bool:
        """Whether the caller should write a snapshot of its image now."""
        ...

    async def write_snapshot(self, image: MetadataImage) -> None:
        """Store ``image`` (the state at the last persisted or caught-up entry) for fast loads."""
        ...

    async def close(self) -> None:
        """Release the connection; the store is unusable afterwards."""
        ...


async def open_store(url: str) -> MetadataStore:
    """Open the store ``url`` names: ``sqlite:///abs/path.db``, ``sqlite://:memory:`` or
    ``postgresql://USER[:PASSWORD]@HOST:PORT/DB``.

    ``sqlite:///./rel/path.db`` (a path starting with ``./`` or ``../``) is relative to the
    working directory.
    """
    if url.startswith("sqlite://"):
        from storage.metadata.sqlite_store import SQLiteStore

        return await SQLiteStore.open(sqlite_path(url))
    if url.startswith(("postgresql://", "postgres://")):
        from storage.metadata.postgres_store import PostgresStore

        return await PostgresStore.open(url)
    raise ValueError(
        f"unsupported metadata store url {url!r}: expected sqlite:///<path> or "
        "postgresql://USER@HOST:PORT/DB"
    )


def sqlite_path(url: str) -> str:
    """The database path in a ``sqlite://`` URL (``:memory:`` for an in-memory database)."""
    rest = url.removeprefix("sqlite://")
    if rest in (":memory:", "/:memory:"):
        return ":memory:"
    if not rest.startswith("/") or rest == "/":
        raise ValueError(f"unsupported metadata store url {url!r}: expected sqlite:///<path>")
    path = rest[1:]
    if path.startswith(("./", "../", "/")):
        return path
    return "/" + path
