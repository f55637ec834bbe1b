"""The consumer group protocol (KIP-848): ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe
(69), over :class:`~automq_py.coordinator.group_coordinator.GroupCoordinator`.

As in Kafka 4.0 (KAFKA-18813): a heartbeat needs READ on the group, then DESCRIBE on every topic
the member subscribes to by name; describing a group needs DESCRIBE on it, and a group whose
assigned or target topics include one the session may not DESCRIBE is answered
TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from automq_py.apis.context import CLIENT_HOST, BrokerContext, respond
from automq_py.apis.groups import (
    DESCRIBE,
    GROUP,
    GROUP_REFUSED,
    NO_OPERATIONS,
    READ,
    TOPIC,
    TOPIC_REFUSED,
    authorized_names,
    error_response,
    group_coordinator,
    millis,
)
from automq_py.coordinator.consumer_group import (
    ConsumerGroup,
    HeartbeatRequest,
    Partitions,
    validate_heartbeat,
)
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request

# ConsumerGroupDescribe v1's MemberType
CLASSIC_MEMBER = 0
CONSUMER_MEMBER = 1


def _owned(topic_partitions: Sequence[Any] | None) -> Partitions | None:
    if topic_partitions is None:
        return None
    return {
        tp.topic_id: frozenset(int(p) for p in tp.partitions)
        for tp in topic_partitions
        if tp.topic_id is not None
    }


async def handle_consumer_group_heartbeat(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    coordinator = group_coordinator(ctx)
    group_id = str(body.group_id)
    if not ctx.allowed(READ, GROUP, group_id):
        return error_response(request, GROUP_REFUSED)
    subscribed = {str(n) for n in getattr(body, "subscribed_topic_names", None) or ()}
    if subscribed and authorized_names(ctx, DESCRIBE, TOPIC, subscribed) != subscribed:
        # Kafka 4.0 (KAFKA-18813): a subscription naming a topic the member may not DESCRIBE
        return error_response(request, TOPIC_REFUSED)
    config = coordinator.config
    # the group's own settings (kafka-configs --entity-type groups) over the broker's
    if ctx.group_configs is not None:
        session_timeout, interval = ctx.group_configs.timeouts(group_id)
    else:
        session_timeout = config.consumer_session_timeout_ms
        interval = config.consumer_heartbeat_interval_ms

    def refused(code: ErrorCode, message: str | None) -> Any:
        return respond(
            request,
            {
                "throttle_time": 0,
                "error_code": code,
                "error_message": message,
                "member_epoch": int(body.member_epoch),
                "heartbeat_interval": interval,
            },
        )

    if request.api_version >= 1 and not str(body.member_id).strip():
        # KIP-1082: from v1 the client makes its member id
        return refused(ErrorCode.INVALID_REQUEST, "MemberId can't be empty.")
    names = getattr(body, "subscribed_topic_names", None)
    heartbeat = HeartbeatRequest(
        group_id=group_id,
        member_id=str(body.member_id),
        member_epoch=int(body.member_epoch),
        instance_id=body.instance_id,
        rack_id=body.rack_id,
        rebalance_timeout_ms=millis(body.rebalance_timeout),
        subscribed_topic_names=None if names is None else [str(n) for n in names],
        subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
        server_assignor=body.server_assignor,
        owned=_owned(body.topic_partitions),
        client_id=request.header.client_id or "",
        client_host=CLIENT_HOST.get(),
    )
    # as Kafka's GroupCoordinatorService: the request is checked before the group is looked up
    invalid = validate_heartbeat(heartbeat, config.consumer_assignors)
    if invalid is not None:
        return refused(invalid.error, invalid.message)
    # a group is made only by a member joining (epoch 0): Kafka's GROUP_ID_NOT_FOUND else
    # (a classic group of consumers may become one: KIP-848's online upgrade)
    error, group, why = await coordinator.consumer_group(
        group_id, create=heartbeat.member_epoch == 0
    )
    if group is None:
        return refused(error, why)
    topics = ctx.topics
    # the topics a regex may match: those the member may DESCRIBE (Kafka's
    # filterTopicDescribeAuthorizedTopics), every one without an authorizer
    visible: set[str] = set()
    if heartbeat.subscribed_topic_regex or any(m.subscribed_regex for m in group.members.values()):
        visible = authorized_names(ctx, DESCRIBE, TOPIC, (t.name for t in topics.all()))
    result = group.heartbeat(
        heartbeat,
        coordinator.clock(),
        coordinator.resolve,
        visible,
        config.consumer_assignors,
        session_timeout,
        config.consumer_max_size,
        every_member_sees=not ctx.secured,
    )
    if result.error == ErrorCode.NONE:
        coordinator.add_consumer_group(group)  # (nothing awaited since it was made)
        stored = await coordinator.store_consumer_group(group)
        if stored != ErrorCode.NONE:
            result = type(result)(stored, result.member_id, result.member_epoch)
    assignment = None
    if result.assignment is not None:
        assignment = {
            "topic_partitions": [
                {"topic_id": t, "partitions": sorted(p)}
                for t, p in sorted(result.assignment.items(), key=lambda kv: str(kv[0]))
            ]
        }
    return respond(
        request,
        {
            "throttle_time": 0,
            "error_code": result.error,
            "error_message": result.message,
            "member_id": result.member_id,
            "member_epoch": result.member_epoch,
            "heartbeat_interval": interval,
            "assignment": assignment,
        },
    )


def _assignment_entry(
    partitions: Partitions, names: Callable[[uuid.UUID], str | None]
) -> dict[str, Any]:
    """An assignment as ConsumerGroupDescribe lists it: each topic by id and by its name now,
    a topic no longer there left out (Kafka's topicPartitionsFromMap)."""
    entries = []
    for tid, parts in partitions.items():
        name = names(tid)
        if name is not None:
            entries.append({"topic_id": tid, "topic_name": name, "partitions": sorted(parts)})
    return {"topic_partitions": entries}


async def handle_consumer_group_describe(ctx: BrokerContext, request: Request) -> Any:
    coordinator = group_coordinator(ctx)
    operations = bool(request.body.include_authorized_operations)
    out = []
    for group_id in request.body.group_ids:
        if not ctx.allowed(DESCRIBE, GROUP, str(group_id)):
            out.append({"error_code": GROUP_REFUSED, "group_id": group_id})
            continue
        error, group = await coordinator.describe_group(str(group_id))
        message = None
        if error == ErrorCode.NONE and not isinstance(group, ConsumerGroup):
            error = ErrorCode.GROUP_ID_NOT_FOUND
            # Kafka's words (the Java admin then describes the group with DescribeGroups)
            if group is None:
                message = f"Group {group_id} not found."
            else:
                message = f"Group {group_id} is not a consumer group."
        if error != ErrorCode.NONE or not isinstance(group, ConsumerGroup):
            out.append(
                {
                    "error_code": error,
                    "error_message": message,
                    "group_id": group_id,
                    "group_state": "",  # (the schema's default, as Kafka's error entries)
                    "authorized_operations": NO_OPERATIONS,
                }
            )
            continue
        if not _may_see_topics(ctx, group, coordinator.topic_name):
            out.append(
                {
                    "error_code": TOPIC_REFUSED,
                    "error_message": "The group has described topic(s) that the client is not "
                    "authorized to describe.",
                    "group_id": group_id,
                }
            )
            continue
        out.append(
            {
                "error_code": ErrorCode.NONE,
                "group_id": group_id,
                "group_state": group.state,
                "group_epoch": group.group_epoch,
                "assignment_epoch": group.assignment_epoch,
                "assignor_name": group.preferred_assignor(coordinator.config.consumer_assignors),
                "members": [
                    {
                        "member_id": m.member_id,
                        "instance_id": m.instance_id,
                        "rack_id": m.rack_id,
                        "member_epoch": m.epoch,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": sorted(m.subscribed_names),
                        "subscribed_topic_regex": m.subscribed_regex,
                        "assignment": _assignment_entry(m.assigned, coordinator.topic_name),
                        "target_assignment": _assignment_entry(
                            group.target.get(m.member_id, {}), coordinator.topic_name
                        ),
                        # v1 (KIP-1099): 0 a member of the classic protocol, 1 of the consumer
                        "member_type": CLASSIC_MEMBER if m.classic is not None else CONSUMER_MEMBER,
                    }
                    for m in group.members.values()
                ],
                "authorized_operations": ctx.authorized_operations(GROUP, str(group_id))
                if operations
                else NO_OPERATIONS,
            }
        )
    return respond(request, {"throttle_time": 0, "groups": out})


def _may_see_topics(
    ctx: BrokerContext, group: ConsumerGroup, names: Callable[[uuid.UUID], str | None]
) -> bool:
    """Whether the session may DESCRIBE every topic the group's members are assigned or are
    to be (Kafka 4.0, KAFKA-18813: otherwise the group is not described)."""
    found = (
        names(topic_id)
        for m in group.members.values()
        for partitions in (m.assigned, group.target.get(m.member_id, {}))
        for topic_id in partitions
    )
    assigned = {name for name in found if name is not None}  # (a deleted topic names none)
    return authorized_names(ctx, DESCRIBE, TOPIC, assigned) == assigned


# Kafka 3.9's maxima but one: ConsumerGroupHeartbeat v1 (Kafka 4.0: regex subscriptions and
# member ids the client makes, KIP-848 GA), which librdkafka's group.protocol=consumer requires
# ("ConsumerGroupHeartbeatRequest not supported by broker" against v0). OffsetCommit v0-v1 and
# OffsetFetch v0 are not served: kio has no schema for them (Kafka 4.0 removed them, KIP-896;
# Kafka 3.9's KRaft broker only answers v0 with an error, the offsets of v0 living in ZooKeeper).
HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (handle_consumer_group_heartbeat, 0, 1),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (handle_consumer_group_describe, 0, 1),
}
