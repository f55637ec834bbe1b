"""SaslHandshake (17) and SaslAuthenticate (36) where no exchange is due: on a listener without
SASL, or after authentication. The exchange itself runs in the socket server
(:mod:`automq_py.network.authenticator`), before requests reach the broker; these answer
ILLEGAL_SASL_STATE, as Kafka's KafkaApis does."""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext, respond
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request


async def handle_sasl_handshake(ctx: BrokerContext, request: Request) -> Any:
    return respond(request, {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []})


async def handle_sasl_authenticate(ctx: BrokerContext, request: Request) -> Any:
    return respond(
        request,
        {
            "error_code": ErrorCode.ILLEGAL_SASL_STATE,
            "error_message": "SaslAuthenticate request received after successful authentication",
            "auth_bytes": b"",
            "session_lifetime": 0,
        },
    )


HANDLERS: dict[int, tuple[Any, int, int]] = {
    ApiKey.SASL_HANDSHAKE: (handle_sasl_handshake, 0, 1),
    ApiKey.SASL_AUTHENTICATE: (handle_sasl_authenticate, 0, 2),
}
