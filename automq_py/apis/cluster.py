"""DescribeCluster (60): the cluster's live brokers and its controller.

As in Kafka (``AuthHelper.computeDescribeClusterResponse``) no ACL is needed to ask; the
cluster's authorized operations, when asked for, are 0 without DESCRIBE on the cluster.
"""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.apis.metadata import AUTHORIZED_OPERATIONS_OMITTED
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


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.DESCRIBE_CLUSTER: (handle_describe_cluster, 0, 1),
}
