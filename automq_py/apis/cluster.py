"""DescribeCluster (60): the cluster's live brokers and its controller. UpdateFeatures (57):
changing the finalized level of a feature flag (KIP-584). DescribeQuorum (55): the metadata
quorum, as ``kafka-metadata-quorum`` shows it.

As in Kafka (``AuthHelper.computeDescribeClusterResponse``) no ACL is needed to ask; the
cluster's authorized operations, when asked for, are 0 without DESCRIBE on the cluster.

UpdateFeatures is checked as Kafka 3.9's controller checks it (``FeatureControlManager``):
an update of an unknown upgrade type, to a level below 0 or outside what the broker supports,
or in the wrong direction for its type, fails the whole request with INVALID_UPDATE_VERSION
and Kafka's message; a level equal to the one finalized changes nothing and succeeds. The
features are finalized at the highest level automq-py serves, so no upgrade is left, and a
downgrade is refused: of ``metadata.version`` as Kafka refuses one that may lose metadata, of
``group.version`` because the consumer rebalance protocol (KIP-848) is always served. Without
ALTER on the cluster the answer is CLUSTER_AUTHORIZATION_FAILED. v0-v1, Kafka 3.9's; v0's
``allow_downgrade`` is a safe downgrade.
"""

from __future__ import annotations

import time
from typing import Any, cast

from automq_py.apis.context import BrokerContext, respond
from automq_py.apis.metadata import AUTHORIZED_OPERATIONS_OMITTED, FEATURES
from automq_py.security.acls import AclOperation
from automq_py.security.session import SESSION
from protocol import build
from protocol.api_keys import ApiKey
from protocol.build import ZERO_UUID
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema

BROKER_ENDPOINT = 1
# Kafka's EndpointType, but UNKNOWN (0) and BROKER (1), which this broker is
ENDPOINT_TYPES = {2: "CONTROLLER"}


async def handle_describe_cluster(ctx: BrokerContext, request: Request) -> Any:
    endpoint_type = int(getattr(request.body, "endpoint_type", BROKER_ENDPOINT))
    operations = AUTHORIZED_OPERATIONS_OMITTED
    if request.body.include_cluster_authorized_operations:
        operations = ctx.cluster_authorized_operations()
    brokers = [
        {
            "broker_id": b["node_id"],
            "host": b["host"],
            "port": b["port"],
            "rack": b["rack"],
            "is_fenced": False,
        }
        for b in ctx.broker_entries()
    ]
    cluster = ctx.cluster
    if getattr(request.body, "include_fenced_brokers", False) and cluster is not None:
        # v2 (KIP-1073): the registered brokers fenced too, said so, on the client's listener
        listener = SESSION.get().listener
        for registration in cluster.brokers().values():
            endpoint = registration.endpoint(listener) if registration.fenced else None
            if endpoint is not None:
                brokers.append(
                    {
                        "broker_id": registration.node_id,
                        "host": endpoint[0],
                        "port": endpoint[1],
                        "rack": registration.rack,
                        "is_fenced": True,
                    }
                )
    brokers.sort(key=lambda b: cast(int, b["broker_id"]))  # (by id, whichever are listed)
    data: dict[str, Any] = {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "endpoint_type": endpoint_type,
        "cluster_id": ctx.cluster_id,
        "controller_id": ctx.controller_id,
        "brokers": brokers,
        "cluster_authorized_operations": operations,
    }
    if endpoint_type != BROKER_ENDPOINT:
        # Kafka's AuthHelper.computeDescribeClusterResponse: the error alone, every other
        # field at its default. A client asks for controllers (2) where bootstrap.controllers
        # points it at what it takes for a controller endpoint.
        name = ENDPOINT_TYPES.get(endpoint_type)
        data = {
            "throttle_time": 0,
            "error_code": ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
            "error_message": f"Unsupported endpoint type {endpoint_type}",
            "endpoint_type": BROKER_ENDPOINT,
            "cluster_id": "",
            "controller_id": -1,
            "brokers": [],
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }
        if name is not None:
            data.update(
                error_code=ErrorCode.MISMATCHED_ENDPOINT_TYPE,
                error_message="The request was sent to an endpoint of type BROKER, but we "
                f"wanted an endpoint of type {name}",
            )
    return build.build(response_schema(ApiKey.DESCRIBE_CLUSTER, request.api_version), data)


# FeatureUpdate.UpgradeType's codes
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


async def handle_update_features(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    if not ctx.allowed_on_cluster(AclOperation.ALTER):
        return _features_answer(request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None)
    updates: dict[str, tuple[int, int]] = {}  # the last update of a feature counts, as in Kafka
    for update in body.feature_updates:
        if request.api_version == 0:
            kind = SAFE_DOWNGRADE if update.allow_downgrade else UPGRADE
        else:
            kind = int(update.upgrade_type)
        updates[str(update.feature)] = (int(update.max_version_level), kind)
    for name, (level, kind) in updates.items():
        problem = feature_update_problem(ctx.node_id, name, level, kind)
        if problem is not None:
            message = (
                "The update failed for all features since the following feature had an error: "
                + problem
            )
            return _features_answer(request, ErrorCode.INVALID_UPDATE_VERSION, message)
    # nothing changes: every level asked for is the one finalized (validate_only or not)
    return _features_answer(request, ErrorCode.NONE, None, list(updates))


def feature_update_problem(node_id: int, name: str, level: int, kind: int) -> str | None:
    """Why setting feature ``name`` to ``level`` with upgrade type ``kind`` is refused, in the
    words of Kafka's ``FeatureControlManager``, or None when it changes nothing."""
    problem = _feature_problem(node_id, name, level, kind)
    if problem is None or problem.startswith("Invalid metadata.version"):
        return problem  # (updateMetadataVersion's own words, not updateFeature's)
    return f"Invalid update version {level} for feature {name}. {problem}"


def _feature_problem(node_id: int, name: str, level: int, kind: int) -> str | None:
    if kind not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        return "The controller does not support the given upgrade type."
    if level < 0:
        return "A feature version cannot be less than 0."
    feature = next((f for f in FEATURES if f.name == name), None)
    current = 0 if feature is None else feature.finalized
    if feature is None:
        if level != 0:
            return f"Local controller {node_id} does not support this feature."
    elif not feature.min_version <= level <= feature.max_version:
        # (Kafka's VersionRange: "min-max", or the one version)
        low, high = feature.min_version, feature.max_version
        supported = str(low) if low == high else f"{low}-{high}"
        return f"Local controller {node_id} only supports versions {supported}"
    if level < current and kind == UPGRADE:
        return (
            "Can't downgrade the version of this feature without setting the upgrade type to "
            "either safe or unsafe downgrade."
        )
    if level > current and kind != UPGRADE:
        return "Can't downgrade to a newer version."
    if level < current and name == "metadata.version":
        if kind == UNSAFE_DOWNGRADE:
            return (
                f"Invalid metadata.version {level}. Unsafe metadata downgrade is not supported "
                "in this version."
            )
        return (
            f"Invalid metadata.version {level}. Refusing to perform the requested downgrade "
            "because it might delete metadata information."
        )
    if level < current:
        return (
            f"automq-py serves {name} at level {current} only (the consumer rebalance protocol "
            "of KIP-848 cannot be turned off)"
            if name == "group.version"
            else f"automq-py serves {name} at level {current} only"
        )
    return None


def _features_answer(
    request: Request, error: ErrorCode, message: str | None, features: list[str] | None = None
) -> Any:
    """Kafka's answer: the top-level error, and each feature's (NONE) when all succeeded."""
    results = [
        {"feature": name, "error_code": ErrorCode.NONE, "error_message": None}
        for name in features or ()
    ]
    return respond(
        request,
        {"throttle_time": 0, "error_code": error, "error_message": message, "results": results},
    )


METADATA_TOPIC = "__cluster_metadata"


async def handle_describe_quorum(ctx: BrokerContext, request: Request) -> Any:
    """The metadata quorum, as Kafka's KRaft leader describes it (``handleDescribeQuorumRequest``):
    one partition, ``__cluster_metadata``-0, led by the controller, its one voter; the other
    live brokers are its observers. The metadata log is the metadata store here (SQLite
    embedded, PostgreSQL in a cluster), which every broker reads whole: each replica is at the
    high watermark, which counts the changes this broker has applied since it started. Without
    DESCRIBE on the cluster: CLUSTER_AUTHORIZATION_FAILED; asked for any other partition,
    UNKNOWN_TOPIC_OR_PARTITION."""
    topics = list(request.body.topics)
    if not ctx.allowed_on_cluster(AclOperation.DESCRIBE):
        return respond(
            request,
            {
                "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "Cluster authorization failed.",
                "topics": [],
                "nodes": [],
            },
        )
    valid = (
        len(topics) == 1
        and str(topics[0].topic_name) == METADATA_TOPIC
        and [int(p.partition_index) for p in topics[0].partitions] == [0]
    )
    if not valid:
        return respond(
            request,
            {
                "error_code": ErrorCode.NONE,
                "error_message": None,
                "topics": [
                    {
                        "topic_name": t.topic_name,
                        "partitions": [
                            _quorum_partition(
                                int(p.partition_index), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                            )
                            for p in t.partitions
                        ],
                    }
                    for t in topics
                ],
                "nodes": [],
            },
        )
    leader = ctx.controller_id
    cluster = ctx.cluster
    controller = cluster.controller() if cluster is not None else None
    if controller is not None and controller.node_id == leader:
        epoch = controller.epoch
    else:
        epoch = ctx.replicas.storage.node_epoch
    high_watermark = ctx.replicas.storage.metadata.changes_applied
    now_ms = int(time.time() * 1000)

    def replica(node_id: int) -> dict[str, Any]:
        return {
            "replica_id": node_id,
            "replica_directory_id": ZERO_UUID,
            "log_end_offset": high_watermark,
            "last_fetch_timestamp": now_ms,
            "last_caught_up_timestamp": now_ms,
        }

    entries = ctx.broker_entries()
    partition = _quorum_partition(0, ErrorCode.NONE)
    partition.update(
        leader_id=leader,
        leader_epoch=epoch,
        high_watermark=high_watermark,
        current_voters=[replica(leader)],
        observers=[replica(cast(int, b["node_id"])) for b in entries if b["node_id"] != leader],
    )
    listener = SESSION.get().listener or "PLAINTEXT"
    return respond(
        request,
        {
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "topics": [{"topic_name": METADATA_TOPIC, "partitions": [partition]}],
            "nodes": [
                {
                    "node_id": b["node_id"],
                    "listeners": [{"name": listener, "host": b["host"], "port": b["port"]}],
                }
                for b in entries
                if b["node_id"] == leader
            ],
        },
    )


def _quorum_partition(index: int, error: ErrorCode) -> dict[str, Any]:
    return {
        "partition_index": index,
        "error_code": error,
        "error_message": None if error == ErrorCode.NONE else _MESSAGES.get(error),
        "leader_id": -1,
        "leader_epoch": -1,
        "high_watermark": -1,
        "current_voters": [],
        "observers": [],
    }


_MESSAGES = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "This server does not host this topic-partition.",
}


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.DESCRIBE_QUORUM: (handle_describe_quorum, 0, 2),
    # v2: Kafka 4.0's (KIP-1073, fenced brokers), which Kafka 4's admin client needs to list them
    ApiKey.DESCRIBE_CLUSTER: (handle_describe_cluster, 0, 2),
    ApiKey.UPDATE_FEATURES: (handle_update_features, 0, 1),
}
