"""ApiVersions (18), Metadata (3) and DescribeTopicPartitions (75).

Authorization is Kafka's (``KafkaApis.handleTopicMetadataRequest``,
``DescribeTopicPartitionsRequestHandler``): a topic the session may not DESCRIBE is left out of
an answer about every topic and answered TOPIC_AUTHORIZATION_FAILED when named (whether it
exists or not: its existence is not disclosed); auto-creating one needs CREATE on the cluster or
on the topic. The ``*_authorized_operations`` bit fields are filled when asked for.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.controller.cluster_records import NO_LEADER
from automq_py.security.acls import AclOperation, ResourceType
from automq_py.topics import INTERNAL_TOPICS, TopicError, TopicInfo, validate_name
from protocol import api_versions, build
from protocol.api_keys import ApiKey
from protocol.build import ZERO_UUID
from protocol.errors import ErrorCode
from protocol.messages import Request, encode_response_body, frame_response, response_schema

# Kafka's value of an ``*_authorized_operations`` field not asked for
AUTHORIZED_OPERATIONS_OMITTED = -2147483648
DESCRIBE, TOPIC = AclOperation.DESCRIBE, ResourceType.TOPIC

# The feature flags (KIP-584) Kafka tools show, at the levels automq-py serves: metadata.version
# 3.9-IV0 (21), its APIs' versions being Kafka 3.9's (from 3.3-IV3, 7, the oldest Kafka 4
# names); group.version 1, the consumer rebalance protocol of KIP-848. No transaction.version:
# from level 2 Kafka 4 producers would use KIP-890 part 2's protocol, which is not served.
FEATURES = (
    api_versions.Feature("metadata.version", 7, 21, finalized=21),
    api_versions.Feature("group.version", 0, 1, finalized=1),
)
# the metadata offset at which Kafka finalized them; these never change
FEATURES_EPOCH = 0


def api_versions_handler(supported: Callable[[], dict[int, tuple[int, int]]]) -> Any:
    """ApiVersions lists the broker's whole table (read when asked, so it includes itself)
    and its feature flags."""

    async def handle(ctx: BrokerContext, request: Request) -> Any:
        return api_versions.build_api_versions_response(
            request.api_version, supported(), features=FEATURES, features_epoch=FEATURES_EPOCH
        )

    return handle


def _refused_topic(name: str | None, topic_id: uuid.UUID = ZERO_UUID) -> dict[str, Any]:
    """A topic answered TOPIC_AUTHORIZATION_FAILED: named as asked, with no id when asked by
    name (Kafka does not disclose it) and no name when asked by id."""
    return {
        "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        "name": name,
        "topic_id": topic_id,
        "is_internal": False,
        "partitions": [],
    }


def _partition_entry(ctx: BrokerContext, topic: str, partition: int) -> dict[str, Any]:
    """One partition: its leader is its one replica (object storage keeps the data durable,
    any broker can serve it); with no live leader it is offline: LEADER_NOT_AVAILABLE."""
    leadership = ctx.leadership(topic, partition)
    if leadership.leader == NO_LEADER:
        return {
            "error_code": ErrorCode.LEADER_NOT_AVAILABLE,
            "partition_index": partition,
            "leader_id": -1,
            "leader_epoch": leadership.epoch,
            "replica_nodes": [],
            "isr_nodes": [],
            "offline_replicas": [],
        }
    return {
        "error_code": ErrorCode.NONE,
        "partition_index": partition,
        "leader_id": leadership.leader,
        "leader_epoch": leadership.epoch,
        "replica_nodes": [leadership.leader],
        "isr_nodes": [leadership.leader],
        "offline_replicas": [],
    }


def _topic_entry(
    topic: TopicInfo, ctx: BrokerContext, partitions: range | None = None
) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.NONE,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": topic.internal,
        "partitions": [
            _partition_entry(ctx, topic.name, p)
            for p in (range(topic.partitions) if partitions is None else partitions)
        ],
    }


# Metadata responses kept encoded per broker (distinct questions of the current state)
RESPONSE_CACHE_ENTRIES = 64


async def handle_metadata(ctx: BrokerContext, request: Request) -> Any:
    """The brokers, the controller and the topics asked for. A response for the same
    question of the same state (no topic, broker, leader or controller changed since) is sent
    again as encoded then: the clients of a broker whose 10,000 partitions move all ask for
    them, and encoding the answer is most of its cost. With an authorizer the answer depends
    on the session and on the ACLs, so it is built for each request."""
    body = request.body
    version = request.api_version
    wanted = getattr(body, "topics", None)
    # v0 asks for all topics with an empty list; later versions with null
    all_topics = wanted is None or (version == 0 and not wanted)
    allow_auto = bool(getattr(body, "allow_auto_topic_creation", True))
    topic_operations = bool(getattr(body, "include_topic_authorized_operations", False))
    cluster_operations = bool(getattr(body, "include_cluster_authorized_operations", False))
    secured = ctx.secured
    cluster = ctx.cluster
    key = (
        version,
        None
        if all_topics
        else tuple((getattr(e, "name", None), getattr(e, "topic_id", None)) for e in wanted or ()),
        ctx.topics.generation,
        0 if cluster is None else cluster.generation,
        ctx.own_address(),
        topic_operations,
        cluster_operations,
    )
    if not secured:
        cached = ctx.metadata_responses.get(key)
        if cached is not None:
            return frame_response(request.response_info, cached)
    reusable = not secured  # nor when a topic was missing (it may be created meanwhile)
    topics: list[dict[str, Any]] = []
    if all_topics:
        topics = [
            _topic_entry(t, ctx)
            for t in ctx.topics.all()
            if not secured or ctx.allowed(DESCRIBE, TOPIC, t.name)
        ]
    else:
        for entry in wanted or ():
            name = getattr(entry, "name", None)
            topic_id = getattr(entry, "topic_id", None)
            if name is None and topic_id is not None:
                found = ctx.topics.by_id(topic_id)
                if found is None:
                    reusable = False
                    topics.append(
                        {
                            "error_code": ErrorCode.UNKNOWN_TOPIC_ID,
                            "name": None,
                            "topic_id": topic_id,
                        }
                    )
                elif secured and not ctx.allowed(DESCRIBE, TOPIC, found.name):
                    # a topic id is not secret: it is answered, without the name
                    topics.append(_refused_topic(None, topic_id))
                else:
                    topics.append(_topic_entry(found, ctx))
                continue
            existed = ctx.topics.get(str(name)) is not None
            reusable = reusable and existed
            if secured and not _may_see(ctx, str(name), existed, allow_auto):
                topics.append(_refused_topic(str(name)))
                continue
            if not existed and not valid_name(str(name)):
                # Kafka checks the name of a topic it does not have, whether or not it would
                # create it: a client fails at once rather than waiting for it
                topics.append(
                    {
                        "error_code": ErrorCode.INVALID_TOPIC_EXCEPTION,
                        "name": name,
                        "partitions": [],
                    }
                )
                continue
            topic, error = await ctx.topic_for_write(str(name), allow_auto)
            if topic is None:
                topics.append(
                    {
                        "error_code": error,
                        "name": name,
                        "is_internal": str(name) in INTERNAL_TOPICS,
                        "partitions": [],
                    }
                )
            elif not existed:
                # auto-created by this request: LEADER_NOT_AVAILABLE and no partitions, as
                # Kafka's AutoTopicCreationManager answers when it creates the topic itself;
                # the client asks again and finds it. (A KRaft broker, which leaves it to the
                # controller, answers UNKNOWN_TOPIC_OR_PARTITION; kafka-go's group leader then
                # assigns nothing here, where its topic watcher never sees the topic appear)
                topics.append(
                    {
                        "error_code": ErrorCode.LEADER_NOT_AVAILABLE,
                        "name": name,
                        "is_internal": topic.internal,
                        "partitions": [],
                    }
                )
            else:
                topics.append(_topic_entry(topic, ctx))
    if topic_operations and version >= 8:
        for t in topics:
            if t["error_code"] != ErrorCode.TOPIC_AUTHORIZATION_FAILED and t["name"] is not None:
                t["topic_authorized_operations"] = ctx.authorized_operations(TOPIC, t["name"])
    response = build.build(
        response_schema(ApiKey.METADATA, version),
        {
            "throttle_time": 0,
            "brokers": ctx.broker_entries(),
            "cluster_id": ctx.cluster_id,
            "controller_id": ctx.controller_id,
            "topics": topics,
            "cluster_authorized_operations": ctx.cluster_authorized_operations()
            if cluster_operations
            else AUTHORIZED_OPERATIONS_OMITTED,
        },
    )
    now = (ctx.topics.generation, 0 if cluster is None else cluster.generation)
    if not reusable or key[2:4] != now:  # changed while it was built
        return response
    responses = ctx.metadata_responses
    if len(responses) >= RESPONSE_CACHE_ENTRIES or any(k[2:4] != now for k in responses):
        responses.clear()  # answers of an older state are never asked for again
    encoded = encode_response_body(response)
    responses[key] = encoded
    return frame_response(request.response_info, encoded)


def _may_see(ctx: BrokerContext, name: str, existed: bool, allow_auto: bool) -> bool:
    """Whether a topic named in a Metadata request is answered (else TOPIC_AUTHORIZATION_FAILED):
    the session may DESCRIBE it, and, when the request would create it, CREATE it (on the
    cluster or on the topic)."""
    if not ctx.allowed(DESCRIBE, TOPIC, name):
        return False
    if existed or not (allow_auto and ctx.auto_create_topics):
        return True
    return ctx.allowed_on_cluster(AclOperation.CREATE) or ctx.allowed(
        AclOperation.CREATE, TOPIC, name
    )


# Kafka's max.request.partition.size.limit: the most partitions one response describes
MAX_RESPONSE_PARTITIONS = 2000


async def handle_describe_topic_partitions(ctx: BrokerContext, request: Request) -> Any:
    """The topics asked for (all when none is named), sorted by name, from the cursor on and
    at most ``response_partition_limit`` partitions; where that cuts the list, ``next_cursor``
    names the first partition left out. As Kafka's KRaft broker: a named topic that does not
    exist is answered UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for an invalid name)
    and nothing is created; a cursor must name one of the topics asked for. Topics the session
    may not DESCRIBE are left out, and answered TOPIC_AUTHORIZATION_FAILED (at the end) when
    named; each topic described carries its authorized operations."""
    body = request.body
    cursor = body.cursor
    after = cursor.topic_name if cursor is not None else ""
    fetch_all = not body.topics
    if fetch_all:
        names = {t.name for t in ctx.topics.all() if t.name >= after}
    else:
        names = {str(t.name) for t in body.topics if t.name >= after}
    if (cursor is not None and cursor.partition_index < 0) or (
        not fetch_all and cursor is not None and cursor.topic_name not in names
    ):
        # Kafka's error response: the error on every topic asked for
        rejected = [
            {**_unknown_topic(str(t.name)), "error_code": ErrorCode.INVALID_REQUEST}
            for t in body.topics
        ]
        return _describe_topic_partitions_response(request, rejected, None)
    # at least one partition a response, as Kafka's max(min(limit, 2000), 1): a client paging
    # with a limit of 0 would otherwise be sent its cursor back for ever
    remaining = max(min(MAX_RESPONSE_PARTITIONS, int(body.response_partition_limit)), 1)
    topics: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []  # named topics the session may not DESCRIBE, last
    next_cursor: dict[str, Any] | None = None
    for name in sorted(names):
        if not ctx.allowed(DESCRIBE, TOPIC, name):
            if not fetch_all:
                refused.append(_refused_topic(name))
            continue
        if remaining <= 0:
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        topic = ctx.topics.get(name)
        if topic is None:
            if not fetch_all:
                operations = ctx.authorized_operations(TOPIC, name)
                topics.append({**_unknown_topic(name), "topic_authorized_operations": operations})
            continue
        first = cursor.partition_index if cursor is not None and name == after else 0
        first = min(first, topic.partitions)  # (a cursor past the last gives none of it)
        end = min(topic.partitions, first + remaining)
        entry = _topic_entry(topic, ctx, range(first, end))
        entry["topic_authorized_operations"] = ctx.authorized_operations(TOPIC, name)
        for partition in entry["partitions"]:
            # KIP-966: the leader is the only replica, so no other is eligible
            partition["eligible_leader_replicas"] = []
            partition["last_known_elr"] = []
        topics.append(entry)
        if end < topic.partitions:
            next_cursor = {"topic_name": name, "partition_index": end}
            break
        remaining -= end - first
    return _describe_topic_partitions_response(request, topics + refused, next_cursor)


def _describe_topic_partitions_response(
    request: Request, topics: list[dict[str, Any]], next_cursor: dict[str, Any] | None
) -> Any:
    return build.build(
        response_schema(ApiKey.DESCRIBE_TOPIC_PARTITIONS, request.api_version),
        {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor},
    )


def _unknown_topic(name: str) -> dict[str, Any]:
    error = (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if valid_name(name)
        else ErrorCode.INVALID_TOPIC_EXCEPTION
    )
    return {"error_code": error, "name": name, "topic_id": ZERO_UUID, "partitions": []}


def valid_name(name: str) -> bool:
    """Whether ``name`` is one Kafka allows a topic (Topic.validate)."""
    try:
        validate_name(name)
    except TopicError:
        return False
    return True


# ApiVersions (18) is added by KafkaApis, which knows the whole table.
HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.METADATA: (handle_metadata, 0, 12),
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: (handle_describe_topic_partitions, 0, 0),
}
