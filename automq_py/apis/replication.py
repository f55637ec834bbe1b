"""ElectLeaders (43), AlterPartitionReassignments (45), ListPartitionReassignments (46): where a
partition's replicas are and which one leads, Kafka's ``ReplicationControlManager`` operations.

Every partition has one replica, which leads it: object storage keeps its data durable and any
broker can serve it. So, as a Kafka 3.9 controller decides for such partitions
(``ReplicationControlManager`` ``electLeader``, ``alterPartitionReassignment``,
``listPartitionReassignments``):

* an election is never needed: the leader is the preferred replica and it is live, so both a
  preferred and an unclean election answer ELECTION_NOT_NEEDED; an election for all partitions
  (null topic partitions) lists only the partitions that needed one (none: every topic comes
  back with an empty list);
* a reassignment moves the partition's leadership to the first broker named (a single broker:
  to itself, which changes nothing); one naming a broker that is not registered and live is
  INVALID_REPLICA_ASSIGNMENT, as is an empty or repeated replica list; cancelling (null
  replicas) is NO_REASSIGNMENT_IN_PROGRESS;
* a move is recorded at once and takes well under a second (nothing is copied), so nothing is
  ever listed as being reassigned.

Unknown topics and partitions are UNKNOWN_TOPIC_OR_PARTITION per partition, with Kafka's
messages.

ElectLeaders and AlterPartitionReassignments need ALTER on the cluster, ListPartitionReassignments
DESCRIBE; a refusal is Kafka's error response for the request (CLUSTER_AUTHORIZATION_FAILED at
the top, and on every partition named where the response lists them).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.controller import membership
from automq_py.controller.cluster_records import NO_LEADER
from automq_py.security.acls import AclOperation
from automq_py.topics import TopicInfo
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema

# Kafka's Errors.ELECTION_NOT_NEEDED message, which its ApiError(error) answers with
ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."

Outcome = tuple[ErrorCode, str | None]

# the message of Kafka's ClusterAuthorizationException from AuthHelper.authorizeClusterOperation
NOT_AUTHORIZED = "Request is not authorized."
REFUSED: Outcome = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, NOT_AUTHORIZED)


class ElectionType(IntEnum):
    PREFERRED = 0
    UNCLEAN = 1


# -- the decisions -------------------------------------------------------------------------------


def elect_leader(topic: TopicInfo | None, name: str, index: int) -> Outcome:
    """The outcome of an election (of either type) for partition ``name``-``index``."""
    if topic is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such topic as {name}"
    if not 0 <= index < topic.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such partition as {name}-{index}"
    # the only replica leads: it is the preferred leader, and a leader exists
    return ErrorCode.ELECTION_NOT_NEEDED, ELECTION_NOT_NEEDED_MESSAGE


def reassign(
    topic: TopicInfo | None,
    name: str,
    index: int,
    replicas: Sequence[int] | None,
    brokers: frozenset[int],
) -> Outcome:
    """The outcome of reassigning partition ``name``-``index`` to ``replicas`` (None: cancel
    its reassignment); ``brokers`` are the registered broker ids."""
    if topic is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find a topic named {name}."
    if not 0 <= index < topic.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find partition {name}:{index}."
    if replicas is None:
        # Kafka's message is the error's own, which its ApiError leaves out
        return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None
    problem = assignment_problem(replicas, brokers)
    if problem is not None:
        return ErrorCode.INVALID_REPLICA_ASSIGNMENT, problem
    # the only valid target is the current replica list: nothing to move
    return ErrorCode.NONE, None


def assignment_problem(replicas: Sequence[int], brokers: frozenset[int]) -> str | None:
    """What is wrong with a manual replica list, in the order Kafka's
    ``validateManualPartitionAssignment`` checks; None if nothing is."""
    if not replicas:
        return "The manual partition assignment includes an empty replica list."
    previous = None
    for broker in sorted(replicas):
        if broker not in brokers:
            return (
                f"The manual partition assignment includes broker {broker}, but no such "
                "broker is registered."
            )
        if broker == previous:
            return f"The manual partition assignment includes the broker {broker} more than once."
        previous = broker
    return None


# -- ElectLeaders --------------------------------------------------------------------------------


async def handle_elect_leaders(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    election = int(getattr(body, "election_type", ElectionType.PREFERRED))  # v0: preferred
    requested = body.topic_partitions
    schema = response_schema(ApiKey.ELECT_LEADERS, request.api_version)
    failed: Outcome | None = None
    if not ctx.allowed_on_cluster(AclOperation.ALTER):
        failed = REFUSED
    elif election not in tuple(ElectionType):
        failed = ErrorCode.INVALID_REQUEST, f"Unknown election type {election}"
    if failed is not None:
        # Kafka fails the whole request: its error on every partition asked for
        results = [
            {
                "topic": str(t.topic),
                "partition_result": [_partition_result(int(p), failed) for p in t.partitions],
            }
            for t in requested or ()
        ]
        return build.build(
            schema,
            {"throttle_time": 0, "error_code": failed[0], "replica_election_results": results},
        )
    if requested is None:
        # every partition; those that already have the leader wanted are left out
        results = []
        for topic in ctx.topics.all():
            outcomes = [(i, elect_leader(topic, topic.name, i)) for i in range(topic.partitions)]
            results.append(
                {
                    "topic": topic.name,
                    "partition_result": [
                        _partition_result(i, outcome)
                        for i, outcome in outcomes
                        if outcome[0] != ErrorCode.ELECTION_NOT_NEEDED
                    ],
                }
            )
    else:
        results = [
            {
                "topic": str(t.topic),
                "partition_result": [
                    _partition_result(
                        int(p), elect_leader(ctx.topics.get(str(t.topic)), str(t.topic), int(p))
                    )
                    for p in t.partitions
                ],
            }
            for t in requested
        ]
    return build.build(
        schema,
        {"throttle_time": 0, "error_code": ErrorCode.NONE, "replica_election_results": results},
    )


def _partition_result(index: int, outcome: Outcome) -> dict[str, Any]:
    return {"partition_id": index, "error_code": outcome[0], "error_message": outcome[1]}


# -- partition reassignments ---------------------------------------------------------------------


async def handle_alter_partition_reassignments(ctx: BrokerContext, request: Request) -> Any:
    """In a cluster a partition moves to the first broker its new replica list names (its one
    replica: the data is in object storage). As in Kafka the reassignment is recorded and the
    answer given at once; it completes behind (ListPartitionReassignments shows it until then):
    the partition's leader uploads what it has not yet made durable while still serving, then
    hands it over, so it is unwritable only for the little that arrived meanwhile. A partition
    already led there changes nothing; a null replica list cancels a pending reassignment."""
    schema = response_schema(ApiKey.ALTER_PARTITION_REASSIGNMENTS, request.api_version)
    if not ctx.allowed_on_cluster(AclOperation.ALTER):
        refused = [
            {
                "name": str(t.name),
                "partitions": [
                    {
                        "partition_index": int(p.partition_index),
                        "error_code": REFUSED[0],
                        "error_message": REFUSED[1],
                    }
                    for p in t.partitions
                ],
            }
            for t in request.body.topics
        ]
        return build.build(
            schema,
            {
                "throttle_time": 0,
                "error_code": REFUSED[0],
                "error_message": REFUSED[1],
                "responses": refused,
            },
        )
    brokers = ctx.broker_ids
    cluster = ctx.cluster
    responses: list[dict[str, Any]] = []
    moves: dict[str, dict[int, int]] = {}
    for t in request.body.topics:
        name = str(t.name)
        topic = ctx.topics.get(name)
        leaders = cluster.topic_leaders(name) if cluster is not None else None
        partitions: list[dict[str, Any]] = []
        for p in t.partitions:
            index = int(p.partition_index)
            replicas = None if p.replicas is None else [int(r) for r in p.replicas]
            code, message = reassign(topic, name, index, replicas, brokers)
            if replicas is None and leaders is not None and leaders.target(index) != NO_LEADER:
                code, message = ErrorCode.NONE, None  # a pending one to cancel
                moves.setdefault(name, {})[index] = NO_LEADER
            elif code == ErrorCode.NONE and replicas and cluster is not None:
                moves.setdefault(name, {})[index] = replicas[0]
            partitions.append(
                {"partition_index": index, "error_code": code, "error_message": message}
            )
        responses.append({"name": name, "partitions": partitions})
    if moves:
        try:
            await ctx.replicas.storage.metadata.change(
                lambda image: (membership.request_moves(image, moves), None)
            )
        except Exception as e:  # a broker gone meanwhile, the metadata unreachable
            for response in responses:
                for partition in response["partitions"]:
                    if partition["partition_index"] in moves.get(response["name"], {}):
                        partition["error_code"] = ErrorCode.UNKNOWN_SERVER_ERROR
                        partition["error_message"] = str(e)
    return build.build(
        schema,
        {
            "throttle_time": 0,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "responses": responses,
        },
    )


async def handle_list_partition_reassignments(ctx: BrokerContext, request: Request) -> Any:
    """The reassignments still pending: the partition's replica list as it will be, the broker
    being added and the one being removed. As Kafka does, partitions asked for that are not
    being reassigned, or do not exist, are left out without an error."""
    schema = response_schema(ApiKey.LIST_PARTITION_REASSIGNMENTS, request.api_version)
    if not ctx.allowed_on_cluster(AclOperation.DESCRIBE):
        return build.build(
            schema,
            {
                "throttle_time": 0,
                "error_code": REFUSED[0],
                "error_message": REFUSED[1],
                "topics": [],
            },
        )
    cluster = ctx.cluster
    pending: dict[str, dict[int, tuple[int, int]]] = {}
    if cluster is not None:
        for name, leaders in cluster.all_leaders().items():
            for index, target in leaders.pending().items():
                pending.setdefault(name, {})[index] = (target, leaders.leader(index))
    asked = request.body.topics
    if asked is not None:
        wanted = {str(t.name): {int(i) for i in t.partition_indexes} for t in asked}
        pending = {
            name: {i: v for i, v in parts.items() if i in wanted[name]}
            for name, parts in pending.items()
            if name in wanted
        }
    topics = [
        {
            "name": name,
            "partitions": [
                {
                    "partition_index": index,
                    "replicas": [target],
                    "adding_replicas": [target],
                    "removing_replicas": [] if leader == NO_LEADER else [leader],
                }
                for index, (target, leader) in sorted(parts.items())
            ],
        }
        for name, parts in sorted(pending.items())
        if parts
    ]
    return build.build(
        schema,
        {"throttle_time": 0, "error_code": ErrorCode.NONE, "error_message": None, "topics": topics},
    )


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.ELECT_LEADERS: (handle_elect_leaders, 0, 2),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (handle_alter_partition_reassignments, 0, 0),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (handle_list_partition_reassignments, 0, 0),
}
