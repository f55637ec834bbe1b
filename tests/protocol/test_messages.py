"""decode_request/encode_response against kafka-python 3's independent encoder/decoder."""

from __future__ import annotations

import datetime
import struct
import uuid

import pytest
from kafka.protocol.admin import (
    AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse,
    CreateTopicsRequest,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest, MetadataResponse
from kafka.protocol.producer import WriteTxnMarkersRequest, WriteTxnMarkersResponse
from kio.schema.metadata.v12 import response as metadata_v12
from kio.serial import entity_writer
from kio.static.primitive import i32, i32Timedelta

from protocol import build, headers, messages
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode, InvalidRequestError, UnsupportedVersionError
from protocol.headers import ResponseHeaderInfo
from protocol.messages import BufferCollector
from tests.protocol.kafka_oracle import request_frame, uvarint


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_request(version: int) -> None:
    frame = request_frame(
        ApiVersionsRequest[version](
            client_software_name="kafka-python", client_software_version="3.0.12"
        ),
        correlation_id=11,
    )
    req = messages.decode_request(frame)
    assert (req.api_key, req.api_version, req.correlation_id) == (18, version, 11)
    assert req.header.client_id == "oracle"
    if version >= 3:
        assert req.body.client_software_name == "kafka-python"
        assert req.body.client_software_version == "3.0.12"


@pytest.mark.parametrize("version", range(1, 14))
def test_metadata_request(version: int) -> None:
    topics = [MetadataRequest.MetadataRequestTopic(name="orders", topic_id=None)]
    frame = request_frame(
        MetadataRequest[version](
            topics=topics,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=True,
        ),
        correlation_id=version,
    )
    req = messages.decode_request(frame)
    assert req.correlation_id == version
    assert [t.name for t in req.body.topics] == ["orders"]
    if version >= 4:
        assert req.body.allow_auto_topic_creation is False
    if version >= 8:
        assert req.body.include_topic_authorized_operations is True


@pytest.mark.parametrize("version", range(4, 19))
def test_fetch_request(version: int) -> None:
    topic_id = uuid.UUID(int=0x1234)
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=3,
        current_leader_epoch=5,
        fetch_offset=1 << 40,
        last_fetched_epoch=4,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    frame = request_frame(
        FetchRequest[version](
            replica_id=-1,
            max_wait_ms=500,
            min_bytes=1,
            max_bytes=50 << 20,
            isolation_level=1,
            session_id=0,
            session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic="t", topic_id=topic_id, partitions=[partition])],
            forgotten_topics_data=[],
            rack_id="rack-a",
        )
    )
    req = messages.decode_request(frame)
    body = req.body
    assert body.max_wait == datetime.timedelta(milliseconds=500)
    assert body.min_bytes == 1
    (topic,) = body.topics
    if version >= 13:
        assert topic.topic_id == topic_id
    else:
        assert topic.topic == "t"
    (p,) = topic.partitions
    assert (p.partition, p.fetch_offset, p.partition_max_bytes) == (3, 1 << 40, 1 << 20)
    if version >= 9:
        assert p.current_leader_epoch == 5
    if version >= 11:
        assert body.rack_id == "rack-a"


@pytest.mark.parametrize("version", range(1, 12))
def test_list_offsets_request(version: int) -> None:
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=2, current_leader_epoch=7, timestamp=-1
    )
    frame = request_frame(
        ListOffsetsRequest[version](
            replica_id=-1,
            isolation_level=0,
            topics=[ListOffsetsRequest.ListOffsetsTopic(name="t", partitions=[part])],
            timeout_ms=1000,
        )
    )
    body = messages.decode_request(frame).body
    (topic,) = body.topics
    assert topic.name == "t"
    (p,) = topic.partitions
    assert (p.partition_index, p.timestamp) == (2, -1)


@pytest.mark.parametrize("version", range(2, 8))
def test_create_topics_request(version: int) -> None:
    config = CreateTopicsRequest.CreatableTopic.CreatableTopicConfig(
        name="cleanup.policy", value="compact"
    )
    topic = CreateTopicsRequest.CreatableTopic(
        name="compacted",
        num_partitions=6,
        replication_factor=1,
        assignments=[],
        configs=[config],
    )
    frame = request_frame(
        CreateTopicsRequest[version](topics=[topic], timeout_ms=30000, validate_only=False)
    )
    (t,) = messages.decode_request(frame).body.topics
    assert (t.name, t.num_partitions, t.replication_factor) == ("compacted", 6, 1)
    assert [(c.name, c.value) for c in t.configs] == [("cleanup.policy", "compact")]


def test_unknown_tagged_fields_in_body_are_skipped() -> None:
    frame = request_frame(
        ApiVersionsRequest[3](client_software_name="a", client_software_version="b")
    )
    assert frame.endswith(b"\x00")
    tags = uvarint(2) + uvarint(9) + uvarint(1) + b"z" + uvarint(1000) + uvarint(2) + b"zz"
    req = messages.decode_request(frame[:-1] + tags)
    assert req.body.client_software_name == "a"


def test_unknown_tagged_field_in_nested_struct_is_skipped() -> None:
    topics = [MetadataRequest.MetadataRequestTopic(name="orders", topic_id=None)]
    frame = request_frame(MetadataRequest[12](topics=topics, allow_auto_topic_creation=True))
    # Body v12: topics (compact array) of [topic_id uuid, name compact string, tags], ...
    nested_tags_at = frame.index(b"\x07orders") + 7
    assert frame[nested_tags_at] == 0
    patched = frame[:nested_tags_at] + b"\x01\x63\x02hi" + frame[nested_tags_at + 1 :]
    req = messages.decode_request(patched)
    assert [t.name for t in req.body.topics] == ["orders"]
    assert req.body.allow_auto_topic_creation is True


def test_known_tagged_field_is_read() -> None:
    frame = request_frame(
        FetchRequest[12](
            replica_id=-1,
            max_wait_ms=1,
            min_bytes=1,
            topics=[],
            forgotten_topics_data=[],
            cluster_id="cluster-x",
        )
    )
    assert messages.decode_request(frame).body.cluster_id == "cluster-x"


def test_unsupported_versions_carry_the_correlation_id() -> None:
    frame = request_frame(MetadataRequest[12](topics=None), correlation_id=99)
    with pytest.raises(UnsupportedVersionError) as info:
        messages.decode_request(frame, supported={3: (0, 11)})
    assert (info.value.api_key, info.value.api_version, info.value.correlation_id) == (3, 12, 99)
    with pytest.raises(UnsupportedVersionError):
        messages.decode_request(frame, supported={18: (0, 4)})
    unknown_key = struct.pack(">hhi", 9999, 0, 5) + b"\x00\x00"
    with pytest.raises(UnsupportedVersionError) as info:
        messages.decode_request(unknown_key)
    assert info.value.correlation_id == 5
    # A future ApiVersions version: the server must still learn the correlation id.
    future = struct.pack(">hhi", 18, 77, 6) + b"garbage"
    with pytest.raises(UnsupportedVersionError) as info:
        messages.decode_request(future, supported={18: (0, 4)})
    assert (info.value.api_key, info.value.correlation_id) == (18, 6)


def test_truncated_body_is_invalid_request_with_correlation_id() -> None:
    frame = request_frame(MetadataRequest[12](topics=None), correlation_id=31)
    for cut in range(8, len(frame)):
        try:
            messages.decode_request(frame[:cut])
        except InvalidRequestError as e:
            assert e.correlation_id == 31
    with pytest.raises(InvalidRequestError) as info:
        messages.decode_request(frame[:3])
    assert info.value.correlation_id is None


def test_writable_frames_are_accepted() -> None:
    frame = request_frame(MetadataRequest[12](topics=None))
    assert messages.decode_request(bytearray(frame)).api_key == 3
    assert messages.decode_request(memoryview(bytearray(frame))).api_key == 3


def test_encode_response_decodes_with_kafka_python() -> None:
    body = metadata_v12.MetadataResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        brokers=(metadata_v12.MetadataResponseBroker(node_id=i32(1), host="h", port=i32(9092)),),
        cluster_id="c",
        controller_id=i32(1),
        topics=(
            metadata_v12.MetadataResponseTopic(
                error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,  # type: ignore[arg-type]
                name="missing",
                topic_id=None,
                partitions=(),
            ),
        ),
    )
    parts = messages.encode_response(ResponseHeaderInfo(3, 12, 77), body)
    data = b"".join(bytes(p) for p in parts)
    assert struct.unpack(">i", data[:4])[0] == len(data) - 4
    decoded = MetadataResponse.decode(data[4:], version=12, header=True)
    assert decoded.header.correlation_id == 77
    assert decoded.brokers[0].host == "h"
    assert decoded.topics[0].error_code == 3


@pytest.mark.parametrize("count", [b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\x7f"])
def test_huge_array_count_is_rejected_not_allocated(count: bytes) -> None:
    # kio's native reader would allocate count * 8 bytes first and abort the process.
    frame = request_frame(
        MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name="t")])
    )
    at = frame.index(b"\x02" + bytes(16))
    with pytest.raises(InvalidRequestError, match="array of"):
        messages.decode_request(frame[:at] + count + frame[at + 1 :])


def reencoded(request: messages.Request) -> bytes:
    """``request`` written back: its header, then its body with the schema it was read with."""
    out = BufferCollector()
    out.write(headers.encode_request_header(request.header))
    schema = messages.request_schema(request.api_key, request.api_version)
    entity_writer(schema)(out, request.body)  # type: ignore[arg-type]
    return b"".join(bytes(p) for p in out.finish())


def answered(request: messages.Request, data: dict) -> bytes:
    """The framed response to ``request`` built from ``data``, size prefix stripped."""
    schema = messages.response_schema(request.api_key, request.api_version)
    parts = messages.encode_response(request.response_info, build.build(schema, data))
    return b"".join(bytes(p) for p in parts)[4:]


@pytest.mark.parametrize("version", [0, 1])
def test_write_txn_markers_v0_is_v1_before_flexible_versions(version: int) -> None:
    """v0 is not in kio (Kafka 4 removed it): ``protocol.schemas`` has it, checked against
    kafka-python's encoder and decoder, at v1 (kio's) alike."""
    marker = WriteTxnMarkersRequest.WritableTxnMarker
    frame = request_frame(
        WriteTxnMarkersRequest[version](
            markers=[
                marker(
                    producer_id=5,
                    producer_epoch=2,
                    transaction_result=True,
                    topics=[marker.WritableTxnMarkerTopic(name="t", partition_indexes=[0, 3])],
                    coordinator_epoch=7,
                )
            ]
        ),
        correlation_id=9,
    )
    request = messages.decode_request(frame)
    assert (request.api_key, request.api_version) == (ApiKey.WRITE_TXN_MARKERS, version)
    [m] = request.body.markers
    assert (m.producer_id, m.producer_epoch, m.transaction_result, m.coordinator_epoch) == (
        5,
        2,
        True,
        7,
    )
    assert [(t.name, list(t.partition_indexes)) for t in m.topics] == [("t", [0, 3])]
    assert reencoded(request) == frame

    data = {
        "markers": [
            {
                "producer_id": 5,
                "topics": [
                    {
                        "name": "t",
                        "partitions": [
                            {"partition_index": 0, "error_code": ErrorCode.NONE},
                            {"partition_index": 3, "error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER},
                        ],
                    }
                ],
            }
        ]
    }
    decoded = WriteTxnMarkersResponse.decode(answered(request, data), version=version, header=True)
    assert decoded.header.correlation_id == 9
    [result] = decoded.markers
    assert result.producer_id == 5
    assert [(p.partition_index, p.error_code) for t in result.topics for p in t.partitions] == [
        (0, 0),
        (3, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    ]


@pytest.mark.parametrize("version", [0, 1, 2])
def test_alter_replica_log_dirs_v0_is_v1(version: int) -> None:
    """v0 is not in kio (Kafka 4 removed it); it is v1's message, read and written with kio's v1
    classes: checked against kafka-python's encoder and decoder, as v1 and v2 (kio's)."""
    d = AlterReplicaLogDirsRequest.AlterReplicaLogDir
    message = AlterReplicaLogDirsRequest[version](
        dirs=[d(path="/wal", topics=[d.AlterReplicaLogDirTopic(name="t", partitions=[0, 3])])]
    )
    frame = request_frame(message, correlation_id=6)
    request = messages.decode_request(frame)
    assert (request.api_key, request.api_version) == (ApiKey.ALTER_REPLICA_LOG_DIRS, version)
    [got] = request.body.dirs
    assert (got.path, [(t.name, list(t.partitions)) for t in got.topics]) == (
        "/wal",
        [("t", [0, 3])],
    )
    assert reencoded(request) == frame

    partitions = [
        {"partition_index": 0, "error_code": ErrorCode.NONE},
        {"partition_index": 3, "error_code": ErrorCode.LOG_DIR_NOT_FOUND},
    ]
    data = {"throttle_time": 0, "results": [{"topic_name": "t", "partitions": partitions}]}
    decoded = AlterReplicaLogDirsResponse.decode(
        answered(request, data), version=version, header=True
    )
    assert decoded.header.correlation_id == 6
    [result] = decoded.results
    assert result.topic_name == "t"
    assert [(p.partition_index, p.error_code) for p in result.partitions] == [(0, 0), (3, 57)]


@pytest.mark.parametrize("version", [0, 1])
def test_describe_log_dirs_v0_is_v1(version: int) -> None:
    """v0 is not in kio (Kafka 4 removed it); it is v1's message, read and written with kio's v1
    classes: checked against kafka-python's encoder and decoder."""
    topic = DescribeLogDirsRequest.DescribableLogDirTopic
    for topics in (None, [topic(topic="t", partitions=[1, 2])]):
        frame = request_frame(DescribeLogDirsRequest[version](topics=topics), correlation_id=4)
        request = messages.decode_request(frame)
        assert (request.api_key, request.api_version) == (ApiKey.DESCRIBE_LOG_DIRS, version)
        got = request.body.topics
        assert (got is None) == (topics is None)
        if got is not None:
            assert [(t.topic, list(t.partitions)) for t in got] == [("t", [1, 2])]
        assert reencoded(request) == frame

    partition = {
        "partition_index": 1,
        "partition_size": 99,
        "offset_lag": 0,
        "is_future_key": False,
    }
    data = {
        "throttle_time": 0,
        "results": [
            {
                "error_code": ErrorCode.NONE,
                "log_dir": "/wal",
                "topics": [{"name": "t", "partitions": [partition]}],
                "total_bytes": 10,  # v4's: left out below
            }
        ],
    }
    decoded = DescribeLogDirsResponse.decode(answered(request, data), version=version, header=True)
    assert decoded.header.correlation_id == 4
    [result] = decoded.results
    assert (result.error_code, result.log_dir) == (0, "/wal")
    [p] = [p for t in result.topics for p in t.partitions]
    assert (p.partition_index, p.partition_size, p.offset_lag, p.is_future_key) == (1, 99, 0, False)
