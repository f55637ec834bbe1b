"""DescribeLogDirs against the real broker, through kafka-python's admin client and raw requests:
one log directory (the WAL's, ``s3.wal.path``, by its absolute path) holding every partition
with its log size in bytes, offset lag 0, no future logs; v4 adds the volume's total and
usable bytes. Null topics describe every partition; named ones only those that exist, and a
topic with none of them described is left out (Kafka 3.9). AlterReplicaLogDirs to that one
directory answers NONE and moves nothing; the answers for other directories, unknown
partitions and over-long topic names are the ones a Kafka 3.9.0 broker gave."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartitionReplica
from kafka.admin import KafkaAdminClient
from kafka.errors import (
    InvalidTopicError,
    LogDirNotFoundError,
    NoError,
    UnknownTopicOrPartitionError,
)
from kafka.protocol.admin import (
    AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch
from tests.automq_py.clients.test_clients import create_topic
from tests.automq_py.conftest import MakeBroker
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000


def batch(values: int, size: int = 500) -> bytes:
    return bytes(build_batch([RecordInput(bytes([i]) * size) for i in range(values)]))


def produce(bootstrap: str, topic: str, batches: dict[int, list[bytes]]) -> None:
    """Append each batch, acks=all, one request at a time."""
    t = ProduceRequest.TopicProduceData
    conn = RawConnection(bootstrap)
    try:
        for partition, items in batches.items():
            for records in items:
                request = ProduceRequest[7](
                    acks=-1,
                    timeout_ms=TIMEOUT_MS,
                    topic_data=[
                        t(
                            name=topic,
                            partition_data=[
                                t.PartitionProduceData(index=partition, records=records)
                            ],
                        )
                    ],
                )
                response = conn.call(request, ProduceResponse)
                assert response.responses[0].partition_responses[0].error_code == 0
    finally:
        conn.close()


def describe(bootstrap: str, version: int, topics: list[tuple[str, list[int]]] | None) -> Any:
    t = DescribeLogDirsRequest.DescribableLogDirTopic
    request = DescribeLogDirsRequest[version](
        topics=None if topics is None else [t(topic=n, partitions=ps) for n, ps in topics]
    )
    conn = RawConnection(bootstrap)
    try:
        return conn.call(request, DescribeLogDirsResponse)
    finally:
        conn.close()


def sizes(result: dict[str, Any]) -> dict[str, dict[int, int]]:
    """topic -> partition -> size of one log dir result (``to_dict`` form)."""
    return {
        t["name"]: {p["partition_index"]: p["partition_size"] for p in t["partitions"]}
        for t in result["topics"]
    }


ALL_B_RECORDS = batch(4)


@pytest.fixture(scope="module")
def dirs_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """A broker with topics all-a (2 empty partitions) and all-b (one batch in partition 0)."""
    broker = BrokerProcess(
        tmp_path_factory.mktemp("dirs"),
        {"s3.data.buckets": s3_server.url(), "cluster.id": f"dirs{time.monotonic_ns()}"},
    )
    broker.start()
    try:
        create_topic(broker.bootstrap, "all-a", 2)
        create_topic(broker.bootstrap, "all-b", 1)
        produce(broker.bootstrap, "all-b", {0: [ALL_B_RECORDS]})
        yield broker
    finally:
        assert broker.stop() == 0, broker.log_tail()


def test_each_partition_is_described_with_its_log_size(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    wal = tmp_path / "the-wal"
    broker = make_broker(**{"s3.wal.path": str(wal)})
    create_topic(broker.bootstrap, "sizes", 3)
    create_topic(broker.bootstrap, "other", 1)
    two, one = [batch(3), batch(2)], [batch(5, size=100)]
    produce(broker.bootstrap, "sizes", {0: two, 1: one})
    produce(broker.bootstrap, "other", {0: one})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT_MS)
    try:
        # partition 7 does not exist: left out, as is "other", of which nothing was asked
        [answer] = admin.describe_log_dirs(topic_partitions={"sizes": [0, 1, 2, 7]})
    finally:
        admin.close()
    [result] = answer["log_dirs"]
    assert result["error_code"] == ErrorCode.NONE
    assert result["log_dir"] == str(wal.resolve())
    assert sizes(result) == {"sizes": {0: sum(map(len, two)), 1: len(one[0]), 2: 0}}
    partitions = [p for t in result["topics"] for p in t["partitions"]]
    assert all(p["offset_lag"] == 0 and p["is_future_key"] is False for p in partitions)
    # v4: the WAL volume's figures
    usage = shutil.disk_usage(wal)
    assert result["total_bytes"] == usage.total
    assert 0 < result["usable_bytes"] <= usage.total
    assert abs(result["usable_bytes"] - usage.free) < 1 << 30  # other writers on the disk


def test_with_the_wal_in_object_storage_the_log_dir_is_its_bucket(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    store = tmp_path / "wal-objects"
    broker = make_broker(**{"s3.wal.path": f"0@{store.as_uri()}"})
    create_topic(broker.bootstrap, "diskless", 1)
    produce(broker.bootstrap, "diskless", {0: [batch(2)]})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT_MS)
    try:
        [answer] = admin.describe_log_dirs(topic_partitions={"diskless": [0]})
    finally:
        admin.close()
    [result] = answer["log_dirs"]
    assert result["error_code"] == ErrorCode.NONE
    assert result["log_dir"] == f"0@{store.as_uri()}"
    assert (result["total_bytes"], result["usable_bytes"]) == (-1, -1)  # no volume of its own
    assert sizes(result) == {"diskless": {0: len(batch(2))}}


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_null_topics_describe_every_partition(dirs_broker: BrokerProcess, version: int) -> None:
    response = describe(dirs_broker.bootstrap, version, None)
    if version >= 3:
        assert response.error_code == ErrorCode.NONE
    [result] = [r.to_dict() for r in response.results]
    assert result["error_code"] == ErrorCode.NONE
    wal = dirs_broker.data_dir / "wal"  # s3.wal.path's default, under log.dirs
    assert result["log_dir"] == str(wal.resolve())
    assert sizes(result) == {"all-a": {0: 0, 1: 0}, "all-b": {0: len(ALL_B_RECORDS)}}
    if version >= 4:
        assert result["total_bytes"] == shutil.disk_usage(wal).total
    else:
        assert "total_bytes" not in result


def test_unknown_topics_and_partitions_are_left_out(dirs_broker: BrokerProcess) -> None:
    response = describe(
        dirs_broker.bootstrap, 4, [("missing", [0]), ("all-a", [2, -1]), ("all-b", [0])]
    )
    [result] = [r.to_dict() for r in response.results]
    assert result["error_code"] == ErrorCode.NONE
    assert sizes(result) == {"all-b": {0: len(ALL_B_RECORDS)}}


def test_a_replica_moved_to_its_own_log_dir_answers_none(dirs_broker: BrokerProcess) -> None:
    log_dir = str((dirs_broker.data_dir / "wal").resolve())
    replica = TopicPartitionReplica
    moves = {
        replica("all-a", 0, 0): log_dir,
        replica("all-b", 0, 0): log_dir,
        replica("all-a", 2, 0): log_dir,  # all-a has partitions 0 and 1
        replica("missing", 0, 0): log_dir,
        replica("x" * 220, 0, 0): log_dir,  # "<topic>-0.<uuid>-future" is over 255 chars
        replica("all-a", 1, 0): log_dir + "/",  # not the same string
        replica("missing", 1, 0): "/elsewhere",  # the directory is checked first
    }
    admin = KafkaAdminClient(bootstrap_servers=dirs_broker.bootstrap, request_timeout_ms=TIMEOUT_MS)
    try:
        answers = admin.alter_replica_log_dirs(moves)
        [after] = admin.describe_log_dirs()
    finally:
        admin.close()
    assert answers == {
        replica("all-a", 0, 0): NoError,
        replica("all-b", 0, 0): NoError,
        replica("all-a", 2, 0): UnknownTopicOrPartitionError,
        replica("missing", 0, 0): UnknownTopicOrPartitionError,
        replica("x" * 220, 0, 0): InvalidTopicError,
        replica("all-a", 1, 0): LogDirNotFoundError,
        replica("missing", 1, 0): LogDirNotFoundError,
    }
    # nothing moved
    [result] = after["log_dirs"]
    assert result["log_dir"] == log_dir
    assert sizes(result) == {"all-a": {0: 0, 1: 0}, "all-b": {0: len(ALL_B_RECORDS)}}


@pytest.mark.parametrize("version", [0, 1, 2])
def test_every_version_of_alter_replica_log_dirs_is_answered(
    dirs_broker: BrokerProcess, version: int
) -> None:
    d = AlterReplicaLogDirsRequest.AlterReplicaLogDir
    log_dir = str((dirs_broker.data_dir / "wal").resolve())
    request = AlterReplicaLogDirsRequest[version](
        dirs=[d(path=log_dir, topics=[d.AlterReplicaLogDirTopic(name="all-a", partitions=[1])])]
    )
    conn = RawConnection(dirs_broker.bootstrap)
    try:
        response = conn.call(request, AlterReplicaLogDirsResponse)
    finally:
        conn.close()
    [topic] = response.results
    assert topic.topic_name == "all-a"
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [(1, ErrorCode.NONE)]
