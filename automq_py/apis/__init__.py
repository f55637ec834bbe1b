"""KafkaApis: one table from ApiKey to (handler, min version, max version).

The same table answers ApiVersions, so what is advertised is exactly what is handled. A
handler returns a kio response entity (encoded here), already-encoded buffers (Fetch's
zero-copy path), or None (no response, as for acks=0 Produce).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.apis.fetch import handle_fetch, handle_list_offsets
from automq_py.apis.metadata import api_versions_handler, handle_metadata
from automq_py.apis.produce import handle_produce
from automq_py.apis.topics import handle_create_topics, handle_delete_topics
from protocol import api_versions, wire
from protocol.messages import Request, encode_response

log = logging.getLogger("automq.apis")

Handler = Callable[[BrokerContext, Request], Awaitable[Any]]

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS = 18, 19, 20


class KafkaApis:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        # Fetch >= 4 and Produce >= 3: Kafka 4 clients need them (and librdkafka falls back to
        # legacy message sets below Fetch 4). Topic-id versions (Fetch 13+) come later.
        self.table: dict[int, tuple[Handler, int, int]] = {
            PRODUCE: (handle_produce, 3, 11),
            FETCH: (handle_fetch, 4, 12),
            LIST_OFFSETS: (handle_list_offsets, 1, 8),
            METADATA: (handle_metadata, 0, 12),
            CREATE_TOPICS: (handle_create_topics, 2, 7),
            DELETE_TOPICS: (handle_delete_topics, 1, 6),
        }
        self.table[API_VERSIONS] = (api_versions_handler(self.supported), 0, 4)

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
