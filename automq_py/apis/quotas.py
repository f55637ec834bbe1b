"""DescribeClientQuotas (48) and AlterClientQuotas (49): the client quota configs in the
metadata store (:mod:`automq_py.security.quota_configs`), as Kafka's ClientQuotaControlManager
answers them; reading them takes DESCRIBE_CONFIGS on the cluster, changing them
ALTER_CONFIGS."""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext, respond
from automq_py.security import quota_configs as qc
from automq_py.security.acls import AclOperation
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request


async def handle_describe_client_quotas(ctx: BrokerContext, request: Request) -> Any:
    data: dict[str, Any] = {"throttle_time": 0, "error_message": None, "entries": None}
    if not ctx.allowed_on_cluster(AclOperation.DESCRIBE_CONFIGS):
        return respond(request, {**data, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED})
    components = [
        qc.Component(str(c.entity_type), int(c.match_type), c.match)
        for c in request.body.components
    ]
    kv = ctx.replicas.storage.metadata.image.kv
    code, message, found = qc.describe(kv, components, bool(request.body.strict))
    if code != ErrorCode.NONE:
        return respond(request, {**data, "error_code": code, "error_message": message})
    data["entries"] = [
        {
            "entity": [{"entity_type": kind, "entity_name": name} for kind, name in entity],
            "values": [{"key": k, "value": v} for k, v in sorted(values.items())],
        }
        for entity, values in found
    ]
    return respond(request, {**data, "error_code": ErrorCode.NONE})


async def handle_alter_client_quotas(ctx: BrokerContext, request: Request) -> Any:
    entries = request.body.entries

    def entity_of(entry: Any) -> list[dict[str, Any]]:
        return [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]

    if not ctx.allowed_on_cluster(AclOperation.ALTER_CONFIGS):
        refused = [
            {
                "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": None,
                "entity": entity_of(e),
            }
            for e in entries
        ]
        return respond(request, {"throttle_time": 0, "entries": refused})
    alterations = [
        qc.Alteration(
            [(str(e.entity_type), e.entity_name) for e in entry.entity],
            [qc.Op(str(op.key), float(op.value), bool(op.remove)) for op in entry.ops],
        )
        for entry in entries
    ]
    validate_only = bool(request.body.validate_only)
    outcome = await ctx.replicas.storage.metadata.change(
        lambda image: qc.plan_alter(image.kv, alterations, validate_only)
    )
    results: list[dict[str, Any]] = [
        {"error_code": code, "error_message": message, "entity": entity_of(entry)}
        for (code, message), entry in zip(outcome, entries, strict=True)
    ]
    return respond(request, {"throttle_time": 0, "entries": results})


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (handle_describe_client_quotas, 0, 1),
    ApiKey.ALTER_CLIENT_QUOTAS: (handle_alter_client_quotas, 0, 1),
}
