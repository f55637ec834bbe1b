"""DescribeCluster (60): the cluster's live brokers and its controller. UpdateFeatures (57):
changing the finalized level of a feature flag (KIP-584).

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

from typing import Any

from automq_py.apis.context import BrokerContext, respond
from automq_py.apis.metadata import AUTHORIZED_OPERATIONS_OMITTED, FEATURES
from automq_py.security.acls import AclOperation
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema

BROKER_ENDPOINT = 1


async def handle_describe_cluster(ctx: BrokerContext, request: Request) -> Any:
    endpoint_type = int(getattr(request.body, "endpoint_type", BROKER_ENDPOINT))
    operations = AUTHORIZED_OPERATIONS_OMITTED
    if request.body.include_cluster_authorized_operations:
        operations = ctx.cluster_authorized_operations()
    data: dict[str, Any] = {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "endpoint_type": endpoint_type,
        "cluster_id": ctx.cluster_id,
        "controller_id": ctx.controller_id,
        "brokers": [
            {"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b["rack"]}
            for b in ctx.broker_entries()
        ],
        "cluster_authorized_operations": operations,
    }
    if endpoint_type != BROKER_ENDPOINT:
        # controller endpoints (2) are served by controllers, which a client reaches directly
        data.update(
            error_code=ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
            error_message=f"this broker serves endpoint type {BROKER_ENDPOINT} only",
            brokers=[],
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
                f"Invalid update version {level} for feature {name}. {problem}"
            )
            return _features_answer(request, ErrorCode.INVALID_UPDATE_VERSION, message)
    # nothing changes: every level asked for is the one finalized (validate_only or not)
    return _features_answer(request, ErrorCode.NONE, None, list(updates))


def feature_update_problem(node_id: int, name: str, level: int, kind: int) -> str | None:
    """Why setting feature ``name`` to ``level`` with upgrade type ``kind`` is refused (Kafka's
    ``FeatureControlManager.updateFeature`` messages), or None when it changes nothing."""
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
        return (
            f"Local controller {node_id} only supports versions [{feature.min_version}-"
            f"{feature.max_version}]"
        )
    if level < current and kind == UPGRADE:
        return (
            "Can't downgrade the version of this feature without setting the upgrade type to "
            "either safe or unsafe downgrade."
        )
    if level > current and kind != UPGRADE:
        return "Can't downgrade to a newer version."
    if level < current and name == "metadata.version":
        if kind == UNSAFE_DOWNGRADE:
            return "Unsafe metadata.version downgrades are not supported."
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


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.DESCRIBE_CLUSTER: (handle_describe_cluster, 0, 1),
    ApiKey.UPDATE_FEATURES: (handle_update_features, 0, 1),
}
