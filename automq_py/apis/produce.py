"""Produce (0): resolve each partition's topic, then hand the records to the ReplicaManager.

Every acknowledgement (acks=1 and acks=all alike) is sent after the data is fsynced in the WAL,
which is what acks=all promises; acks=0 gets no response at all. The handler returns as soon
as every partition's append has started (offsets assigned, WAL writes queued), with the
response still to come (:class:`Deferred`): the connection goes on to its next request while
this one waits for durability, and the socket server writes the responses in request order.
"""

from __future__ import annotations

from typing import Any

from automq_py.apis.context import BrokerContext
from automq_py.apis.deferred import Deferred
from automq_py.partition import AppendResult
from automq_py.replica_manager import AppendEntry
from protocol import wire
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request
from protocol.produce import ProducePartitionResponse, encode_produce_response


async def handle_produce(ctx: BrokerContext, request: Request) -> Any:
    body = request.body
    names: list[str] = []
    entries: list[AppendEntry] = []
    for t in body.topics:
        name = t.name
        topic = None
        error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if name:
            # as in Kafka, only Metadata auto-creates topics; Produce to an unknown one is an error
            topic, error = await ctx.topic_for_write(name, auto_create=False)
        for p in t.partitions:
            names.append(str(name))
            entries.append(AppendEntry(topic, p.index, p.records, error))
    results = await ctx.replicas.append_records(
        entries, acks=body.acks, internal_allowed=False, timeout_ms=body.timeout_ms
    )
    if body.acks == 0:
        return None
    if results.done():
        return _response(request, names, entries, results.result())
    return Deferred(results, lambda done: _response(request, names, entries, done))


def _response(
    request: Request, names: list[str], entries: list[AppendEntry], results: list[AppendResult]
) -> list[wire.Buffer]:
    by_topic: dict[str, list[ProducePartitionResponse]] = {}
    for name, entry, r in zip(names, entries, results, strict=True):
        by_topic.setdefault(name, []).append(
            ProducePartitionResponse(
                entry.index, r.error, r.base_offset, -1, r.log_start_offset, r.message
            )
        )
    return encode_produce_response(
        request.api_version, request.correlation_id, list(by_topic.items())
    )


API_KEY = ApiKey.PRODUCE
# Produce >= 3: magic v2 only (Kafka 4 clients need it). v13 names topics by id: not handled.
HANDLERS: dict[int, tuple[Any, int, int]] = {API_KEY: (handle_produce, 3, 12)}
