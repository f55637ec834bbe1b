"""ReplicaManager.close over a real embedded store: the partitions close together, so their
final writes (log meta, producer snapshots, partition meta) go up in a few objects, not one
upload per partition; and everything reads back after a reopen."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from automq_py.fetch_reader import FetchEntry
from automq_py.replica_manager import AppendEntry, ReplicaManager
from automq_py.topics import TopicInfo
from protocol.errors import ErrorCode
from storage.config import S3StreamConfig
from storage.metadata.model import StreamState
from storage.metadata.store import MetadataUnavailableError
from storage.s3_storage import S3Storage
from tests.automq_py.test_replica_manager_fetch import plain_batch
from tests.storage.conftest import storage_properties

PARTITIONS = 40


async def test_closing_many_partitions_uploads_a_few_objects(tmp_path: Path) -> None:
    topic = TopicInfo("many", uuid.uuid4(), PARTITIONS)
    props = storage_properties(tmp_path, f"file://{tmp_path}/objects")
    config = S3StreamConfig.from_properties(props)
    storage = await S3Storage.start(config)
    manager = ReplicaManager(storage, {})
    done = await manager.append_records(
        [AppendEntry(topic, i, memoryview(plain_batch(i))) for i in range(PARTITIONS)],
        acks=-1,
        internal_allowed=False,
    )
    assert {r.error for r in await done} == {ErrorCode.NONE}
    await storage.force_upload()
    before = storage.uploads
    await manager.close()
    closing = storage.uploads - before
    await storage.close()
    # one per partition before; now the closes' writes share objects
    assert closing <= 5, f"{closing} uploads to close {PARTITIONS} partitions"

    storage = await S3Storage.start(config)
    manager = ReplicaManager(storage, {})
    try:
        for i in range(PARTITIONS):
            fetched = await manager.fetch_messages(
                [FetchEntry(topic, i, 0, 1 << 20)], max_bytes=1 << 20, min_bytes=0, max_wait_s=0
            )
            [data] = fetched
            assert data.error_code is ErrorCode.NONE
            read = b"".join(data.records)
            assert read[16:] == plain_batch(i)[16:]  # (the broker sets the leader epoch)
    finally:
        await manager.close()
        await storage.close()


async def test_a_close_that_fails_is_tried_again_until_the_partition_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition led elsewhere now whose close failed (the metadata store unreachable) is
    closed by a retry: its new leader waits for its MetaStream to close."""
    monkeypatch.setattr("automq_py.replica_manager.CLOSE_RETRY_S", 0.05)
    topic = TopicInfo("moving", uuid.uuid4(), 1)
    props = storage_properties(tmp_path, f"file://{tmp_path}/objects")
    storage = await S3Storage.start(S3StreamConfig.from_properties(props))
    manager = ReplicaManager(storage, {})
    try:
        done = await manager.append_records(
            [AppendEntry(topic, 0, memoryview(plain_batch(0)))], acks=-1, internal_allowed=False
        )
        assert {r.error for r in await done} == {ErrorCode.NONE}
        [partition] = manager.opened("moving")
        log = partition.log
        ids = [log.meta_stream_id, *(sid for sid in log.stream_map.values() if sid >= 0)]
        real = storage.metadata.close_streams
        failures: list[int] = []

        async def unreachable_twice(*args: Any) -> None:
            if len(failures) < 2:
                failures.append(len(failures))
                raise MetadataUnavailableError("the metadata store cannot be reached")
            await real(*args)

        monkeypatch.setattr(storage.metadata, "close_streams", unreachable_twice)
        manager._close_in_background(("moving", 0))  # led elsewhere now
        await manager._closing[("moving", 0)]
        assert len(failures) == 2
        for sid in ids:
            meta = storage.metadata.stream(sid)
            assert meta is not None and meta.state is StreamState.CLOSED
            assert not storage.is_open_here(sid)
    finally:
        await manager.close()
        await storage.close()
