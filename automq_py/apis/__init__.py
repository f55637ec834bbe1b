"""KafkaApis: one table from ApiKey to (handler, min version, max version).

The same table answers ApiVersions, so what is advertised is exactly what is handled. A
handler returns a kio response entity (encoded here), already-encoded buffers (Fetch's
zero-copy path), or None (no response, as for acks=0 Produce).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from automq_py.apis import (
    cluster,
    configs,
    controller,
    coordinator,
    fetch,
    groups,
    metadata,
    produce,
    producer,
    records,
    topics,
)
from automq_py.apis.context import BrokerContext
from protocol import api_versions, wire
from protocol.messages import Request, encode_response

log = logging.getLogger("automq.apis")

Handler = Callable[[BrokerContext, Request], Awaitable[Any]]
HandlerTable = dict[int, tuple[Handler, int, int]]

API_VERSIONS = 18
# each module of this package lists the APIs it handles as ``HANDLERS``
MODULES = (
    produce,
    fetch,
    metadata,
    topics,
    configs,
    cluster,
    records,
    producer,
    coordinator,
    groups,
    controller,
)


class KafkaApis:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.table: HandlerTable = {}
        for module in MODULES:
            self.table.update(module.HANDLERS)
        self.table[API_VERSIONS] = (metadata.api_versions_handler(lambda: self.supported), 0, 4)

    @property
    def supported(self) -> dict[int, tuple[int, int]]:
        return {key: (lo, hi) for key, (_, lo, hi) in self.table.items()}

    async def handle(self, request: Request) -> list[wire.Buffer] | None:
        handler, _, _ = self.table[request.api_key]
        result = await handler(self.ctx, request)
        if result is None or isinstance(result, list):
            return result
        return encode_response(request.response_info, result)

    def unsupported_api_versions(self, correlation_id: int) -> list[wire.Buffer]:
        """KIP-511: a v0 ApiVersions response with UNSUPPORTED_VERSION and our ranges."""
        return api_versions.encode_unsupported_api_versions(correlation_id, self.supported)
