"""A topic's effective configuration: one merge of the broker's defaults and the topic's own
configs, which DescribeConfigs, retention (DescribeLogSegments) and the partitions all see."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin.configs import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse

from automq_py.apis import KafkaApis
from automq_py.apis.context import BrokerContext
from automq_py.apis.controller import describe_log_segments
from automq_py.config import TOPIC_CONFIG_SYNONYMS, BrokerConfig
from automq_py.log.log_config import LogConfig
from automq_py.replica_manager import ReplicaManager
from automq_py.topic_config import ConfigSource, effective_topic_config
from automq_py.topics import TopicRegistry
from protocol import messages
from protocol.errors import ErrorCode
from storage.config_def import LONG_MAX, ConfigError, format_value
from storage.s3_storage import S3Storage
from tests.protocol.kafka_oracle import request_frame

HOUR_MS = 3_600_000
TOPIC_RESOURCE = 2


def broker_config(data: Path) -> BrokerConfig:
    return BrokerConfig.from_properties(
        {
            "log.dirs": str(data),
            "s3.wal.capacity": str(32 << 20),
            "s3.wal.upload.threshold": str(8 << 20),
            "log.retention.hours": "24",  # a broker setting (STATIC_BROKER_CONFIG)
            "log.cleanup.policy": "delete",
        }
    )


@pytest.fixture
async def ctx(tmp_path: Path) -> AsyncIterator[BrokerContext]:
    """A BrokerContext over a real embedded store, as Broker.start builds it (no sockets)."""
    config = broker_config(tmp_path / "data")
    storage = await S3Storage.start(config.storage)
    replicas = ReplicaManager(storage, config.topic_defaults())
    yield BrokerContext(
        node_id=config.node_id,
        cluster_id=config.cluster_id,
        host="127.0.0.1",
        port=9092,
        topics=TopicRegistry(storage.metadata),
        replicas=replicas,
        auto_create_topics=False,
        num_partitions=1,
        config=config,
    )
    await replicas.close()
    await storage.close()


async def call(ctx: BrokerContext, message: Any, response_class: Any) -> Any:
    """``message`` (a kafka-python request) through KafkaApis; the decoded response."""
    apis = KafkaApis(ctx)
    request = messages.decode_request(request_frame(message), apis.supported)
    buffers = await apis.handle(request)
    assert buffers is not None
    frame = b"".join(bytes(b) for b in buffers)
    return response_class.decode(frame[4:], version=message.API_VERSION, header=True)


async def create_topic(ctx: BrokerContext, name: str, configs: dict[str, str]) -> Any:
    topic = CreateTopicsRequest.CreatableTopic
    request = CreateTopicsRequest[5](
        topics=[
            topic(
                name=name,
                num_partitions=1,
                replication_factor=1,
                assignments=[],
                configs=[topic.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
            )
        ],
        timeout_ms=1000,
        validate_only=False,
    )
    return (await call(ctx, request, CreateTopicsResponse)).topics[0]


async def describe_configs(ctx: BrokerContext, name: str) -> dict[str, Any]:
    resource = DescribeConfigsRequest.DescribeConfigsResource
    request = DescribeConfigsRequest[4](
        resources=[
            resource(resource_type=TOPIC_RESOURCE, resource_name=name, configuration_keys=None)
        ],
        include_synonyms=True,
        include_documentation=False,
    )
    result = (await call(ctx, request, DescribeConfigsResponse)).results[0]
    assert result.error_code == ErrorCode.NONE, result.error_message
    return {c.name: c for c in result.configs}


async def retention_view(ctx: BrokerContext, name: str) -> dict[str, Any]:
    """What the retention job is told about the topic (DescribeLogSegments)."""
    body = {"topics": [name], "cleanup_policy": ""}
    (topic,) = (await describe_log_segments(ctx, body, 0))["topics"]
    return {
        "retention.ms": str(topic["retention_ms"]),
        "retention.bytes": str(topic["retention_bytes"]),
        "cleanup.policy": topic["cleanup_policy"],
    }


async def partition_config(ctx: BrokerContext, name: str) -> LogConfig:
    topic = ctx.topics.get(name)
    assert topic is not None
    return (await ctx.replicas.partition(topic, 0)).log.config


async def assert_every_reader_agrees(ctx: BrokerContext, name: str) -> dict[str, Any]:
    described = await describe_configs(ctx, name)
    retention = await retention_view(ctx, name)
    log_config = await partition_config(ctx, name)
    for prop, value in retention.items():
        assert described[prop].value == value, prop
    for prop, (attr, _) in LogConfig.properties().items():
        assert described[prop].value == format_value(getattr(log_config, attr)), prop
    return described


async def test_describe_configs_retention_and_the_partition_see_the_same_values(
    ctx: BrokerContext,
) -> None:
    created = await create_topic(ctx, "t", {"retention.bytes": "5000", "cleanup.policy": "delete"})
    assert created.error_code == ErrorCode.NONE, created.error_message

    described = await assert_every_reader_agrees(ctx, "t")
    # the topic's own value, and the broker's setting under the topic's name
    assert described["retention.bytes"].value == "5000"
    assert described["retention.bytes"].config_source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert described["retention.ms"].value == str(24 * HOUR_MS)
    # Kafka's ConfigHelper lists log.retention.ms's synonyms from log.retention.ms on: one set
    # as log.retention.hours leaves none, and the source reads DEFAULT_CONFIG
    assert described["retention.ms"].config_source == ConfigSource.DEFAULT_CONFIG
    assert described["retention.ms"].synonyms == []
    assert described["segment.bytes"].config_source == ConfigSource.DEFAULT_CONFIG
    assert [(s.name, s.value, s.source) for s in described["segment.bytes"].synonyms] == [
        ("log.segment.bytes", str(1 << 30), ConfigSource.DEFAULT_CONFIG)
    ]
    assert (await partition_config(ctx, "t")).retention_bytes == 5000

    # a change reaches the open partition, DescribeConfigs and retention alike
    alterable = IncrementalAlterConfigsRequest.AlterConfigsResource.AlterableConfig
    request = IncrementalAlterConfigsRequest[1](
        resources=[
            IncrementalAlterConfigsRequest.AlterConfigsResource(
                resource_type=TOPIC_RESOURCE,
                resource_name="t",
                configs=[
                    alterable(name="retention.ms", config_operation=0, value="60000"),
                    alterable(name="retention.bytes", config_operation=1, value=None),
                    alterable(name="cleanup.policy", config_operation=2, value="compact"),
                ],
            )
        ],
        validate_only=False,
    )
    response = await call(ctx, request, IncrementalAlterConfigsResponse)
    assert response.responses[0].error_code == ErrorCode.NONE, response.responses[0].error_message

    described = await assert_every_reader_agrees(ctx, "t")
    assert described["retention.ms"].value == "60000"
    assert described["retention.ms"].config_source == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert described["retention.bytes"].value == "-1"
    assert described["retention.bytes"].config_source == ConfigSource.DEFAULT_CONFIG
    assert described["cleanup.policy"].value == "delete,compact"
    assert (await retention_view(ctx, "t"))["cleanup.policy"] == "delete,compact"


async def test_describe_log_segments_for_a_policy_leaves_the_other_partitions_shut(
    ctx: BrokerContext,
) -> None:
    """The maintenance's key-compaction check asks for ``compact`` topics every
    ``log.cleaner.backoff.ms``: the others' partitions are not opened for it (as after a
    restart, where nothing is open until asked for)."""
    lagged = {"cleanup.policy": "compact", "min.compaction.lag.ms": "5000"}
    await ctx.topics.create("kept", 2, lagged)
    await ctx.topics.create("plain", 2, {"cleanup.policy": "delete"})
    await ctx.topics.create("both", 1, {"cleanup.policy": "compact,delete"})
    answer = await describe_log_segments(ctx, {"topics": [], "cleanup_policy": "compact"}, 1)
    assert [t["name"] for t in answer["topics"]] == ["both", "kept"]
    assert ctx.replicas.opened("plain") == []
    assert len(ctx.replicas.opened("kept")) == 2
    kept = answer["topics"][1]
    assert (kept["min_compaction_lag_ms"], kept["max_compaction_lag_ms"]) == (5000, LONG_MAX)
    assert [len(p["segments"]) for p in kept["partitions"]] == [1, 1]
    # no policy asked for: every topic, as v0 answers
    answer = await describe_log_segments(ctx, {"topics": [], "cleanup_policy": ""}, 1)
    assert [t["name"] for t in answer["topics"]] == ["both", "kept", "plain"]
    assert len(ctx.replicas.opened("plain")) == 2


@pytest.mark.parametrize(
    ("configs", "named"),
    [
        ({"segment.bytes": "4294967296"}, "segment.bytes"),  # Kafka's INT
        ({"retention.ms": "-2"}, "retention.ms"),
        ({"cleanup.policy": "forever"}, "cleanup.policy"),
        ({"segment.byte": "1"}, "segment.byte"),
    ],
)
async def test_a_bad_topic_config_is_invalid_config_naming_it(
    ctx: BrokerContext, configs: dict[str, str], named: str
) -> None:
    created = await create_topic(ctx, "bad", configs)
    assert created.error_code == ErrorCode.INVALID_CONFIG
    assert named in created.error_message
    assert ctx.topics.get("bad") is None


def test_the_merge_takes_the_topic_over_the_broker() -> None:
    defaults = BrokerConfig.from_properties({"log.segment.bytes": "2000"}).topic_defaults()
    assert set(defaults) == set(TOPIC_CONFIG_SYNONYMS)
    merged = effective_topic_config(defaults, {"segment.bytes": "3000"})
    assert merged.log_config.segment_bytes == 3000
    assert effective_topic_config(defaults, {}).log_config.segment_bytes == 2000
    assert effective_topic_config(defaults, {}).value("cleanup.policy") == "delete"
    with pytest.raises(ConfigError, match=r"^Unknown topic config name: x$"):
        effective_topic_config(defaults, {"x": "1"}, strict=True)
