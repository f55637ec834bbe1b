"""The durable store behind the metadata image: the small interface every backend offers.

A backend loads the committed state as a :class:`MetadataImage` and persists a record list in
one transaction: all of it or none of it. ``open_store`` picks the backend from a URL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from storage.metadata.image import MetadataImage
from storage.metadata.records import Record


class MetadataStore(Protocol):
    async def load(self) -> MetadataImage:
        """The state of the last committed transaction."""
        ...

    async def persist(self, records: Sequence[Record]) -> None:
        """Write ``records`` in one durable transaction, or raise and write nothing."""
        ...

    async def close(self) -> None:
        """Release the connection; the store is unusable afterwards."""
        ...


async def open_store(url: str) -> MetadataStore:
    """Open the store ``url`` names: ``sqlite:///abs/path.db`` or ``sqlite://:memory:``.

    ``sqlite:///./rel/path.db`` (a path starting with ``./`` or ``../``) is relative to the
    working directory.
    """
    if url.startswith("sqlite://"):
        from storage.metadata.sqlite_store import SQLiteStore

        return await SQLiteStore.open(sqlite_path(url))
    raise ValueError(f"unsupported metadata store url {url!r}: expected sqlite:///<path>")


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
