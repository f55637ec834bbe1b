"""The security admin APIs: DescribeAcls (29), CreateAcls (30), DeleteAcls (31),
DescribeUserScramCredentials (50), AlterUserScramCredentials (51), as Kafka's AclApis and
ControllerApis answer them.

The ACL APIs need an authorizer (``authorizer.class.name``), else they answer
SECURITY_DISABLED; reading ACLs or credentials takes DESCRIBE on the cluster, changing them
ALTER.
"""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext, respond
from automq_py.security import scram_credentials as scram
from automq_py.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
    validate_filter,
    validate_new_binding,
)
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request

NO_AUTHORIZER = "No Authorizer is configured."
# DescribeAcls' own wording (Kafka's AclApis builds that answer by hand)
NO_AUTHORIZER_DESCRIBE = "No Authorizer is configured on the broker"


def _cluster_allowed(ctx: BrokerContext, operation: AclOperation) -> bool:
    access = ctx.access
    return access is None or access.authorize(operation, ResourceType.CLUSTER, CLUSTER_NAME)


def _filter(body: Any) -> AclBindingFilter:
    """A DescribeAcls request's or a DeleteAcls filter's fields as a filter (v0 has no
    pattern type: literal)."""
    pattern = getattr(body, "pattern_type_filter", PatternType.LITERAL)
    return AclBindingFilter(
        ResourceType.from_code(int(body.resource_type_filter)),
        body.resource_name_filter,
        PatternType.from_code(int(pattern)),
        body.principal_filter,
        body.host_filter,
        AclOperation.from_code(int(body.operation)),
        PermissionType.from_code(int(body.permission_type)),
    )


async def handle_describe_acls(ctx: BrokerContext, request: Request) -> Any:
    data: dict[str, Any] = {"throttle_time": 0, "error_message": None, "resources": []}
    access = ctx.access
    if access is None or not access.enabled:
        return respond(
            request,
            {
                **data,
                "error_code": ErrorCode.SECURITY_DISABLED,
                "error_message": NO_AUTHORIZER_DESCRIBE,
            },
        )
    if not _cluster_allowed(ctx, AclOperation.DESCRIBE):
        return respond(request, {**data, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED})
    acl_filter = _filter(request.body)
    code, message = validate_filter(acl_filter)
    if code != ErrorCode.NONE:
        return respond(request, {**data, "error_code": code, "error_message": message})
    resources: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for b in access.authorizer.describe(acl_filter):
        resources.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
            {
                "principal": b.principal,
                "host": b.host,
                "operation": int(b.operation),
                "permission_type": int(b.permission),
            }
        )
    data["resources"] = [
        {"resource_type": int(t), "resource_name": n, "pattern_type": int(p), "acls": acls}
        for (t, n, p), acls in resources.items()
    ]
    return respond(request, {**data, "error_code": ErrorCode.NONE})


async def handle_create_acls(ctx: BrokerContext, request: Request) -> Any:
    creations = request.body.creations
    access = ctx.access

    def everyone(code: ErrorCode, message: str | None = None) -> Any:
        results: list[dict[str, Any]] = [
            {"error_code": code, "error_message": message} for _ in creations
        ]
        return respond(request, {"throttle_time": 0, "results": results})

    if access is None or not access.enabled:
        return everyone(ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER)
    if not _cluster_allowed(ctx, AclOperation.ALTER):
        return everyone(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    results: list[dict[str, Any]] = []
    valid: list[AclBinding] = []
    for c in creations:
        pattern = int(getattr(c, "resource_pattern_type", PatternType.LITERAL))
        binding = AclBinding(
            ResourceType.from_code(int(c.resource_type)),
            str(c.resource_name),
            PatternType.from_code(pattern),
            str(c.principal),
            str(c.host),
            AclOperation.from_code(int(c.operation)),
            PermissionType.from_code(int(c.permission_type)),
        )
        code, message = validate_new_binding(binding)
        results.append({"error_code": code, "error_message": message})
        if code == ErrorCode.NONE:
            valid.append(binding)
    if valid:
        await access.create(valid)
    return respond(request, {"throttle_time": 0, "results": results})


async def handle_delete_acls(ctx: BrokerContext, request: Request) -> Any:
    filters = request.body.filters
    access = ctx.access

    def everyone(code: ErrorCode, message: str | None = None) -> Any:
        results: list[dict[str, Any]] = [
            {"error_code": code, "error_message": message, "matching_acls": []} for _ in filters
        ]
        return respond(request, {"throttle_time": 0, "filter_results": results})

    if access is None or not access.enabled:
        return everyone(ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER)
    if not _cluster_allowed(ctx, AclOperation.ALTER):
        return everyone(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    parsed = [_filter(f) for f in filters]
    checks = [validate_filter(f) for f in parsed]
    valid = [f for f, (code, _) in zip(parsed, checks, strict=True) if code == ErrorCode.NONE]
    matched = iter(await access.delete(valid) if valid else [])
    results: list[dict[str, Any]] = []
    for code, message in checks:
        if code != ErrorCode.NONE:
            results.append({"error_code": code, "error_message": message, "matching_acls": []})
            continue
        results.append(
            {
                "error_code": ErrorCode.NONE,
                "error_message": None,
                "matching_acls": [
                    {
                        "error_code": ErrorCode.NONE,
                        "error_message": None,
                        "resource_type": int(b.resource_type),
                        "resource_name": b.resource_name,
                        "pattern_type": int(b.pattern_type),
                        "principal": b.principal,
                        "host": b.host,
                        "operation": int(b.operation),
                        "permission_type": int(b.permission),
                    }
                    for b in next(matched)
                ],
            }
        )
    return respond(request, {"throttle_time": 0, "filter_results": results})


async def handle_describe_user_scram_credentials(ctx: BrokerContext, request: Request) -> Any:
    data: dict[str, Any] = {"throttle_time": 0, "error_message": None, "results": []}
    if not _cluster_allowed(ctx, AclOperation.DESCRIBE):
        return respond(request, {**data, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED})
    users = request.body.users
    kv = ctx.replicas.storage.metadata.image.kv
    # no users named (null, or the empty list the Java AdminClient sends): every user
    found = scram.describe(kv, [str(u.name) for u in users] if users else None)
    data["results"] = [
        {
            "user": u.user,
            "error_code": u.error_code,
            "error_message": u.error_message,
            "credential_infos": [{"mechanism": m, "iterations": i} for m, i in u.credentials],
        }
        for u in found
    ]
    return respond(request, {**data, "error_code": ErrorCode.NONE})


async def handle_alter_user_scram_credentials(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    deletions = [scram.Deletion(str(d.name), int(d.mechanism)) for d in body.deletions]
    upsertions = [
        scram.Upsertion(
            str(u.name),
            int(u.mechanism),
            int(u.iterations),
            bytes(u.salt),
            bytes(u.salted_password),
        )
        for u in body.upsertions
    ]
    if not _cluster_allowed(ctx, AclOperation.ALTER):
        altered: list[scram.Deletion | scram.Upsertion] = [*deletions, *upsertions]
        users = dict.fromkeys(x.user for x in altered)
        results = [
            {"user": u, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "error_message": None}
            for u in users
        ]
        return respond(request, {"throttle_time": 0, "results": results})
    metadata = ctx.replicas.storage.metadata
    outcome = await metadata.change(lambda image: scram.plan_alter(image.kv, deletions, upsertions))
    results = [
        {"user": r.user, "error_code": r.error_code, "error_message": r.error_message}
        for r in outcome
    ]
    return respond(request, {"throttle_time": 0, "results": results})


# v0 of the ACL APIs (no pattern type) went in Kafka 4.0 (KIP-896) and kio has no schema for it
HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.DESCRIBE_ACLS: (handle_describe_acls, 1, 3),
    ApiKey.CREATE_ACLS: (handle_create_acls, 1, 3),
    ApiKey.DELETE_ACLS: (handle_delete_acls, 1, 3),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (handle_describe_user_scram_credentials, 0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (handle_alter_user_scram_credentials, 0, 0),
}
