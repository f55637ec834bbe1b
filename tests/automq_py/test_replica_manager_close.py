"""ReplicaManager.close over a real embedded store: the partitions close together, so their
final writes (log meta, producer snapshots, partition meta) go up in a few objects, not one
upload per partition; and everything reads back after a reopen."""

from __future__ import annotations

import uuid
from pathlib import Path

from automq_py.fetch_reader import FetchEntry
from automq_py.replica_manager import AppendEntry, ReplicaManager
from automq_py.topics import TopicInfo
from protocol.errors import ErrorCode
from storage.config import S3StreamConfig
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
            assert data.error is ErrorCode.NONE
            read = b"".join(data.records)
            assert read[16:] == plain_batch(i)[16:]  # (the broker sets the leader epoch)
    finally:
        await manager.close()
        await storage.close()
