"""ReplicaManager.fetch_messages over a real embedded store: partitions whose limits fit in the
request's max_bytes are read concurrently, with the same results as one at a time; only the
first batch of the first partition with data may go past the request's or its partition's
max_bytes (Kafka's readFromLog), whether the LogCache serves the fetch at once or its reads
wait (as on object storage)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from automq_py.fetch_reader import FetchEntry
from automq_py.log.elastic_log import ElasticLog
from automq_py.partition import AppendResult, Partition
from automq_py.replica_manager import AppendEntry, ReplicaManager
from automq_py.topics import TopicInfo
from protocol import record_batch
from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch
from storage.config import S3StreamConfig
from storage.s3_storage import S3Storage
from tests.storage.conftest import storage_properties

TOPIC = TopicInfo("t", uuid.uuid4(), 4)
DELAY_S = 0.3


def plain_batch(fill: int) -> bytes:
    """Five records of 40 bytes from a producer that is not idempotent (no sequence to
    deduplicate)."""
    return bytes(build_batch([RecordInput(bytes([fill]) * 40) for _ in range(5)]))


BATCH = len(plain_batch(0))


@pytest.fixture
async def replicas(tmp_path: Path) -> AsyncIterator[ReplicaManager]:
    props = storage_properties(tmp_path, f"file://{tmp_path}/objects")
    storage = await S3Storage.start(S3StreamConfig.from_properties(props))
    manager = ReplicaManager(storage, {})
    for index in range(TOPIC.partitions):
        for _ in range(3):
            batch = memoryview(plain_batch(index))
            done = await manager.append_records(
                [AppendEntry(TOPIC, index, batch)], acks=-1, internal_allowed=False
            )
            assert [r.error for r in await done] == [ErrorCode.NONE]
    yield manager
    await manager.close()
    await storage.close()


def entries(max_bytes: int) -> list[FetchEntry]:
    return [FetchEntry(TOPIC, i, 0, max_bytes) for i in range(TOPIC.partitions)]


def not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read as if its data were no longer in the LogCache: each partition's through its
    coroutine."""
    monkeypatch.setattr(ElasticLog, "read_cached", lambda *args, **kwargs: None)


@pytest.fixture(params=["cached", "not cached"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The semantic tests run both ways: served at once from the LogCache, and read as from
    object storage."""
    if request.param == "not cached":
        not_cached(monkeypatch)
    return str(request.param)


def slow_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    not_cached(monkeypatch)
    real_read = Partition.read

    async def read(
        self: Partition,
        offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        *,
        min_one: bool = True,
    ) -> Any:
        await asyncio.sleep(DELAY_S)
        return await real_read(self, offset, max_bytes, max_offset, min_one=min_one)

    monkeypatch.setattr(Partition, "read", read)


async def test_partitions_that_fit_the_request_are_read_concurrently(
    replicas: ReplicaManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_at_a_time = []
    for i in range(TOPIC.partitions):
        partition = await replicas.partition(TOPIC, i)
        one_at_a_time.append(b"".join(await partition.read(0, 10_000)))
    slow_reads(monkeypatch)
    started = time.monotonic()
    results = await replicas.fetch_messages(
        entries(10_000), max_bytes=4 * 10_000, min_bytes=0, max_wait_s=0
    )
    assert time.monotonic() - started < 3 * DELAY_S
    assert [b"".join(r.records or []) for r in results] == one_at_a_time
    assert all(len(r) == 3 * BATCH for r in one_at_a_time)


async def test_partitions_sharing_a_tight_max_bytes_are_read_in_order(
    replicas: ReplicaManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_reads(monkeypatch)
    started = time.monotonic()
    # room for four batches in all: the first partition takes three, the second one
    results = await replicas.fetch_messages(
        entries(10_000), max_bytes=4 * BATCH, min_bytes=0, max_wait_s=0
    )
    assert time.monotonic() - started >= 2 * DELAY_S  # each read waited for the one before
    assert [r.records_size for r in results] == [3 * BATCH, BATCH, 0, 0]


async def test_only_the_first_partition_with_data_may_return_a_batch_past_its_limit(
    replicas: ReplicaManager, path: str
) -> None:
    # the limits fit in max_bytes (the concurrent reads), but each is below one batch
    results = await replicas.fetch_messages(
        entries(BATCH // 2), max_bytes=100 * BATCH, min_bytes=0, max_wait_s=0
    )
    assert [r.records_size for r in results] == [BATCH, 0, 0, 0]
    assert all(r.error_code == ErrorCode.NONE for r in results)


async def test_what_is_left_of_max_bytes_is_not_exceeded_after_the_first_batch(
    replicas: ReplicaManager, path: str
) -> None:
    # the first partition takes one batch; the half batch left is no room for another
    results = await replicas.fetch_messages(
        entries(10_000), max_bytes=BATCH + BATCH // 2, min_bytes=0, max_wait_s=0
    )
    assert [r.records_size for r in results] == [BATCH, 0, 0, 0]


async def test_the_oversized_first_batch_comes_from_the_first_partition_with_data(
    replicas: ReplicaManager, path: str
) -> None:
    end = (await replicas.partition(TOPIC, 0)).high_watermark
    caught_up = FetchEntry(TOPIC, 0, end, BATCH // 2)  # nothing to read
    rest = [FetchEntry(TOPIC, i, 0, BATCH // 2) for i in (1, 2, 3)]
    for max_bytes in (100 * BATCH, BATCH // 2):  # concurrent reads, then in order
        results = await replicas.fetch_messages(
            [caught_up, *rest], max_bytes=max_bytes, min_bytes=0, max_wait_s=0
        )
        assert [r.records_size for r in results] == [0, BATCH, 0, 0], max_bytes


class CoroutineReads:
    """Counts the partitions' reads through their coroutines (``Partition.read``), which the
    LogCache's at-once path does not make."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        real_read = Partition.read

        async def read(partition: Partition, *args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            return await real_read(partition, *args, **kwargs)

        monkeypatch.setattr(Partition, "read", read)


async def test_a_fetch_the_log_cache_holds_is_read_without_a_coroutine_per_partition(
    replicas: ReplicaManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    coroutine = CoroutineReads(monkeypatch)
    fresh = FetchEntry(TopicInfo("fresh", uuid.uuid4(), 1), 0, 0, 10_000)

    async def fetch(read_committed: bool = False) -> list[int]:
        results = await replicas.fetch_messages(
            [*entries(10_000), fresh],
            max_bytes=5 * 10_000,
            min_bytes=0,
            max_wait_s=0,
            read_committed=read_committed,
        )
        assert all(r.error_code == ErrorCode.NONE for r in results)
        # read_committed lists the aborted transactions among the records: none, not null
        assert all(r.aborted_transactions == ([] if read_committed else None) for r in results)
        return [r.records_size for r in results]

    # a partition not open yet: the fetch opens it, every partition read by its coroutine
    assert await fetch() == [3 * BATCH] * 4 + [0]
    assert coroutine.reads == 4
    # all open, all in the LogCache: no coroutine
    assert await fetch() == [3 * BATCH] * 4 + [0]
    assert coroutine.reads == 4
    # read_committed's first fetch loads each partition's aborted-transaction index: the
    # coroutines again; after that, read_committed (librdkafka's default) is served at once too
    assert await fetch(read_committed=True) == [3 * BATCH] * 4 + [0]
    assert coroutine.reads == 8
    assert await fetch(read_committed=True) == [3 * BATCH] * 4 + [0]
    assert coroutine.reads == 8


def txn_batch(producer_id: int) -> memoryview:
    records = [RecordInput(b"t" * 40) for _ in range(2)]
    return memoryview(
        build_batch(
            records,
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
    )


async def test_read_committed_lists_the_aborted_transactions_among_what_it_returns(
    replicas: ReplicaManager, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = TopicInfo("txn", uuid.uuid4(), 1)
    partition = await replicas.partition(topic, 0)
    assert (await partition.append_records(txn_batch(1))).error == ErrorCode.NONE  # 0-1
    marker = await partition.append_marker(1, 0, 0, False)  # 2: producer 1 aborts
    assert not isinstance(marker, AppendResult)
    await marker.durable
    assert (await partition.append_records(txn_batch(2))).error == ErrorCode.NONE  # 3-4, open
    assert (partition.high_watermark, partition.last_stable_offset) == (5, 3)
    # opened again (the broker restarted): its aborted-transaction index is not loaded until a
    # read_committed fetch reads it
    await replicas.close()
    reopened = ReplicaManager(replicas.storage, {})
    try:
        await reopened.partition(topic, 0)
        # cached: the first fetch's coroutine loads the index, every later fetch is read at once
        assert await read_twice(reopened, topic, monkeypatch) == (
            [1, 1] if path == "cached" else [2, 4]
        )
    finally:
        await reopened.close()


async def read_twice(
    replicas: ReplicaManager, topic: TopicInfo, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """Read ``topic`` (see above) read_committed from offsets 0, 2 and 3, twice over: the
    coroutine reads made after each round."""
    coroutine = CoroutineReads(monkeypatch)

    async def fetch(offset: int) -> tuple[list[tuple[int, int]] | None, int, int]:
        [r] = await replicas.fetch_messages(
            [FetchEntry(topic, 0, offset, 10_000)],
            max_bytes=10_000,
            min_bytes=0,
            max_wait_s=0,
            read_committed=True,
        )
        assert r.error_code == ErrorCode.NONE
        txns = r.aborted_transactions
        aborted = None if txns is None else [(t.producer_id, t.first_offset) for t in txns]
        ends = [h.last_offset for v in r.records or [] for h, _ in record_batch.iter_batches(v)]
        return aborted, r.last_stable_offset, max(ends, default=-1)

    reads = []
    for _ in range(2):
        assert await fetch(0) == ([(1, 0)], 3, 2)  # up to the last stable offset
        assert await fetch(2) == ([(1, 0)], 3, 2)  # the marker's own batch
        assert await fetch(3) == ([], 3, -1)  # at the stable offset: nothing yet
        reads.append(coroutine.reads)
    return reads
