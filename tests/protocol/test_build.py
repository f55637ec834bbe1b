"""build(): one plain description fitted to any version; names no version has are refused."""

from __future__ import annotations

import datetime
import uuid

import pytest

from protocol import build
from protocol.api_keys import ApiKey
from protocol.build import UnknownFieldError
from protocol.errors import ErrorCode
from protocol.messages import response_schema


def produce_description(**partition: object) -> dict[str, object]:
    return {
        "throttle_time": 5,
        "responses": [
            {
                "name": "orders",
                "partition_responses": [
                    {"index": 1, "error_code": 0, "base_offset": 42, **partition}
                ],
            }
        ],
    }


def test_a_misspelt_top_level_field_is_refused_with_its_name_and_schema() -> None:
    schema = response_schema(ApiKey.PRODUCE, 11)
    with pytest.raises(UnknownFieldError) as info:
        build.build(schema, {"throttle_time_ms": 0, "responses": []})
    message = str(info.value)
    assert "'throttle_time_ms'" in message
    assert "kio.schema.produce.v11.response.ProduceResponse" in message
    assert info.value.names == ["throttle_time_ms"] and info.value.schema is schema


def test_a_misspelt_nested_field_is_refused() -> None:
    expected = r"PartitionProduceResponse has no field 'erorr_code'"
    with pytest.raises(UnknownFieldError, match=expected):
        build.build(response_schema(ApiKey.PRODUCE, 9), produce_description(erorr_code=3))


def test_fields_of_other_versions_are_dropped_not_refused() -> None:
    # log_start_offset is Produce v5+, error_message v8+, current_leader v10+
    description = produce_description(
        log_start_offset=7, error_message="late", current_leader={"leader_id": 1}
    )
    old = build.build(response_schema(ApiKey.PRODUCE, 3), description)
    (partition,) = old.responses[0].partition_responses
    assert not hasattr(partition, "error_message")
    new = build.build(response_schema(ApiKey.PRODUCE, 11), description)
    (partition,) = new.responses[0].partition_responses
    assert (partition.log_start_offset, partition.error_message) == (7, "late")
    assert partition.current_leader.leader_id == 1


def test_field_names_span_every_version() -> None:
    names = build.field_names(response_schema(ApiKey.FETCH, 4))
    # topic ids and node endpoints come in v13 and v16; a v4 class accepts their names
    assert {"responses", "throttle_time", "node_endpoints"} <= names
    assert "error_message" not in names


def test_plain_values_are_converted_and_omitted_fields_default() -> None:
    schema = response_schema(ApiKey.METADATA, 12)
    topic_id = uuid.UUID(int=9)
    response = build.build(
        schema,
        {
            "throttle_time": 250,
            "brokers": [{"node_id": 1, "host": "h", "port": 9092}],
            "topics": [{"error_code": 3, "name": "t", "topic_id": str(topic_id)}],
        },
    )
    assert response.throttle_time == datetime.timedelta(milliseconds=250)
    assert response.brokers[0].rack is None
    (topic,) = response.topics
    assert topic.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert topic.topic_id == topic_id
    assert topic.partitions == () and topic.is_internal is False
    # the schema's own default, not a zero
    assert response.cluster_id is None and response.controller_id == -1


def test_none_on_a_non_nullable_field_is_its_zero() -> None:
    schema = response_schema(ApiKey.PRODUCE, 11)
    response = build.build(schema, produce_description(base_offset=None, error_message=None))
    (partition,) = response.responses[0].partition_responses
    assert (partition.base_offset, partition.error_message) == (0, None)
