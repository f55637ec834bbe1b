"""KafkaApis answers a request whose handler raised with an error response (Kafka's
handleError) instead of dropping the connection: per partition for Produce and Fetch, the
top-level error code elsewhere; acks=0 Produce closes the connection, as in Kafka."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.protocol.admin.cluster import DescribeClusterRequest, DescribeClusterResponse
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.group import HeartbeatRequest, HeartbeatResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from automq_py.apis import KafkaApis
from protocol import messages
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from storage.errors import StreamFencedError
from storage.operator.base import ObjectStoreError
from tests.protocol.kafka_oracle import request_frame


def apis_raising(api_key: int, error: Exception) -> KafkaApis:
    apis = KafkaApis(ctx=None)  # type: ignore[arg-type]  # the handler below never uses it

    async def fail(ctx: Any, request: Any) -> Any:
        raise error

    _, lo, hi = apis.table[api_key]
    apis.table[api_key] = (fail, lo, hi)
    return apis


async def answer(apis: KafkaApis, message: Any, response_class: Any) -> Any:
    request = messages.decode_request(request_frame(message), apis.supported)
    buffers = await apis.handle(request)
    assert buffers is not None
    frame = b"".join(bytes(b) for b in buffers)
    return response_class.decode(frame[4:], version=message.API_VERSION, header=True)


async def test_describe_cluster_gets_the_error_at_the_top() -> None:
    apis = apis_raising(ApiKey.DESCRIBE_CLUSTER, RuntimeError("a bug"))
    response = await answer(apis, DescribeClusterRequest[0](), DescribeClusterResponse)
    assert response.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert "RuntimeError: a bug" in response.error_message


async def test_a_response_without_error_message_gets_the_code_alone() -> None:
    # no version of HeartbeatResponse has error_message: the answer must not name it
    apis = apis_raising(ApiKey.HEARTBEAT, RuntimeError("a bug"))
    message = HeartbeatRequest[4](group_id="g", generation_id=1, member_id="m")
    response = await answer(apis, message, HeartbeatResponse)
    assert response.error_code == ErrorCode.UNKNOWN_SERVER_ERROR


def produce_request(acks: int) -> Any:
    topic = ProduceRequest.TopicProduceData
    return ProduceRequest[9](
        transactional_id=None,
        acks=acks,
        timeout_ms=1000,
        topic_data=[
            topic(
                name="t",
                partition_data=[
                    topic.PartitionProduceData(index=0, records=None),
                    topic.PartitionProduceData(index=3, records=None),
                ],
            )
        ],
    )


async def test_produce_gets_the_error_on_every_partition() -> None:
    apis = apis_raising(ApiKey.PRODUCE, StreamFencedError("epoch 4 > 3"))
    response = await answer(apis, produce_request(-1), ProduceResponse)
    (topic,) = response.responses
    assert topic.name == "t"
    assert [(p.index, p.error_code) for p in topic.partition_responses] == [
        (0, ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (3, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    ]


async def test_acks_0_produce_that_fails_closes_the_connection() -> None:
    apis = apis_raising(ApiKey.PRODUCE, RuntimeError("a bug"))
    request = messages.decode_request(request_frame(produce_request(0)), apis.supported)
    with pytest.raises(RuntimeError, match="a bug"):
        await apis.handle(request)


async def test_fetch_gets_the_error_on_every_partition() -> None:
    apis = apis_raising(ApiKey.FETCH, ObjectStoreError("s3 down"))
    t = FetchRequest.FetchTopic
    message = FetchRequest[7](
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1000,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            t(
                topic="t",
                partitions=[
                    t.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=100)
                    for p in (1, 2)
                ],
            )
        ],
        forgotten_topics_data=[],
    )
    response = await answer(apis, message, FetchResponse)
    assert response.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    (topic,) = response.responses
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [
        (1, ErrorCode.KAFKA_STORAGE_ERROR),
        (2, ErrorCode.KAFKA_STORAGE_ERROR),
    ]


def test_old_fetch_versions_get_a_storage_error_as_not_leader() -> None:
    """Fetch v5 and older predate KAFKA_STORAGE_ERROR: Kafka answers NOT_LEADER_OR_FOLLOWER,
    which their clients retry after a metadata refresh."""
    from automq_py.apis.fetch import LAST_WITHOUT_STORAGE_ERROR, down_convert_storage_errors
    from protocol.fetch import FetchPartitionResult

    results = [
        FetchPartitionResult(0, ErrorCode.KAFKA_STORAGE_ERROR),
        FetchPartitionResult(1, ErrorCode.NONE),
        FetchPartitionResult(2, ErrorCode.OFFSET_OUT_OF_RANGE),
    ]
    down_convert_storage_errors(results)
    assert [r.error_code for r in results] == [
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.NONE,
        ErrorCode.OFFSET_OUT_OF_RANGE,
    ]
    assert LAST_WITHOUT_STORAGE_ERROR == 5
