"""Storage failures reach clients as Kafka error codes on a connection that stays usable
(Kafka's ReplicaManager and handleError): a fenced stream (NOT_LEADER_OR_FOLLOWER), a closed
stream (its topic deleted under a producer: UNKNOWN_TOPIC_OR_PARTITION), object storage down
(KAFKA_STORAGE_ERROR for a cold fetch; for produce, REQUEST_TIMED_OUT once the WAL cache or
the WAL ring is full), a failed WAL write (KAFKA_STORAGE_ERROR); and a second broker on the
same data is refused rather than allowed to fence the first behind its back.

The tests with a real broker process use kafka-python's protocol classes on one connection;
the two that reach into the storage (another node taking the partition over, a disk failing)
run the broker in the test's event loop, still serving on a real socket."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka.protocol.admin import DeleteTopicsRequest, DeleteTopicsResponse
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from automq_py.broker import Broker
from automq_py.config import BrokerConfig
from automq_py.log.log_loader import open_log
from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch, parse_records
from storage.s3_storage import S3Storage
from storage.stream import StreamClient
from tests.automq_py.clients.test_clients import create_topic
from tests.support.broker import BrokerProcess, SettableSession, free_port
from tests.support.raw_connection import RawConnection, fetch_request
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

# slack for an answer due at a request's timeout, on a loaded two-core machine
ANSWER_SLACK_S = 1.5


@pytest.fixture
def own_s3(tmp_path: Path) -> Iterator[SeaweedFS]:
    """A SeaweedFS of this test's own: it is stopped in the middle."""
    server = SeaweedFS(tmp_path / "s3", base_port=SeaweedFS.default_base_port() + 300)
    server.start()
    try:
        yield server
    finally:
        server.stop(timeout_s=2)  # its data goes with the test's directory


def fetch(conn: RawConnection, topic: str, offset: int, version: int = 6) -> tuple[int, int]:
    """Fetch partition 0 from ``offset`` (v6 unless told: the first that knows
    KAFKA_STORAGE_ERROR): (error code, bytes of records)."""
    response = conn.call(
        fetch_request(topic, {0: offset}, partition_max_bytes=1 << 20, version=version),
        FetchResponse,
    )
    (part,) = response.responses[0].partitions
    return part.error_code, len(part.records or b"")


def read_all(conn: RawConnection, topic: str, end: int) -> dict[int, bytes | None]:
    """Every record value of partition 0 below ``end``, by offset."""
    got: dict[int, bytes | None] = {}
    offset = 0
    while offset < end:
        response = conn.call(fetch_request(topic, {0: offset}), FetchResponse)
        (part,) = response.responses[0].partitions
        assert part.error_code == ErrorCode.NONE, part
        data = memoryview(part.records or b"")
        pos = 0
        while pos + 12 <= len(data):
            size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
            for record in parse_records(data[pos : pos + size]):
                got[record.offset] = record.value
                offset = max(offset, record.offset + 1)
            pos += size
    return got


def produce_request(topic: str, batch: bytes, timeout_ms: int) -> Any:
    t = ProduceRequest.TopicProduceData
    return ProduceRequest[7](
        acks=-1,
        timeout_ms=timeout_ms,
        topic_data=[t(name=topic, partition_data=[t.PartitionProduceData(index=0, records=batch)])],
    )


def produce(conn: RawConnection, topic: str, batch: bytes, timeout_ms: int) -> tuple[int, int]:
    """Produce ``batch`` to partition 0 (acks=all): (error code, base offset)."""
    response = conn.call(produce_request(topic, batch, timeout_ms), ProduceResponse)
    (part,) = response.responses[0].partition_responses
    return part.error_code, part.base_offset


def assert_usable(conn: RawConnection) -> None:
    """The connection still answers: ApiVersions and Metadata."""
    assert conn.call(ApiVersionsRequest[0](), ApiVersionsResponse).error_code == 0
    assert conn.call(MetadataRequest[1](topics=None), MetadataResponse).brokers


def test_object_store_down_is_a_storage_error_and_the_connection_stays(
    tmp_path: Path, own_s3: SeaweedFS
) -> None:
    broker = BrokerProcess(
        tmp_path / "broker",
        {
            "s3.data.buckets": own_s3.url(),
            "cluster.id": "errors",
            "s3.request.retry.timeout.ms": "1500",
        },
    )
    broker.start()
    try:
        create_topic(broker.bootstrap, "cold", 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        for _ in range(200):
            producer.produce("cold", b"x" * 1000, partition=0)
        assert producer.flush(30) == 0
        broker.stop()  # everything goes to S3; after the restart every read is cold
        broker.start()
        conn = RawConnection(broker.bootstrap)
        try:
            own_s3.stop()
            code, _ = fetch(conn, "cold", 0)
            assert code == ErrorCode.KAFKA_STORAGE_ERROR
            # older versions get what their clients retry, as from Kafka
            code, _ = fetch(conn, "cold", 0, version=5)
            assert code == ErrorCode.NOT_LEADER_OR_FOLLOWER
            # the same connection still answers
            versions = conn.call(ApiVersionsRequest[0](), ApiVersionsResponse)
            assert versions.error_code == 0
            own_s3.restart()
            code, size = fetch(conn, "cold", 0)
            assert code == 0 and size > 0
        finally:
            conn.close()
        assert "KAFKA_STORAGE_ERROR" in broker.log_path.read_text()
    finally:
        assert broker.stop() == 0, broker.log_tail()


RECORDS_PER_BATCH = 4


def numbered_batch(n: int) -> bytes:
    """A 64 KiB batch whose records say which batch they belong to."""
    return build_batch(
        [
            RecordInput(value=b"%d:%d:" % (n, i) + os.urandom(16_000))
            for i in range(RECORDS_PER_BATCH)
        ]
    )


@pytest.mark.parametrize(
    "full",
    [
        # uploads stall: the LogCache fills s3.wal.cache.size first
        {"s3.wal.cache.size": str(2 << 20), "s3.wal.upload.threshold": str(512 << 10)},
        # the WAL ring is smaller than the cache: it fills first
        {
            "s3.wal.capacity": str(4 << 20),
            "s3.wal.cache.size": str(64 << 20),
            "s3.wal.upload.threshold": str(512 << 10),
        },
    ],
    ids=["wal-cache-full", "wal-ring-full"],
)
def test_object_store_down_under_produce_times_out_once_full_and_loses_nothing(
    tmp_path: Path, own_s3: SeaweedFS, full: dict[str, str]
) -> None:
    """With object storage down, produce goes on while the WAL and its cache absorb it; once
    either is full each request is answered REQUEST_TIMED_OUT by its timeout, on a connection
    that stays usable, and appends (almost) nothing; once the store is back, produce works
    again and every acknowledged record reads back."""
    timeout_ms = 1000
    broker = BrokerProcess(
        tmp_path / "broker",
        {
            "s3.data.buckets": own_s3.url(),
            "cluster.id": "backlog",
            "s3.request.retry.timeout.ms": "1000",
            **full,
        },
    )
    broker.start()
    conn: RawConnection | None = None
    try:
        create_topic(broker.bootstrap, "backlog", 1)
        conn = RawConnection(broker.bootstrap)
        acked: dict[int, int] = {}  # base offset -> batch number
        code, base = produce(conn, "backlog", numbered_batch(0), timeout_ms)
        assert code == ErrorCode.NONE
        acked[base] = 0
        own_s3.stop()
        timed_out = 0
        n = 1
        deadline = time.monotonic() + 20
        while timed_out < 3:
            assert time.monotonic() < deadline, f"never full: {len(acked)} batches acknowledged"
            started = time.monotonic()
            code, base = produce(conn, "backlog", numbered_batch(n), timeout_ms)
            took = time.monotonic() - started
            assert took < timeout_ms / 1000 + ANSWER_SLACK_S, f"answered after {took:.2f} s"
            assert code in (ErrorCode.NONE, ErrorCode.REQUEST_TIMED_OUT), ErrorCode(code)
            if code == ErrorCode.NONE:
                assert timed_out == 0, "an append succeeded after one timed out"
                acked[base] = n
            else:
                timed_out += 1
            n += 1
        assert len(acked) > 8, "the WAL absorbed nothing while object storage was down"
        assert_usable(conn)

        own_s3.restart()
        code, last = produce(conn, "backlog", numbered_batch(n), 30_000)
        assert code == ErrorCode.NONE, ErrorCode(code)
        acked[last] = n
        end = last + RECORDS_PER_BATCH
        # a request that timed out took no offsets; only one that found the ring just full
        # may have (it waits in the WAL, and lands there)
        assert end - len(acked) * RECORDS_PER_BATCH <= RECORDS_PER_BATCH
        for restarted in (False, True):
            if restarted:  # and once more with every byte from object storage or the WAL
                conn.close()
                assert broker.stop() == 0, broker.log_tail()
                broker.start()
                conn = RawConnection(broker.bootstrap)
            values = read_all(conn, "backlog", end)
            for offset, batch in acked.items():
                for i in range(RECORDS_PER_BATCH):
                    value = values[offset + i]
                    assert value is not None and value.startswith(b"%d:%d:" % (batch, i))
    finally:
        if conn is not None:
            conn.close()
        if not own_s3.running:  # a failure above: let the broker upload and stop promptly
            own_s3.start()
        assert broker.stop() == 0, broker.log_tail()


def test_a_topic_deleted_under_a_producer_answers_unknown_topic(tmp_path: Path) -> None:
    """DeleteTopics closes the partitions a pipeline of produce requests is writing: the
    requests before the deletion succeed, every later one (including those waiting for the
    closing log) is answered UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers once its metadata
    dropped the topic; the partition is never opened again, the connection stays usable and
    the broker stops cleanly."""
    broker = BrokerProcess(tmp_path / "broker")
    broker.start()
    conn = admin = None
    try:
        create_topic(broker.bootstrap, "doomed", 1)
        conn, admin = RawConnection(broker.bootstrap), RawConnection(broker.bootstrap)
        request = produce_request("doomed", numbered_batch(0), 10_000)
        count = 500
        frames = b"".join(conn.frame(request)[1] for _ in range(count))
        sender = threading.Thread(target=conn.send, args=(frames,))
        sender.start()
        codes = [conn.receive(request, ProduceResponse)[1]]
        deleted = admin.call(
            DeleteTopicsRequest[1](topic_names=["doomed"], timeout_ms=10_000),
            DeleteTopicsResponse,
        )
        assert deleted.responses[0].error_code == ErrorCode.NONE
        sender.join()
        codes += [conn.receive(request, ProduceResponse)[1] for _ in range(count - 1)]
        errors = [r.responses[0].partition_responses[0].error_code for r in codes]
        succeeded = errors.index(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        assert succeeded > 0, "the deletion did not land while the producer wrote"
        assert set(errors[:succeeded]) == {ErrorCode.NONE}
        assert set(errors[succeeded:]) == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert_usable(conn)
        topics = conn.call(MetadataRequest[1](topics=None), MetadataResponse).topics
        assert "doomed" not in [t[1] for t in topics]
    finally:
        for c in (conn, admin):
            if c is not None:
                c.close()
        assert broker.stop(timeout=30) == 0, broker.log_tail()
    assert broker.log_path.read_text().count("opened partition doomed-0 ") == 1


def test_a_second_broker_on_the_same_data_is_refused(tmp_path: Path) -> None:
    """A broker started twice on one data directory would register a newer node epoch, open
    every stream at it and write into the same WAL ring, while the first, whose metadata
    image never sees that, goes on writing: both corrupt the other's data. The second is
    refused (Kafka locks its log directories alike) and the first goes on, losing nothing."""
    first = BrokerProcess(tmp_path / "data")
    first.start()
    try:
        create_topic(first.bootstrap, "only", 1)
        conn = RawConnection(first.bootstrap)
        try:
            assert produce(conn, "only", numbered_batch(0), 10_000) == (ErrorCode.NONE, 0)
            second = BrokerProcess(tmp_path / "data")
            try:
                with pytest.raises(RuntimeError, match="broker exited"):
                    second.start()
            finally:
                second.kill()  # should it have started, it must not outlive the test
            assert "is in use by another process" in second.log_path.read_text()
            assert produce(conn, "only", numbered_batch(1), 10_000) == (
                ErrorCode.NONE,
                RECORDS_PER_BATCH,
            )
        finally:
            conn.close()
        assert first.stop() == 0, first.log_tail()
        first.start()  # everything acknowledged is there after a restart
        conn = RawConnection(first.bootstrap)
        try:
            values = read_all(conn, "only", 2 * RECORDS_PER_BATCH)
            assert [v[:4] if v else v for v in values.values()] == [
                b"%d:%d:" % (n, i) for n in range(2) for i in range(RECORDS_PER_BATCH)
            ]
        finally:
            conn.close()
    finally:
        assert first.stop() == 0, first.log_tail()


@pytest.fixture
async def inproc_broker(tmp_path: Path) -> Any:
    """A broker in this test's event loop (its storage at hand), serving on a real socket."""
    config = BrokerConfig.load(
        None,
        [
            f"log.dirs={tmp_path / 'data'}",
            f"listeners=PLAINTEXT://127.0.0.1:{free_port()}",
            f"s3.wal.capacity={32 << 20}",
            f"s3.wal.upload.threshold={8 << 20}",
            "s3.maintenance.runner=none",
            "offsets.topic.num.partitions=1",
        ],
    )
    broker = Broker(config)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def test_a_fenced_partition_answers_not_leader_and_the_connection_stays(
    tmp_path: Path, inproc_broker: Broker
) -> None:
    """Another node opens the partition's streams at a newer epoch (a controller handing the
    partition over; cluster metadata is shared, so here the two nodes share one metadata
    manager in one process): Produce and Fetch to the old owner are answered
    NOT_LEADER_OR_FOLLOWER, the client's cue to refresh metadata, on a connection that goes
    on answering."""
    broker = inproc_broker
    assert broker.server is not None and broker.storage is not None and broker.replicas
    topic = await broker.server.apis.ctx.topics.create("handed-over", 1)
    bootstrap = f"127.0.0.1:{broker.config.listeners[0].port}"
    conn = await asyncio.to_thread(RawConnection, bootstrap)
    storage = broker.storage
    try:
        code, _ = await asyncio.to_thread(produce, conn, "handed-over", numbered_batch(0), 10_000)
        assert code == ErrorCode.NONE
        await storage.force_upload()  # what the old owner acknowledged is in object storage
        other = await S3Storage.start(
            dataclasses.replace(storage.config, node_id=1, wal_path=str(tmp_path / "other")),
            store=storage.store,
            metadata=storage.metadata,
        )
        try:
            new_owner = await open_log(
                StreamClient(other),
                other.metadata,
                other.config.namespace,
                str(topic.topic_id),
                0,
                storage.node_epoch + 1,
                broker.replicas.log_config(topic),
            )
            assert new_owner.log_end_offset == RECORDS_PER_BATCH  # it has what was acknowledged
            code, _ = await asyncio.to_thread(
                produce, conn, "handed-over", numbered_batch(1), 10_000
            )
            assert code == ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode(code)
            code, _ = await asyncio.to_thread(fetch, conn, "handed-over", 0)
            assert code == ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode(code)
            await asyncio.to_thread(assert_usable, conn)
            await new_owner.close()
        finally:
            await other.close()
    finally:
        conn.close()


def latest_offset(conn: RawConnection, topic: str) -> tuple[int, int]:
    """ListOffsets (v1) LATEST of partition 0: (error code, offset)."""
    t = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest[1](
        replica_id=-1,
        topics=[t(name=topic, partitions=[t.ListOffsetsPartition(0, timestamp=-1)])],
    )
    (part,) = conn.call(request, ListOffsetsResponse).topics[0].partitions
    return part.error_code, part.offset


async def test_a_broker_out_of_session_serves_no_reads_of_what_it_leads(
    inproc_broker: Broker,
) -> None:
    """In a cluster, a broker with no heartbeat through for nearly a session may have been
    fenced and its WAL recovered by the controller: what it appended since (its high
    watermark counts it) may never reach the new leader, which gives those offsets to other
    records. So it answers Fetch and ListOffsets NOT_LEADER_OR_FOLLOWER until a heartbeat goes
    through, as its acknowledgements wait."""
    broker = inproc_broker
    assert broker.server is not None and broker.replicas is not None
    await broker.server.apis.ctx.topics.create("away", 1)
    conn = await asyncio.to_thread(RawConnection, f"127.0.0.1:{broker.config.listeners[0].port}")
    session = SettableSession()
    broker.replicas.session = session
    try:
        code, _ = await asyncio.to_thread(produce, conn, "away", numbered_batch(0), 10_000)
        assert code == ErrorCode.NONE
        session.current = False
        assert await asyncio.to_thread(fetch, conn, "away", 0) == (
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            0,
        )
        code, _ = await asyncio.to_thread(latest_offset, conn, "away")
        assert code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        session.current = True  # a heartbeat went through: not fenced
        code, size = await asyncio.to_thread(fetch, conn, "away", 0)
        assert code == ErrorCode.NONE and size > 0
        assert await asyncio.to_thread(latest_offset, conn, "away") == (
            ErrorCode.NONE,
            RECORDS_PER_BATCH,
        )
    finally:
        conn.close()


async def test_a_failed_wal_write_is_a_storage_error_and_the_connection_stays(
    inproc_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fails under the WAL: the append is answered KAFKA_STORAGE_ERROR (Kafka's
    answer for an offline log directory, not NOT_LEADER_OR_FOLLOWER: this broker still leads
    the partition), so is every later one, since the store accepts nothing more until a
    restart recovers it; the connection goes on answering, and the broker is not ready."""
    broker = inproc_broker
    assert broker.server is not None and broker.storage is not None
    await broker.server.apis.ctx.topics.create("disk", 1)
    bootstrap = f"127.0.0.1:{broker.config.listeners[0].port}"
    conn = await asyncio.to_thread(RawConnection, bootstrap)
    try:
        code, _ = await asyncio.to_thread(produce, conn, "disk", numbered_batch(0), 10_000)
        assert code == ErrorCode.NONE

        def disk_failed(writes: object) -> None:
            raise OSError(errno.EIO, "injected: the disk failed")

        wal = broker.storage.wal
        monkeypatch.setattr(wal, "_write_and_sync", disk_failed)  # the writer thread's writes
        commits = getattr(wal, "_async", None)
        assert commits is not None  # the event loop's: through an io_uring, on this machine
        ring = commits.writer
        real_reap = ring.reap

        def failed_reap() -> list[tuple[int, int]]:  # each completed write: the disk's error
            return [(buffer, -errno.EIO) for buffer, _ in real_reap()]

        monkeypatch.setattr(ring, "reap", failed_reap)
        assert broker.readiness() is None
        for n in (1, 2):
            code, _ = await asyncio.to_thread(produce, conn, "disk", numbered_batch(n), 10_000)
            assert code == ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode(code)
        await asyncio.to_thread(assert_usable, conn)
        # /readyz says so: a probe restarts the broker, whose WAL recovery brings it back
        reason = broker.readiness()
        assert reason is not None and reason.startswith("storage failed: "), reason
    finally:
        conn.close()
