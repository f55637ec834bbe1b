"""The SQLite store: reload equals memory, one transaction per operation, URLs, KV."""

from __future__ import annotations

import copy
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from storage.metadata import records as rec
from storage.metadata.manager import MetadataManager
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
)
from storage.metadata.sqlite_store import SQLiteStore, StoreInUseError
from storage.metadata.store import open_store, sqlite_path
from tests.storage.metadata.helpers import (
    TTL_MS,
    FakeClock,
    build_everything,
    open_new_stream,
)


async def test_reopened_file_equals_the_image(tmp_path: Path, clock: FakeClock) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"
    m = await MetadataManager.open(url, clock=clock)
    await build_everything(m, clock)
    before = m.image
    await m.close()

    again = await MetadataManager.open(url, clock=clock)
    try:
        assert again.image == before
        # counters survive too: ids continue where they stopped
        assert await again.prepare_object(1, TTL_MS) == max(before.objects) + 1
        e = await again.register_node(1)
        assert await again.create_stream(1, e) == max(before.streams) + 1
    finally:
        await again.close()


async def test_durability_settings(tmp_path: Path) -> None:
    store = await SQLiteStore.open(str(tmp_path / "meta.db"))
    try:
        conn = store._conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        await store.close()


class FailingStore(SQLiteStore):
    """Fails on the ``fail_at``-th statement of the next transactions (a crash mid-write)."""

    fail_at: int | None = None
    executed = 0

    def _execute(self, cursor: sqlite3.Cursor, statement: str, params: tuple[Any, ...]) -> None:
        self.executed += 1
        if self.fail_at is not None and self.executed >= self.fail_at:
            raise OSError("disk gone")
        super()._execute(cursor, statement, params)


async def test_a_transaction_is_all_or_nothing(tmp_path: Path, clock: FakeClock) -> None:
    path = str(tmp_path / "meta.db")
    store = await FailingStore.open(path)
    m = await MetadataManager.from_store(store, clock)
    e = await m.register_node(1)
    a = await open_new_stream(m, 1, e)
    b = await open_new_stream(m, 1, e)
    first = await m.prepare_object(2, TTL_MS)
    before = m.image
    snapshot = copy.deepcopy(before)

    store.executed = 0
    store.fail_at = 4  # a commit writes a dozen statements: fail in the middle
    with pytest.raises(OSError):
        await m.commit_stream_set_object(
            1,
            e,
            first,
            first,
            10,
            [CommitRange(a, 0, 0, 10), CommitRange(b, 0, 0, 5)],
            [CommitStreamObject(first + 1, a, 10, 20, 3)],
        )
    assert store.executed == 4
    assert m.image == snapshot
    assert await store.load() == m.image

    # the store is still usable, and the retried commit goes through whole
    store.fail_at = None
    await m.commit_stream_set_object(
        1,
        e,
        first,
        first,
        10,
        [CommitRange(a, 0, 0, 10), CommitRange(b, 0, 0, 5)],
        [CommitStreamObject(first + 1, a, 10, 20, 3)],
    )
    after = m.image
    await m.close()
    reopened = await open_store(f"sqlite:///{path}")
    try:
        assert await reopened.load() == after
    finally:
        await reopened.close()


async def test_a_database_open_elsewhere_is_refused(tmp_path: Path) -> None:
    """Its image is one process's alone: a second opener would overwrite the first's state."""
    url = f"sqlite:///{tmp_path}/meta.db"
    m = await MetadataManager.open(url)
    with pytest.raises(StoreInUseError, match="in use by another process"):
        await MetadataManager.open(url)
    await m.close()
    again = await MetadataManager.open(url)  # closing released it
    await again.close()


async def test_if_applying_fails_the_image_is_reloaded(manager: MetadataManager) -> None:
    e = await manager.register_node(1)

    def broken(records: object) -> None:
        raise RuntimeError("bug")

    manager.image.apply = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await manager.create_stream(1, e)
    # the store committed the stream; the image came back from the store, with it
    assert manager.stream(0) is not None
    assert manager.image.counters[rec.STREAM_ID_COUNTER] == 1


async def test_kv(manager: MetadataManager) -> None:
    assert manager.get_kv("k") is None
    await manager.put_kv("k", b"v1")
    await manager.put_kv("k", b"v2")
    assert manager.get_kv("k") == b"v2"
    await manager.delete_kv("k")
    await manager.delete_kv("k")
    assert manager.get_kv("k") is None


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///abs/path.db", "/abs/path.db"),
        ("sqlite:////abs/path.db", "/abs/path.db"),
        ("sqlite:///./data/metadata.db", "./data/metadata.db"),
        ("sqlite:///../up.db", "../up.db"),
        ("sqlite://:memory:", ":memory:"),
    ],
)
def test_sqlite_urls(url: str, path: str) -> None:
    assert sqlite_path(url) == path


@pytest.mark.parametrize(
    "url", ["mysql://db/meta", "sqlite://relative.db", "sqlite:///", "meta.db"]
)
async def test_unsupported_urls_are_named(url: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(url))):
        await MetadataManager.open(url)


async def test_relative_path_is_created_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    m = await MetadataManager.open("sqlite:///./data/metadata.db")
    await m.close()
    assert (tmp_path / "data" / "metadata.db").exists()
