"""The group APIs, over :class:`~automq_py.coordinator.group_coordinator.GroupCoordinator`.

Classic protocol: JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13).
Offsets: OffsetCommit (8), OffsetFetch (9, several groups from v8), OffsetDelete (47).
Admin: ListGroups (16), DescribeGroups (15), DeleteGroups (42).
The consumer protocol (KIP-848) is in :mod:`automq_py.apis.consumer_groups`.

Handlers translate the wire messages to coordinator calls and back; every rule lives in the
coordinator. Before that they check Kafka's ACLs (``KafkaApis``): a member's requests need READ
on the group (OffsetCommit also READ on each topic), OffsetFetch and DescribeGroups DESCRIBE on
the group (only the topics the session may DESCRIBE are shown), DeleteGroups and OffsetDelete
DELETE on the group; ListGroups lists every group to a session with DESCRIBE on the cluster,
and otherwise those it may DESCRIBE.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from automq_py.apis.context import CLIENT_HOST, BrokerContext, respond
from automq_py.apis.metadata import AUTHORIZED_OPERATIONS_OMITTED
from automq_py.coordinator.classic_group import ClassicGroup, ClassicState, JoinResult
from automq_py.coordinator.classic_protocol import JoinRequest
from automq_py.coordinator.group_coordinator import NO_OFFSET, GroupCoordinator
from automq_py.coordinator.offsets import OffsetCommit
from automq_py.coordinator.records import OffsetValue
from automq_py.security.acls import AclOperation, ResourceType
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request

# DescribeGroups' "not requested" value of authorized operations
NO_OPERATIONS = AUTHORIZED_OPERATIONS_OMITTED
READ, DESCRIBE, DELETE = AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE
GROUP, TOPIC = ResourceType.GROUP, ResourceType.TOPIC
GROUP_REFUSED = ErrorCode.GROUP_AUTHORIZATION_FAILED
TOPIC_REFUSED = ErrorCode.TOPIC_AUTHORIZATION_FAILED


def group_coordinator(ctx: BrokerContext) -> GroupCoordinator:
    assert ctx.groups is not None, "the broker starts its group coordinator before serving"
    return ctx.groups


def authorized_names(
    ctx: BrokerContext, operation: AclOperation, resource_type: ResourceType, names: Iterable[str]
) -> set[str]:
    """Those of ``names`` the session may do ``operation`` on (Kafka's filterByAuthorized)."""
    return {n for n in set(names) if ctx.allowed(operation, resource_type, n)}


def error_response(request: Request, code: ErrorCode, **fields: Any) -> Any:
    """A group API's error response: ``code`` at the top, ``fields`` as Kafka's
    ``getErrorResponse`` sets them, the rest at their defaults."""
    return respond(request, {"throttle_time": 0, "error_code": code, **fields})


def millis(value: Any) -> int:
    """A kio duration (timedelta) or plain int, in ms."""
    if hasattr(value, "total_seconds"):
        return int(value.total_seconds() * 1000)
    return int(value)


# --- classic protocol ---------------------------------------------------------------------------


async def handle_join_group(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    version = request.api_version
    if not ctx.allowed(READ, GROUP, str(body.group_id)):
        return error_response(
            request, GROUP_REFUSED, generation_id=-1, leader="", member_id="", members=[]
        )
    session = millis(body.session_timeout)
    rebalance = millis(getattr(body, "rebalance_timeout", session))
    join = JoinRequest(
        group_id=str(body.group_id),
        member_id=str(body.member_id),
        group_instance_id=getattr(body, "group_instance_id", None),
        client_id=request.header.client_id or "",
        client_host=CLIENT_HOST.get(),
        session_timeout_ms=session,
        rebalance_timeout_ms=rebalance if rebalance > 0 else session,
        protocol_type=str(body.protocol_type),
        protocols=[(str(p.name), bytes(p.metadata)) for p in body.protocols],
        require_known_member_id=version >= 4,
        supports_skip_assignment=version >= 9,
    )
    result: JoinResult = await group_coordinator(ctx).join_group(join)
    return respond(
        request,
        {
            "throttle_time": 0,
            "error_code": result.error,
            "generation_id": result.generation_id,
            "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name if result.error == ErrorCode.NONE else None,
            "leader": result.leader,
            "skip_assignment": result.skip_assignment,
            "member_id": result.member_id,
            "members": [
                {"member_id": m, "group_instance_id": i, "metadata": meta}
                for m, i, meta in result.members
            ],
        },
    )


async def handle_sync_group(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    if request.api_version >= 5 and (body.protocol_type is None or body.protocol_name is None):
        # Kafka's KafkaApis checks the mandatory protocol type and name first, before the
        # group's authorization
        return error_response(request, ErrorCode.INCONSISTENT_GROUP_PROTOCOL, assignment=b"")
    if not ctx.allowed(READ, GROUP, str(body.group_id)):
        return error_response(request, GROUP_REFUSED, assignment=b"")
    assignments = {str(a.member_id): bytes(a.assignment) for a in body.assignments}
    result = await group_coordinator(ctx).sync_group(
        str(body.group_id),
        int(body.generation_id),
        str(body.member_id),
        getattr(body, "group_instance_id", None),
        getattr(body, "protocol_type", None),
        getattr(body, "protocol_name", None),
        assignments,
    )
    return respond(
        request,
        {
            "throttle_time": 0,
            "error_code": result.error,
            "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name,
            "assignment": result.assignment,
        },
    )


async def handle_heartbeat(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    if not ctx.allowed(READ, GROUP, str(body.group_id)):
        return error_response(request, GROUP_REFUSED)
    error = await group_coordinator(ctx).heartbeat(
        str(body.group_id),
        int(body.generation_id),
        str(body.member_id),
        getattr(body, "group_instance_id", None),
    )
    return respond(request, {"throttle_time": 0, "error_code": error})


async def handle_leave_group(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    if not ctx.allowed(READ, GROUP, str(body.group_id)):
        return error_response(request, GROUP_REFUSED, members=[])
    if request.api_version < 3:
        leaving: list[tuple[str, str | None]] = [(str(body.member_id), None)]
    else:
        leaving = [(str(m.member_id), m.group_instance_id) for m in body.members]
    error, per_member = await group_coordinator(ctx).leave_group(str(body.group_id), leaving)
    if request.api_version < 3:
        error = per_member[0] if error == ErrorCode.NONE else error
    return respond(
        request,
        {
            "throttle_time": 0,
            "error_code": error,
            "members": [
                {"member_id": m, "group_instance_id": i, "error_code": e}
                for (m, i), e in zip(leaving, per_member, strict=True)
            ]
            if error == ErrorCode.NONE
            else [],
        },
    )


# --- offsets ------------------------------------------------------------------------------------


async def handle_offset_commit(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    group_id = str(body.group_id)
    retention = getattr(body, "retention_time", None)
    retention_ms = -1 if retention is None else millis(retention)
    commits = [
        OffsetCommit(
            str(t.name),
            int(p.partition_index),
            int(p.committed_offset),
            int(getattr(p, "committed_leader_epoch", -1)),
            p.committed_metadata,
            retention_ms,
        )
        for t in body.topics
        for p in t.partitions
    ]
    errors: list[ErrorCode]
    if not ctx.allowed(READ, GROUP, group_id):
        errors = [GROUP_REFUSED] * len(commits)
    else:
        readable = authorized_names(ctx, READ, TOPIC, (c.topic for c in commits))
        allowed = [c for c in commits if c.topic in readable]
        # as in Kafka, with no topic left the group is not asked at all
        done = iter(
            await group_coordinator(ctx).offsets.commit(
                group_id,
                int(body.generation_id_or_member_epoch),
                str(body.member_id),
                getattr(body, "group_instance_id", None),
                allowed,
                request.api_version,
            )
            if allowed
            else []
        )
        errors = [next(done) if c.topic in readable else TOPIC_REFUSED for c in commits]
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for commit, error in zip(commits, errors, strict=True):
        by_topic.setdefault(commit.topic, []).append(
            {"partition_index": commit.partition, "error_code": error}
        )
    return respond(
        request,
        {
            "throttle_time": 0,
            "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
        },
    )


async def _fetch_group(
    ctx: BrokerContext,
    group_id: str,
    topics: Sequence[Any] | None,
    member_id: str | None,
    member_epoch: int,
    require_stable: bool = False,
    api_version: int = 8,
) -> dict[str, Any]:
    """One group's OffsetFetch answer. Offsets of topics the session may not DESCRIBE are
    not shown: left out of an answer about every topic, TOPIC_AUTHORIZATION_FAILED when asked
    for."""
    coordinator = group_coordinator(ctx)
    wanted = (
        None
        if topics is None
        else [(str(t.name), int(i)) for t in topics for i in t.partition_indexes]
    )
    refused: list[tuple[str, int]] = []
    found: list[tuple[tuple[str, int], OffsetValue | None]] = []
    if not ctx.allowed(DESCRIBE, GROUP, group_id):
        error = GROUP_REFUSED
    else:
        if wanted is not None:
            describable = authorized_names(ctx, DESCRIBE, TOPIC, (tp[0] for tp in wanted))
            refused = [tp for tp in wanted if tp[0] not in describable]
            wanted = [tp for tp in wanted if tp[0] in describable]
        error, found = await coordinator.offsets.fetch(group_id, wanted, member_id, member_epoch)
        if wanted is None and error == ErrorCode.NONE:
            describable = authorized_names(ctx, DESCRIBE, TOPIC, (tp[0] for tp, _ in found))
            found = [(tp, value) for tp, value in found if tp[0] in describable]
    if error != ErrorCode.NONE:
        # v0 and v1 have no group-level error code: their partitions carry it; from v2 the
        # answer is the error alone (Kafka's getErrorResponse)
        found = [(tp, None) for tp in wanted or []] if api_version < 2 else []
        refused = []
    # require_stable (v7+, KIP-447): an offset a transaction has not decided yet is unstable
    unstable = coordinator.offsets.pending_partitions(group_id) if require_stable else set()
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), value in found:
        if (topic, partition) in unstable and error == ErrorCode.NONE:
            shown, partition_error = None, ErrorCode.UNSTABLE_OFFSET_COMMIT
        else:
            shown, partition_error = value, error
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": shown.offset if shown else NO_OFFSET,
                "committed_leader_epoch": shown.leader_epoch if shown else -1,
                "metadata": shown.metadata if shown else "",
                "error_code": partition_error,
            }
        )
    for topic, partition in refused:
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": NO_OFFSET,
                "error_code": TOPIC_REFUSED,
            }
        )
    return {
        "group_id": group_id,
        "error_code": error,
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
    }


async def handle_offset_fetch(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    require_stable = bool(getattr(body, "require_stable", False))
    if request.api_version < 8:
        group = await _fetch_group(
            ctx, str(body.group_id), body.topics, None, -1, require_stable, request.api_version
        )
        return respond(
            request,
            {"throttle_time": 0, "error_code": group["error_code"], "topics": group["topics"]},
        )
    groups = [
        await _fetch_group(
            ctx,
            str(g.group_id),
            g.topics,
            getattr(g, "member_id", None),
            int(getattr(g, "member_epoch", -1)),
            require_stable,
        )
        for g in body.groups
    ]
    return respond(request, {"throttle_time": 0, "groups": groups})


async def handle_offset_delete(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    group_id = str(body.group_id)
    if not ctx.allowed(DELETE, GROUP, group_id):
        return error_response(request, GROUP_REFUSED, topics=[])
    wanted = [(str(t.name), int(p.partition_index)) for t in body.topics for p in t.partitions]
    readable = authorized_names(ctx, READ, TOPIC, (tp[0] for tp in wanted))

    def exists(topic: str, partition: int) -> bool:
        info = ctx.topics.get(topic)
        return info is not None and 0 <= partition < info.partitions

    # as in Kafka, a partition this cluster does not have is answered on its own
    allowed = [tp for tp in wanted if tp[0] in readable and exists(*tp)]
    error, per_partition = await group_coordinator(ctx).offsets.delete(group_id, allowed)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    if error == ErrorCode.NONE:  # a group error is the whole answer, as in Kafka
        done = iter(per_partition)
        for topic, partition in wanted:
            if topic not in readable:
                e = TOPIC_REFUSED
            elif not exists(topic, partition):
                e = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                e = next(done)
            by_topic.setdefault(topic, []).append({"partition_index": partition, "error_code": e})
    return respond(
        request,
        {
            "throttle_time": 0,
            "error_code": error,
            "topics": [{"name": n, "partitions": parts} for n, parts in by_topic.items()],
        },
    )


# --- admin --------------------------------------------------------------------------------------


async def handle_list_groups(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    error, groups = await group_coordinator(ctx).list_groups(
        getattr(body, "states_filter", ()), getattr(body, "types_filter", ())
    )
    if not ctx.allowed_on_cluster(DESCRIBE):
        groups = [g for g in groups if ctx.allowed(DESCRIBE, GROUP, g.group_id)]
    return respond(
        request,
        {
            "throttle_time": 0,
            "error_code": error,
            "groups": [
                {
                    "group_id": g.group_id,
                    "protocol_type": g.protocol_type,
                    "group_state": g.state,
                    "group_type": g.group_type,
                }
                for g in groups
            ],
        },
    )


def _describe_classic(group_id: str, group: ClassicGroup) -> dict[str, Any]:
    stable = group.is_(ClassicState.STABLE)
    protocol = group.protocol_name or ""
    return {
        "error_code": ErrorCode.NONE,
        "group_id": group_id,
        "group_state": group.state.value,
        "protocol_type": group.protocol_type or "",
        "protocol_data": protocol if stable else "",
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": m.metadata(protocol) if stable else b"",
                "member_assignment": m.assignment if stable else b"",
            }
            for m in group.members.values()
        ],
        "authorized_operations": NO_OPERATIONS,
    }


async def handle_describe_groups(ctx: BrokerContext, request: Request) -> Any:
    coordinator = group_coordinator(ctx)
    operations = request.api_version >= 3 and bool(request.body.include_authorized_operations)
    out = []
    for group_id in request.body.groups:
        if not ctx.allowed(DESCRIBE, GROUP, str(group_id)):
            out.append({"error_code": GROUP_REFUSED, "group_id": group_id, "group_state": ""})
            continue
        error, group = await coordinator.describe_group(str(group_id))
        if error != ErrorCode.NONE:
            out.append({"error_code": error, "group_id": group_id, "group_state": ""})
        elif isinstance(group, ClassicGroup):
            out.append(_describe_classic(str(group_id), group))
        else:
            # Kafka describes an unknown group as Dead, and a consumer-protocol group too, even
            # one with classic members: DescribeGroups (below v6) describes classic groups only,
            # ConsumerGroupDescribe the others
            out.append(
                {
                    "error_code": ErrorCode.NONE,
                    "group_id": group_id,
                    "group_state": ClassicState.DEAD.value,
                    "authorized_operations": NO_OPERATIONS,
                }
            )
        if operations and out[-1]["error_code"] == ErrorCode.NONE:
            out[-1]["authorized_operations"] = ctx.authorized_operations(GROUP, str(group_id))
    return respond(request, {"throttle_time": 0, "groups": out})


async def handle_delete_groups(ctx: BrokerContext, request: Request) -> Any:
    names = [str(g) for g in request.body.groups_names]
    deletable = authorized_names(ctx, DELETE, GROUP, names)
    allowed = [g for g in names if g in deletable]
    done = iter(await group_coordinator(ctx).delete_groups(allowed) if allowed else [])
    errors = [next(done) if g in deletable else GROUP_REFUSED for g in names]
    return respond(
        request,
        {
            "throttle_time": 0,
            "results": [
                {"group_id": g, "error_code": e} for g, e in zip(names, errors, strict=True)
            ],
        },
    )


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.JOIN_GROUP: (handle_join_group, 0, 9),
    ApiKey.SYNC_GROUP: (handle_sync_group, 0, 5),
    ApiKey.HEARTBEAT: (handle_heartbeat, 0, 4),
    ApiKey.LEAVE_GROUP: (handle_leave_group, 0, 5),
    ApiKey.OFFSET_COMMIT: (handle_offset_commit, 2, 9),
    ApiKey.OFFSET_FETCH: (handle_offset_fetch, 1, 9),
    ApiKey.OFFSET_DELETE: (handle_offset_delete, 0, 0),
    ApiKey.LIST_GROUPS: (handle_list_groups, 0, 5),
    ApiKey.DESCRIBE_GROUPS: (handle_describe_groups, 0, 5),
    ApiKey.DELETE_GROUPS: (handle_delete_groups, 0, 2),
}
