"""ApiVersions (18) and Metadata (3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.topics import TopicInfo
from protocol import api_versions, build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema


def api_versions_handler(supported: Callable[[], dict[int, tuple[int, int]]]) -> Any:
    """ApiVersions lists the broker's whole table (read when asked, so it includes itself)."""

    async def handle(ctx: BrokerContext, request: Request) -> Any:
        return api_versions.build_api_versions_response(request.api_version, supported())

    return handle


def _topic_entry(topic: TopicInfo, ctx: BrokerContext) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.NONE,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": topic.internal,
        "partitions": [
            {
                "error_code": ErrorCode.NONE,
                "partition_index": p,
                "leader_id": ctx.node_id,
                "leader_epoch": ctx.leader_epoch,
                "replica_nodes": [ctx.node_id],
                "isr_nodes": [ctx.node_id],
                "offline_replicas": [],
            }
            for p in range(topic.partitions)
        ],
    }


async def handle_metadata(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    version = request.api_version
    wanted = getattr(body, "topics", None)
    # v0 asks for all topics with an empty list; later versions with null
    all_topics = wanted is None or (version == 0 and not wanted)
    allow_auto = bool(getattr(body, "allow_auto_topic_creation", True))
    topics: list[dict[str, Any]] = []
    if all_topics:
        topics = [_topic_entry(t, ctx) for t in ctx.topics.all()]
    else:
        for entry in wanted or ():
            name = getattr(entry, "name", None)
            topic_id = getattr(entry, "topic_id", None)
            if name is None and topic_id is not None:
                found = ctx.topics.by_id(topic_id)
                if found is None:
                    topics.append(
                        {
                            "error_code": ErrorCode.UNKNOWN_TOPIC_ID,
                            "name": None,
                            "topic_id": topic_id,
                        }
                    )
                else:
                    topics.append(_topic_entry(found, ctx))
                continue
            topic, error = await ctx.topic_for_write(str(name), allow_auto)
            if topic is None:
                topics.append({"error_code": error, "name": name, "partitions": []})
            else:
                topics.append(_topic_entry(topic, ctx))
    return build.build(
        response_schema(ApiKey.METADATA, version),
        {
            "throttle_time": 0,
            "brokers": [ctx.broker_entry()],
            "cluster_id": ctx.cluster_id,
            "controller_id": ctx.node_id,
            "topics": topics,
            "cluster_authorized_operations": -2147483648,
        },
    )


# ApiVersions (18) is added by KafkaApis, which knows the whole table.
HANDLERS: dict[int, tuple[Any, int, int]] = {ApiKey.METADATA: (handle_metadata, 0, 12)}
