"""FindCoordinator (10): the broker that leads the partition of ``__consumer_offsets`` (or
``__transaction_state``) a group (or transactional id) lives in coordinates it; a single broker
coordinates them all.

Clients also read its presence as a broker-capability signal (librdkafka enables LZ4 only when
FindCoordinator is advertised). Looking up a group's coordinator creates ``__consumer_offsets``
on first use, as Kafka does; the group APIs are in :mod:`automq_py.apis.groups`.

Each key needs DESCRIBE on its group (GROUP_AUTHORIZATION_FAILED) or transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), checked before anything else, as Kafka checks it; the
internal topic is created only for a key the session may look up.
"""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.coordinator.runtime import CoordinatorRuntime
from automq_py.security.acls import AclOperation, ResourceType
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema

GROUP, TRANSACTION = 0, 1

# a key type -> what the key names, and the error of a session that may not DESCRIBE it
_REFUSALS = {
    GROUP: (ResourceType.GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED),
    TRANSACTION: (ResourceType.TRANSACTIONAL_ID, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
}


async def handle_find_coordinator(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    version = request.api_version
    key_type = int(getattr(body, "key_type", GROUP))
    keys = [str(body.key)] if version < 4 else [str(k) for k in body.coordinator_keys]
    refusals = {key: _refusal(ctx, key_type, key) for key in keys}
    error = ErrorCode.NONE if key_type in (GROUP, TRANSACTION) else ErrorCode.INVALID_REQUEST
    runtime: CoordinatorRuntime | None = None
    looked_up = any(r == ErrorCode.NONE for r in refusals.values())
    if looked_up and key_type == GROUP and ctx.groups is not None:
        # Kafka creates __consumer_offsets when a group coordinator is first looked up
        error = await ctx.groups.find_coordinator()
        runtime = ctx.groups.runtime
    elif looked_up and key_type == TRANSACTION and ctx.transactions is not None:
        # and __transaction_state when a transaction coordinator is
        error = await ctx.transactions.find_coordinator()
        runtime = ctx.transactions.runtime

    def answer(key: str) -> dict[str, Any]:
        code = error if refusals[key] == ErrorCode.NONE else refusals[key]
        node: dict[str, object] | None = None
        if code == ErrorCode.NONE and runtime is not None:
            node = ctx.broker_entry(runtime.coordinator_of(key))
            if node is None:  # its partition has no live leader now
                code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        if node is None:
            return {"error_code": code, "node_id": -1, "host": "", "port": -1}
        return {
            "error_code": code,
            "node_id": node["node_id"],
            "host": node["host"],
            "port": node["port"],
        }

    if version < 4:
        data: dict[str, Any] = {"throttle_time": 0, **answer(keys[0])}
    else:
        data = {
            "throttle_time": 0,
            "coordinators": [{"key": key, **answer(key)} for key in keys],
        }
    return build.build(response_schema(ApiKey.FIND_COORDINATOR, version), data)


def _refusal(ctx: BrokerContext, key_type: int, key: str) -> ErrorCode:
    """The error of a key the session may not DESCRIBE, else NONE (also for an unknown key
    type, which is answered INVALID_REQUEST)."""
    found = _REFUSALS.get(key_type)
    if found is None or ctx.allowed(AclOperation.DESCRIBE, found[0], key):
        return ErrorCode.NONE
    return found[1]


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.FIND_COORDINATOR: (handle_find_coordinator, 0, 6)
}
