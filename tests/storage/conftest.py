"""Fixtures that build a node's S3Storage over a real WAL file, SQLite metadata and a store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from storage.config import S3StreamConfig
from storage.s3_storage import S3Storage

StorageFactory = Callable[..., Awaitable[S3Storage]]


def storage_properties(tmp_path: Path, data_url: str, **overrides: Any) -> dict[str, str]:
    """Properties for a test node: small WAL and thresholds so uploads happen quickly."""
    props = {
        "node.id": "1",
        "cluster.id": "test",
        "s3.data.buckets": data_url,
        "metadata.store.url": f"sqlite:///{tmp_path}/metadata.db",
        "s3.wal.path": str(tmp_path / "wal"),
        "s3.wal.capacity": str(64 << 20),
        "s3.wal.cache.size": str(32 << 20),
        "s3.wal.upload.threshold": str(4 << 20),
        "s3.wal.upload.interval.ms": "60000",
        "s3.request.retry.timeout.ms": "60000",
    }
    props.update({k.replace("_", "."): str(v) for k, v in overrides.items()})
    return props


@pytest.fixture
async def make_storage(tmp_path: Path) -> AsyncIterator[StorageFactory]:
    """``await make_storage(data_url, **property_overrides)``; all are closed at teardown."""
    started: list[S3Storage] = []

    async def make(data_url: str | None = None, **overrides: Any) -> S3Storage:
        url = data_url or f"file://{tmp_path}/objects"
        props = storage_properties(tmp_path, url, **overrides)
        storage = await S3Storage.start(S3StreamConfig.from_properties(props))
        started.append(storage)
        return storage

    yield make
    for s in started:
        await s.close()
