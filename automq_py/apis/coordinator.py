"""FindCoordinator (10): this single broker coordinates every group and transactional id.

Clients also read its presence as a broker-capability signal (librdkafka enables LZ4 only when
FindCoordinator is advertised). Looking up a group's coordinator creates ``__consumer_offsets``
on first use, as Kafka does; the group APIs are in :mod:`automq_py.apis.groups`.
"""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext
from protocol import build
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, response_schema

GROUP, TRANSACTION = 0, 1


async def handle_find_coordinator(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    version = request.api_version
    key_type = int(getattr(body, "key_type", GROUP))
    error = ErrorCode.NONE if key_type in (GROUP, TRANSACTION) else ErrorCode.INVALID_REQUEST
    if key_type == GROUP and ctx.groups is not None:
        # Kafka creates __consumer_offsets when a group coordinator is first looked up
        error = await ctx.groups.find_coordinator()
    elif key_type == TRANSACTION and ctx.transactions is not None:
        # and __transaction_state when a transaction coordinator is
        error = await ctx.transactions.find_coordinator()
    me = {"node_id": ctx.node_id, "host": ctx.host, "port": ctx.port}
    if error != ErrorCode.NONE:
        me = {"node_id": -1, "host": "", "port": -1}
    if version < 4:
        data: dict[str, Any] = {"throttle_time": 0, "error_code": error, **me}
    else:
        data = {
            "throttle_time": 0,
            "coordinators": [
                {"key": key, "error_code": error, **me} for key in body.coordinator_keys
            ],
        }
    return build.build(response_schema(ApiKey.FIND_COORDINATOR, version), data)


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.FIND_COORDINATOR: (handle_find_coordinator, 0, 6)
}
