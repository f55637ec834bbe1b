"""CreateTopics (19), DeleteTopics (20) and CreatePartitions (37).

A partition has one replica, whatever replication factor is asked for: object storage keeps
every byte durable, and every broker can serve any partition. So any replication factor Kafka
accepts, and a manual replica assignment naming this cluster's brokers, is accepted and gives
each partition one replica: CreateTopics answers replication factor 1, and Metadata and
DescribeTopicPartitions list that one replica, the leader, as the replicas and the ISR.

Authorization is a KRaft controller's (``ControllerApis``): CreateTopics needs CREATE on the
cluster or on each topic, and answers a created topic's configs only with DESCRIBE_CONFIGS on
it (else ``topic_config_error_code`` TOPIC_AUTHORIZATION_FAILED); DeleteTopics needs DELETE
on the cluster or on each topic, and a topic named by id is answered without its name unless
the session may DESCRIBE it; CreatePartitions needs ALTER on each topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.apis.replication import assignment_problem
from automq_py.security.acls import AclOperation, ResourceType
from automq_py.security.session import SESSION, THROTTLE_MS
from automq_py.topic_config import effective_topic_config
from automq_py.topics import (
    INTERNAL_TOPICS,
    TopicError,
    check_collision,
    check_partition_count,
    check_partitions_added,
    validate_name,
)
from protocol import build
from protocol.api_keys import ApiKey
from protocol.build import ZERO_UUID
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema
from storage.config_def import ConfigError

log = logging.getLogger("automq.apis.topics")

TOPIC = ResourceType.TOPIC

# longest a CreateTopics waits for its partitions to open before answering
CREATE_WAIT_S = 5.0


def requested_replication(replication_factor: int, default: int) -> int:
    """The replication factor a CreateTopics without a manual assignment asks for: its own, or
    ``default`` (``default.replication.factor``) for -1; refused as Kafka's controller refuses
    it. The topic gets one replica either way."""
    if replication_factor == 0 or replication_factor < -1:
        raise TopicError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        )
    return default if replication_factor == -1 else replication_factor


def manual_partition_count(
    num_partitions: int,
    replication_factor: int,
    assignments: Sequence[tuple[int, Sequence[int]]],
    brokers: frozenset[int],
) -> int:
    """The partition count of a CreateTopics manual assignment (``(partition index, replica
    broker ids)`` pairs), checked in the order and with the messages of Kafka's controller
    (``ReplicationControlManager.createTopic``). Each partition gets one replica: its first
    listed broker, which the checks make a registered one (today always this broker)."""
    if replication_factor != -1:
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but replication factor was not set "
            "to -1.",
        )
    if num_partitions != -1:
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but numPartitions was not set to -1.",
        )
    placed: set[int] = set()
    for index, replicas in assignments:
        if index in placed:
            raise TopicError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Found multiple manual partition assignments for partition {index}",
            )
        _check_replicas(replicas, brokers)
        placed.add(index)
    if placed != set(range(len(placed))):
        raise TopicError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "partitions should be a consecutive 0-based integer sequence",
        )
    return len(placed)


def check_new_partition_assignments(
    added: int, assignments: Sequence[Sequence[int]], brokers: frozenset[int]
) -> None:
    """A CreatePartitions manual assignment of ``added`` new partitions, checked as Kafka's
    controller does (``ReplicationControlManager.createPartitions``); each new partition gets
    one replica."""
    if len(assignments) != added:
        raise TopicError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"Attempted to add {added} additional partition(s), but only {len(assignments)} "
            "assignment(s) were specified.",
        )
    for replicas in assignments:
        _check_replicas(replicas, brokers)


def _check_replicas(replicas: Sequence[int], brokers: frozenset[int]) -> None:
    problem = assignment_problem(replicas, brokers)
    if problem is not None:
        raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, problem)


# Kafka's metadata log's name: no topic may take it
CLUSTER_METADATA_TOPIC = "__cluster_metadata"


async def handle_create_topics(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    results = []
    opening: list[asyncio.Task[None]] = []
    may_create_any = ctx.allowed_on_cluster(AclOperation.CREATE)
    named = Counter(str(t.name) for t in body.topics)
    answered: set[str] = set()
    for t in body.topics:
        name = str(t.name)
        entry: dict[str, Any] = {"name": name, "error_code": ErrorCode.NONE}
        if named[name] > 1:
            # Kafka's controller creates none of a name given twice, and answers it once
            if name not in answered:
                answered.add(name)
                entry.update(
                    error_code=ErrorCode.INVALID_REQUEST,
                    error_message="Duplicate topic name.",
                    num_partitions=-1,
                    replication_factor=-1,
                )
                results.append(entry)
            continue
        if name == CLUSTER_METADATA_TOPIC:  # (Kafka's own log, which no client may create)
            entry.update(
                error_code=ErrorCode.INVALID_REQUEST,
                error_message=f"Creation of internal topic {name} is prohibited.",
            )
            results.append(entry)
            continue
        if not (may_create_any or ctx.allowed(AclOperation.CREATE, TOPIC, name)):
            entry.update(
                error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                error_message="Authorization failed.",
            )
            results.append(entry)
            continue
        partitions = int(t.num_partitions)
        if partitions == -1:
            partitions = ctx.num_partitions
        configs = {str(c.name): str(c.value) for c in t.configs if c.value is not None}
        replication = int(t.replication_factor)
        try:
            # in the order of Kafka's controller: the name, whether it exists, the configs,
            # then the partitions (so an existing topic is TOPIC_ALREADY_EXISTS whatever else
            # the request asks, which `kafka-topics.sh --if-not-exists` takes as success)
            validate_name(name)
            if ctx.topics.get(name) is not None:
                raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
            check_collision(name, (info.name for info in ctx.topics.all()))
            nulls = [str(c.name) for c in t.configs if c.value is None]
            if nulls:
                raise TopicError(
                    ErrorCode.INVALID_CONFIG,
                    f"Null value not supported for topic configs: {','.join(nulls)}",
                )
            effective = effective_topic_config(ctx.replicas.topic_defaults, configs, strict=True)
            assignments = None
            if t.assignments:
                listed = [
                    (int(a.partition_index), [int(b) for b in a.broker_ids]) for a in t.assignments
                ]
                partitions = manual_partition_count(
                    int(t.num_partitions), replication, listed, ctx.broker_ids
                )
                assignments = [replicas for _, replicas in sorted(listed)]
                requested = 1  # one replica a partition: the first live broker listed
            else:
                requested = requested_replication(
                    replication, ctx.config.default_replication_factor
                )
            check_partition_count(partitions)
            take_mutations(ctx, request, partitions, strict_since=6)
            if not body.validate_only:
                info = await ctx.topics.create(name, partitions, configs, assignments)
                opening.append(ctx.replicas.open_in_background(info))
                entry["topic_id"] = info.topic_id
                if requested > 1:
                    log.info(
                        "topic %s: replication factor %d%s recorded as one replica per "
                        "partition: object storage keeps the data durable and every broker "
                        "can serve any partition",
                        name,
                        requested,
                        " (default.replication.factor)" if replication == -1 else "",
                    )
            if ctx.allowed(AclOperation.DESCRIBE_CONFIGS, TOPIC, name):
                # every config the topic has in effect and where it comes from, by name, as
                # Kafka's controller lists them (AdminClient's CreateTopicsResult.config)
                described = effective.describe(ctx.config_layers())
                entry.update(
                    num_partitions=partitions,
                    replication_factor=1,
                    configs=[
                        {
                            "name": c.name,
                            "value": c.value,
                            "read_only": False,
                            "config_source": c.source,
                            "is_sensitive": False,
                        }
                        for c in sorted(described, key=lambda c: c.name)
                    ],
                )
            else:
                # Kafka's controller leaves the count, the factor and the configs out
                entry.update(
                    configs=[], topic_config_error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED
                )
        except TopicError as e:
            entry.update(
                error_code=e.code, error_message=str(e), num_partitions=-1, replication_factor=-1
            )
        except ConfigError as e:
            entry.update(
                error_code=ErrorCode.INVALID_CONFIG,
                error_message=str(e),
                num_partitions=-1,
                replication_factor=-1,
            )
        results.append(entry)
    if opening:
        # answer once the new partitions are open (within the request's timeout), so the
        # first produce does not wait for it; they go on opening if the wait runs out
        timeout = body.timeout
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout / 1000
        if seconds > 0:
            await asyncio.wait(opening, timeout=min(seconds, CREATE_WAIT_S))
    return build.build(
        response_schema(ApiKey.CREATE_TOPICS, request.api_version),
        {"throttle_time": 0, "topics": results},
    )


async def handle_delete_topics(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    names: list[tuple[str | None, Any]] = []
    if getattr(body, "topics", None):
        for t in body.topics:
            names.append((t.name, getattr(t, "topic_id", None)))
    else:
        names = [(str(n), None) for n in getattr(body, "topic_names", ())]
    responses = []
    if not ctx.config.delete_topic_enable:
        # Kafka's controller refuses the whole request first (v0-v2 know no TOPIC_DELETION_DISABLED)
        code = (
            ErrorCode.TOPIC_DELETION_DISABLED
            if request.api_version >= 3
            else ErrorCode.INVALID_REQUEST
        )
        responses = [
            {
                "name": name,
                "topic_id": topic_id,
                "error_code": code,
                "error_message": "Topic deletion is disabled.",
            }
            for name, topic_id in names
        ]
        names = []
    refused, names = _checked_rows(ctx, names)
    responses += refused
    may_delete_any = ctx.allowed_on_cluster(AclOperation.DELETE)
    for name, topic_id in names:
        by_id = name is None and topic_id is not None
        if by_id:
            found = ctx.topics.by_id(topic_id)
            name = found.name if found else None
        entry: dict[str, Any] = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.NONE}
        try:
            if name is None:
                raise TopicError(ErrorCode.UNKNOWN_TOPIC_ID, f"unknown topic id {topic_id}")
            if not may_delete_any:
                allowed, entry["name"] = _may_delete(ctx, name, by_id)
                if not allowed:
                    raise TopicError(
                        ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed."
                    )
            if name in INTERNAL_TOPICS:
                raise TopicError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION, f"{name} is internal: it cannot be deleted"
                )
            found = ctx.topics.get(name)
            if found is not None:
                take_mutations(ctx, request, found.partitions, strict_since=5)
                await ctx.replicas.close_topic(found)
            info = await ctx.topics.delete(name)
            entry["topic_id"] = info.topic_id
            if ctx.groups is not None:
                # as Kafka does, groups forget their offsets of a deleted topic
                await ctx.groups.offsets.delete_topic(name)
        except TopicError as e:
            entry.update(error_code=e.code, error_message=str(e))
        responses.append(entry)
    if any(e["error_code"] == ErrorCode.NONE for e in responses):
        # the logs' streams go after the answer, as Kafka deletes a topic's logs later
        ctx.replicas.destroy_deleted_in_background(lambda i: ctx.topics.by_id(i) is not None)
    return build.build(
        response_schema(ApiKey.DELETE_TOPICS, request.api_version),
        {"throttle_time": 0, "responses": responses},
    )


def take_mutations(
    ctx: BrokerContext, request: Request, partitions: int, strict_since: int
) -> None:
    """Take ``partitions`` created or deleted from the client's ``controller_mutation_rate``
    (KIP-599), where Kafka's controller takes them: after a topic's own checks, validate-only
    requests too. From ``strict_since`` on, the request's version knows
    THROTTLING_QUOTA_EXCEEDED, which refuses the topic while the client is in debt; the
    response says the throttle time either way."""
    quotas = ctx.quotas
    if quotas is None or not quotas.any:
        return
    allowed, throttle = quotas.take_mutations(
        SESSION.get().user,
        request.header.client_id or "",
        partitions,
        strict=request.api_version >= strict_since,
    )
    if throttle > THROTTLE_MS.get():
        THROTTLE_MS.set(throttle)
    if not allowed:
        raise TopicError(
            ErrorCode.THROTTLING_QUOTA_EXCEEDED, "The throttling quota has been exceeded."
        )


def _checked_rows(
    ctx: BrokerContext, rows: list[tuple[str | None, Any]]
) -> tuple[list[dict[str, Any]], list[tuple[str | None, Any]]]:
    """The DeleteTopics rows Kafka's controller refuses before it authorizes or deletes any
    (INVALID_REQUEST: neither a name nor an id, both, a name or an id given twice, answered
    once, a name whose topic another row names by id), and the others, in order."""

    def has_id(topic_id: Any) -> bool:
        return topic_id is not None and topic_id != ZERO_UUID

    names = Counter(n for n, i in rows if n is not None and not has_id(i))
    ids = Counter(i for n, i in rows if n is None and has_id(i))
    refused: list[dict[str, Any]] = []
    kept: list[tuple[str | None, Any]] = []
    answered: set[Any] = set()

    def refuse(name: str | None, topic_id: Any, message: str) -> None:
        refused.append(
            {
                "name": name,
                "topic_id": topic_id if has_id(topic_id) else ZERO_UUID,
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": message,
            }
        )

    for name, topic_id in rows:
        if name is None and not has_id(topic_id):
            refuse(None, None, "Neither topic name nor id were specified.")
        elif name is not None and has_id(topic_id):
            refuse(name, topic_id, "You may not specify both topic name and topic id.")
        elif name is not None and names[name] > 1:
            if name not in answered:  # (answered once)
                answered.add(name)
                refuse(name, None, "Duplicate topic name.")
        elif name is None and ids[topic_id] > 1:
            if topic_id not in answered:
                answered.add(topic_id)
                refuse(None, topic_id, "Duplicate topic id.")
        else:
            kept.append((name, topic_id))
    by_id = {i for n, i in kept if n is None}
    out: list[tuple[str | None, Any]] = []
    for name, topic_id in kept:
        found = ctx.topics.get(name) if name is not None else None
        if found is not None and found.topic_id in by_id:
            refuse(
                name,
                found.topic_id,
                "The provided topic name maps to an ID that was already supplied.",
            )
        else:
            out.append((name, topic_id))
    return refused, out


def _may_delete(ctx: BrokerContext, name: str, by_id: bool) -> tuple[bool, str | None]:
    """Whether the session may delete topic ``name`` (asked for ``by_id`` or by name), as
    Kafka's controller decides, and the name to answer with: a topic asked for by id that the
    session may not DESCRIBE is answered without it. One asked for by name that the session may
    not DESCRIBE is refused whether it exists or not; an unknown one it may DESCRIBE is left to
    the delete (UNKNOWN_TOPIC_OR_PARTITION)."""
    describable = ctx.allowed(AclOperation.DESCRIBE, TOPIC, name)
    if not by_id and not describable:
        return False, name
    if not by_id and ctx.topics.get(name) is None:
        return True, name
    deletable = ctx.allowed(AclOperation.DELETE, TOPIC, name)
    return deletable, name if describable or deletable else None


async def handle_create_partitions(ctx: BrokerContext, request: Request) -> Any:
    """Grow topics' partition counts; the new partitions open (empty) on first use."""
    body = request.body
    repeated = Counter(str(t.name) for t in body.topics)
    results = []
    for t in body.topics:
        name, count = str(t.name), int(t.count)
        entry: dict[str, Any] = {"name": name, "error_code": ErrorCode.NONE, "error_message": None}
        try:
            if repeated[name] > 1:
                raise TopicError(ErrorCode.INVALID_REQUEST, f"topic {name!r} appears twice")
            if not ctx.allowed(AclOperation.ALTER, TOPIC, name):
                raise TopicError(
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED, "The topic authorization is failed."
                )
            info = ctx.topics.get(name)
            if info is None:
                raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            check_partitions_added(name, info.partitions, count)
            check_partition_count(count)
            assignments = None
            if t.assignments is not None:
                assignments = [[int(b) for b in a.broker_ids] for a in t.assignments]
                check_new_partition_assignments(
                    count - info.partitions, assignments, ctx.broker_ids
                )
            take_mutations(ctx, request, count - info.partitions, strict_since=3)
            if not body.validate_only:
                await ctx.topics.update(info, partitions=count, assignments=assignments)
        except TopicError as e:
            entry.update(error_code=e.code, error_message=str(e))
        results.append(entry)
    return build.build(
        response_schema(ApiKey.CREATE_PARTITIONS, request.api_version),
        {"throttle_time": 0, "results": results},
    )


# Kafka 3.9's maxima. CreateTopics v0-v1 and DeleteTopics v0, which Kafka 3.9 also serves, are
# not: kio has no schema for them (Kafka 4.0 removed them, KIP-896).
HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.CREATE_TOPICS: (handle_create_topics, 2, 7),
    ApiKey.DELETE_TOPICS: (handle_delete_topics, 1, 6),
    ApiKey.CREATE_PARTITIONS: (handle_create_partitions, 0, 3),
}
