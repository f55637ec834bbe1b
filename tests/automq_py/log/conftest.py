"""Fixtures for ElasticLog tests: a node's S3Storage over a file WAL, SQLite metadata and a
local object store in the test's temporary directory, and Kafka batches with chosen timestamps."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import crc32c
import pytest

from automq_py.log import log_loader
from automq_py.log.elastic_log import ElasticLog
from automq_py.log.log_config import LogConfig
from protocol import record_batch
from storage.config import S3StreamConfig
from storage.s3_storage import S3Storage
from storage.stream import StreamClient
from tests.protocol.test_record_batch import make_batch
from tests.storage.conftest import storage_properties

StorageFactory = Callable[..., Awaitable[S3Storage]]
NAMESPACE = "_kafka_test"
TOPIC_ID = "LeokTjQSRYOjo9Mx0AgopQ"


def kafka_batch(base_offset: int, count: int, max_timestamp: int, size: int = 100) -> bytes:
    """A magic-v2 batch at ``base_offset`` whose timestamps are ``max_timestamp``; its opaque
    records name the base offset so reads can be checked."""
    records = f"<{base_offset}>".encode().ljust(size, b".")
    batch = bytearray(make_batch(base_offset, count, records))
    struct.pack_into(">qq", batch, 27, max_timestamp, max_timestamp)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


async def start_storage(tmp_path: Path, **overrides: Any) -> S3Storage:
    """A storage on ``tmp_path``; a second one on the same path recovers the first's WAL."""
    props = storage_properties(tmp_path, f"file://{tmp_path}/objects", **overrides)
    return await S3Storage.start(S3StreamConfig.from_properties(props))


@pytest.fixture
async def make_storage(tmp_path: Path) -> AsyncIterator[StorageFactory]:
    """``await make_storage()``: a storage on the test's directory; all closed at teardown."""
    started: list[S3Storage] = []

    async def make(**overrides: Any) -> S3Storage:
        storage = await start_storage(tmp_path, **overrides)
        started.append(storage)
        return storage

    yield make
    for s in started:
        await s.close()


async def open_log(
    storage: S3Storage,
    *,
    epoch: int = 0,
    partition: int = 0,
    clock: Callable[[], int] | None = None,
    **config: Any,
) -> ElasticLog:
    """Open partition ``partition`` of the test topic; ``config`` uses property names with
    ``_`` for ``.`` (``segment_bytes=2000``)."""
    props = {k.replace("_", "."): v for k, v in config.items()}
    return await log_loader.open_log(
        StreamClient(storage),
        storage.metadata,
        NAMESPACE,
        TOPIC_ID,
        partition,
        epoch,
        LogConfig.from_properties(props, strict=True),
        clock=clock,
    )


async def append_batches(
    log: ElasticLog, timestamps: list[int], count: int = 3, size: int = 100
) -> list[bytes]:
    """Append one batch of ``count`` records per timestamp; return the batches."""
    out = []
    for ts in timestamps:
        base = log.log_end_offset
        batch = kafka_batch(base, count, ts, size)
        await log.append(
            batch, base_offset=base, record_count=count, max_timestamp=ts, first_timestamp=ts
        )
        out.append(batch)
    return out


def batches_of(views: list[memoryview]) -> list[bytes]:
    """The batches a read returned, one by one (a buffer of the read may hold several)."""
    return [bytes(batch) for view in views for _, batch in record_batch.iter_batches(view)]
